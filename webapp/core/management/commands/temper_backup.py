"""``manage.py temper_backup OUT.tar``: the database and the data directory in one tar file, taken while Temper
runs (webapp/core/backup.py says what is in it and what is left out)."""
from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from jaxengine.memory import byte_size
from jaxengine.words import counted
from webapp.core.backup import BackupError, write_backup


class Command(BaseCommand):
    help = ("Back up this Temper installation (its database and data directory) into one tar file, while it runs; "
            "manage.py temper_restore puts it back.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("out", help="the tar file to write (replaced once the new backup is whole)")
        parser.add_argument("--quiet", action="store_true", help="print no progress on stderr")

    def handle(self, *args, **options) -> None:
        out = Path(options["out"])
        say = (lambda line: None) if options["quiet"] else self.stderr.write
        try:
            manifest = write_backup(out, say=say)
        except BackupError as error:
            raise CommandError(f"backup failed: {error}") from error
        trees = ", ".join(f"{tree['name']} {counted(tree['files'], 'file')} ({byte_size(tree['bytes'])})"
                          for tree in manifest["trees"])
        self.stdout.write(f"backup written to {out}: database ({manifest['database']['engine']}, "
                          f"{counted(len(manifest['database']['migrations']), 'migration')}), {trees}")
