"""``manage.py temper_restore OUT.tar [--force] [--ignore-live-workers]``: put back a backup of ``temper_backup``, with Temper stopped, all
or nothing (webapp/core/restore.py says in what order and what it checks first)."""
from __future__ import annotations

from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from jaxengine.memory import byte_size
from jaxengine.words import counted
from webapp.basemodels.models import BaseModel
from webapp.core.backup import BackupError, release_words
from webapp.core.restore import Restore
from webapp.datasets.models import DatasetVersion
from webapp.projects.models import Project
from webapp.runs.models import Run


class Command(BaseCommand):
    help = ("Restore a backup made by manage.py temper_backup into this installation's database and data "
            "directory, which must be empty unless --force. Stop Temper first: a worker alive against it refuses "
            "the restore.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("archive", help="the backup's tar file")
        parser.add_argument("--force", action="store_true",
                            help="replace the database and data directory even when they hold data")
        parser.add_argument("--ignore-live-workers", action="store_true",
                            help="restore even though a worker's heartbeat in the database says it is alive (for a "
                                 "worker you know has stopped; --force does not override this)")
        parser.add_argument("--quiet", action="store_true", help="print no progress on stderr")

    def handle(self, *args, **options) -> None:
        archive = Path(options["archive"])
        if not archive.is_file():
            raise CommandError(f"{archive} is not a file: give the path of a backup written by temper_backup")
        say = (lambda line: None) if options["quiet"] else self.stderr.write
        try:
            restored = Restore(archive, force=options["force"], say=say,
                               ignore_live_workers=options["ignore_live_workers"]).run()
        except BackupError as error:
            raise CommandError(f"restore failed: {error}") from error
        manifest = restored["manifest"]
        self.stdout.write(f"restored {archive} (made {manifest['created_at']} by {release_words(manifest['temper'])})")
        self.stdout.write(f"database ({manifest['database']['engine']}): {self._row_counts()}")
        for staged in restored["staged"].values():
            self.stdout.write(f"{staged.tree.name}: {counted(staged.files, 'file')} ({byte_size(staged.bytes)}) "
                              f"into {staged.tree.root}")
        for old, new in restored["moves"]:
            self.stdout.write(f"paths in the database moved from {old} to {new}")
        if restored["run_files_moved"]:
            self.stdout.write(f"paths in the files the engine wrote moved: "
                              f"{counted(restored['run_files_moved'], 'file')}")
        if restored["unapplied"]:
            self.stdout.write(f"the backup's database predates {counted(len(restored['unapplied']), 'migration')} "
                              "of this code: run `python manage.py migrate` before starting Temper (the compose "
                              "file's web service and scripts/up.sh do at start)")

    @staticmethod
    def _row_counts() -> str:
        try:
            counts = {"user": get_user_model().objects.count(), "project": Project.objects.count(),
                      "dataset version": DatasetVersion.objects.count(), "base model": BaseModel.objects.count(),
                      "run": Run.objects.count()}
        except DatabaseError:  # an older database, its columns not yet migrated
            return "rows not counted before `migrate`"
        return ", ".join(counted(count, noun) for noun, count in counts.items())
