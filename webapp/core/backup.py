"""A backup of a Temper installation (``manage.py temper_backup``; read back by ``webapp.core.restore``).

One tar file holds it all, so that a team copies one file off the host (a directory of many would need copying
whole, and a copy cut short would look complete). Uncompressed: checkpoints and weights hardly compress, and a
team that wants it pipes the file through zstd. Its members:

- ``database/temper.sqlite3``: a copy made through sqlite3's online backup API, in one step, so that it is the
  database as one read transaction saw it while the web process and the workers go on writing (WAL lets them);
  or ``database/temper.pgdump``: ``pg_dump`` in custom format, itself one consistent snapshot.
- ``trees/data/…``: the data directory (``TEMPER_DATA``: datasets, runs, models, serving copies, the signing
  key), and ``trees/models/…`` the models root when ``TEMPER_MODELS_ROOT`` lies outside it. Each file is streamed
  from disk into the tar a chunk at a time. Left out: what Temper makes again (``staticfiles``, which
  collectstatic writes at every start; the workers' compiled-program cache ``TEMPER_JAX_CACHE``), the SQLite
  database's own files (copied above, not as bytes a writer may be changing), and the transient files that
  writers rename into place when done (``transient``). Files are copied after the database: a file written after
  the copy is an extra that no restored row names (a checkpoint newer than the run's copied row), and one deleted in
  between is missing, as a deleted run's folder is.
- ``manifest.json``, written last: a backup cut short has none, and restore refuses it before it changes anything.
  It says which Temper made it, the migrations applied, the database engine, each tree's root, files and bytes.

Redis is not backed up: it holds queue messages and live progress only, which the workers rebuild (README,
"Backup and restore").
"""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from django.conf import settings
from django.db import connection
from django.db.migrations.recorder import MigrationRecorder

from jaxengine.checkpoint.step_folders import checkpoint_folder_incomplete
from jaxengine.memory import byte_size
from jaxengine.words import counted
from webapp.basemodels.inspection import UPLOAD_PARTIAL_PREFIX
from webapp.runs.services import CHECKPOINT_TRASH_PREFIX, CHECKPOINTS_DIRECTORY, RUNS_DIRECTORY
from webapp.secret import KEY_FILE

FORMAT = 1
MANIFEST = "manifest.json"
DATABASE_DIRECTORY = "database"
SQLITE_MEMBER = f"{DATABASE_DIRECTORY}/temper.sqlite3"
POSTGRES_MEMBER = f"{DATABASE_DIRECTORY}/temper.pgdump"
TREES_DIRECTORY = "trees"
# The backup's work folder, beside the file it writes (in the data directory too, if that is where it is written),
# and restore's inside a target (``webapp.core.restore``): never backed up, never counted as a target's content.
WORK_PREFIX = ".temper-backup-"
STAGING_PREFIX = ".temper-restoring-"
ASIDE_PREFIX = ".temper-replaced-"
# The folder orbax writes a checkpoint into before renaming it to its step (orbax's TMP_DIR_SUFFIX).
ORBAX_TEMPORARY = ".orbax-checkpoint-tmp"
# Hidden names that Temper's writers give a file or folder until it is complete and renamed into place: dataset
# uploads (``.<name>.<random>.part``), search indexes being built, model uploads being unpacked, exports and
# serving copies being written (``.<name>.writing-``) or replaced (``.<name>.replaced-``), a signing key's draft;
# and one going: a run's checkpoint being deleted, renamed out of ``checkpoints/`` before its removal.
TRANSIENT_HIDDEN_PREFIXES = (UPLOAD_PARTIAL_PREFIX, ".search-", f".{KEY_FILE}.", WORK_PREFIX, STAGING_PREFIX,
                             ASIDE_PREFIX, CHECKPOINT_TRASH_PREFIX)
TRANSIENT_HIDDEN_MARKS = (".writing-", ".replaced-")
SQLITE_SIDE_FILES = ("", "-wal", "-shm", "-journal")
PROGRESS_SECONDS = 5


class BackupError(Exception):
    """What went wrong, in words for the person who ran the command."""


def transient(name: str) -> bool:
    """Whether a file or folder so named is one a writer has not finished (see ``TRANSIENT_HIDDEN_PREFIXES``)."""
    if ORBAX_TEMPORARY in name:
        return True
    if not name.startswith("."):
        return False
    return (name.endswith(".part") or name.startswith(TRANSIENT_HIDDEN_PREFIXES)
            or any(mark in name for mark in TRANSIENT_HIDDEN_MARKS))


@dataclass(frozen=True)
class Tree:
    """A directory backed up as ``trees/<name>/``, less the paths in ``left_out`` (absolute, with every side)."""

    name: str
    root: Path
    left_out: frozenset[Path] = field(default_factory=frozenset)

    @property
    def member_prefix(self) -> str:
        return f"{TREES_DIRECTORY}/{self.name}"


def database_engine() -> str:
    """``sqlite`` or ``postgresql``: the engines Temper runs on."""
    vendor = connection.vendor
    if vendor not in ("sqlite", "postgresql"):
        raise BackupError(f"the database engine {vendor!r} is not one Temper backs up (SQLite or PostgreSQL)")
    return vendor


def sqlite_file() -> Path | None:
    """The SQLite database file, or None on PostgreSQL."""
    database = settings.DATABASES["default"]
    return Path(database["NAME"]) if database["ENGINE"] == "django.db.backends.sqlite3" else None


def _inside(path: Path, root: Path) -> bool:
    return path.resolve().is_relative_to(root.resolve())


def installation_trees(*, also_left_out: tuple[Path, ...] = ()) -> list[Tree]:
    """The directories of this installation to back up, each with what is left out of it (see the module note), and
    ``also_left_out``: the archive being written or read, when it lies in one of them."""
    data_root, models_root = Path(settings.DATA_ROOT), Path(settings.MODELS_ROOT)
    reproducible = [Path(settings.STATIC_ROOT)] + ([Path(settings.TEMPER_JAX_CACHE)] if settings.TEMPER_JAX_CACHE
                                                   else [])
    database = sqlite_file()
    database_files = [Path(f"{database}{suffix}") for suffix in SQLITE_SIDE_FILES] if database else []
    left_out = frozenset(path.resolve() for path in reproducible + database_files + list(also_left_out))
    trees = [Tree("data", data_root, left_out)]
    if not _inside(models_root, data_root):
        trees.append(Tree("models", models_root, left_out))
    return trees


def checkpoint_folder(path: Path) -> bool:
    """Whether ``path`` is a run's training checkpoint (``runs/<id>/checkpoints/<step>``), copied whole or not at
    all (``add_checkpoint``)."""
    return (path.name.isdigit() and path.parent.name == CHECKPOINTS_DIRECTORY
            and path.parent.parent.parent.name == RUNS_DIRECTORY)


def tree_entries(tree: Tree) -> Iterator[Path]:
    """Every folder, file and link under ``tree.root`` that is backed up, parents before children, by name.
    A link is kept as a link: a folder it points to is not walked; nor is a checkpoint folder
    (``checkpoint_folder``), which its caller copies whole."""
    if not tree.root.is_dir():
        return
    for folder, folder_names, file_names in os.walk(tree.root):
        folder_path = Path(folder)
        kept = sorted(name for name in folder_names if not _left_out(folder_path / name, tree))
        folder_names[:] = [name for name in kept if not (folder_path / name).is_symlink()
                           and not checkpoint_folder(folder_path / name)]
        for name in kept:
            yield folder_path / name
        for name in sorted(file_names):
            if not _left_out(folder_path / name, tree):
                yield folder_path / name


def _left_out(path: Path, tree: Tree) -> bool:
    return transient(path.name) or path.absolute() in tree.left_out or (
        not path.is_symlink() and path.resolve() in tree.left_out)


def temper_release() -> dict:
    """The installed Temper's version and, in a git checkout, its commit (None elsewhere, as in the image)."""
    try:
        version = metadata.version("temper")
    except metadata.PackageNotFoundError:
        version = None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=settings.BASE_DIR, capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"version": version, "commit": commit}


def release_words(release: dict) -> str:
    """A manifest's ``temper`` in words: ``Temper 0.1.0 (commit 5ae947ed…)``."""
    commit = f" (commit {release['commit'][:12]})" if release.get("commit") else ""
    return f"Temper {release.get('version') or 'of unknown version'}{commit}"


def applied_migrations() -> list[str]:
    """``app.name`` of every migration the database has applied, sorted."""
    return sorted(f"{app}.{name}" for app, name in MigrationRecorder(connection).applied_migrations())


def libpq_connection() -> tuple[list[str], dict[str, str]]:
    """The arguments and environment with which PostgreSQL's programs reach Temper's database."""
    database = settings.DATABASES["default"]
    arguments = ["--dbname", database["NAME"]]
    for option, key in (("--host", "HOST"), ("--port", "PORT"), ("--username", "USER")):
        if database.get(key):
            arguments += [option, str(database[key])]
    environment = dict(os.environ)
    if database.get("PASSWORD"):
        environment["PGPASSWORD"] = database["PASSWORD"]
    if (database.get("OPTIONS") or {}).get("sslmode"):
        environment["PGSSLMODE"] = database["OPTIONS"]["sslmode"]
    return arguments, environment


def postgres_program(name: str) -> str:
    """The path of PostgreSQL's ``name`` program, or a BackupError saying what to install."""
    found = shutil.which(name)
    if found is None:
        raise BackupError(f"{name} is not on PATH: install PostgreSQL's client programs, of the server's major "
                          "version or newer (Debian and Ubuntu: apt-get install postgresql-client; the PostgreSQL "
                          "project's apt repository has every version), then run the command again")
    return found


def run_program(command: list[str], *, environment: dict[str, str] | None = None, doing: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True, env=environment)
    if result.returncode != 0:
        raise BackupError(f"{doing} failed ({Path(command[0]).name} exited with {result.returncode}):\n"
                          f"{(result.stderr or result.stdout).strip()[-3000:]}")


def copy_sqlite(source: Path, destination: Path) -> None:
    """A consistent copy of the SQLite database ``source``: the online backup API in one step holds one read
    transaction, which in WAL mode lets writers go on; a step-by-step backup would restart at every write."""
    import sqlite3

    source_connection = sqlite3.connect(source, timeout=60)
    destination_connection = sqlite3.connect(destination)
    try:
        source_connection.backup(destination_connection)
    finally:
        destination_connection.close()
        source_connection.close()


def dump_postgres(destination: Path) -> None:
    arguments, environment = libpq_connection()
    run_program([postgres_program("pg_dump"), "--format=custom", "--file", str(destination), *arguments],
                environment=environment, doing="pg_dump of the database")


@dataclass
class TreeCount:
    files: int = 0
    bytes: int = 0


class Progress:
    """Lines to ``say`` (stderr, or nothing with --quiet): each phase, and the counts every few seconds."""

    def __init__(self, say: Callable[[str], None]):
        self.say, self.last = say, time.monotonic()

    def tick(self, name: str, *, files: int, size: int) -> None:
        if time.monotonic() - self.last >= PROGRESS_SECONDS:
            self.last = time.monotonic()
            self.say(f"{name}: {counted(files, 'file')}, {byte_size(size)} so far")


def add_entry(archive: tarfile.TarFile, path: Path, arcname: str) -> int | None:
    """Add ``path`` to ``archive`` as ``arcname``, a file streamed a chunk at a time; its bytes for a file, None
    for a folder or link, and None too when it went away since the walk listed it (a run deleted meanwhile)."""
    try:
        if path.is_symlink() or path.is_dir():
            archive.addfile(archive.gettarinfo(str(path), arcname))
            return None
        if not path.is_file():  # a socket or a pipe, which reading would block on: no data of Temper's
            return None
        with path.open("rb") as handle:
            info = archive.gettarinfo(arcname=arcname, fileobj=handle)
            if info.islnk():  # a second name of a file already in the archive: stored whole, restore makes files only
                info.type, info.linkname, info.size = tarfile.REGTYPE, "", os.fstat(handle.fileno()).st_size
            try:
                archive.addfile(info, handle)
            except OSError as error:
                raise BackupError(f"{path} got shorter while it was copied ({error}); run the backup again") from error
            return info.size
    except FileNotFoundError:
        return None


def manifest_for(*, engine: str, migrations: list[str], trees: list[Tree], counts: dict[str, TreeCount],
                 database_bytes: int) -> dict:
    return {
        "format": FORMAT,
        "temper": temper_release(),
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "database": {"engine": engine, "member": SQLITE_MEMBER if engine == "sqlite" else POSTGRES_MEMBER,
                     "bytes": database_bytes, "migrations": migrations},
        "trees": [{"name": tree.name, "root": str(tree.root), "resolved_root": str(tree.root.resolve()),
                   "files": counts[tree.name].files, "bytes": counts[tree.name].bytes} for tree in trees],
    }


def write_backup(out: Path, *, say: Callable[[str], None]) -> dict:
    """Write this installation's backup to ``out`` (replaced only once the new one is whole); returns its manifest."""
    if not out.parent.is_dir():
        raise BackupError(f"{out.parent} is not a folder: create it, or give the backup another path")
    engine, trees = database_engine(), installation_trees(also_left_out=(out,))
    work = Path(tempfile.mkdtemp(prefix=WORK_PREFIX, dir=out.parent))
    partial = work / out.name
    try:
        migrations = applied_migrations()
        database_copy = work / Path(SQLITE_MEMBER if engine == "sqlite" else POSTGRES_MEMBER).name
        say(f"database ({engine}): copying")
        if engine == "sqlite":
            copy_sqlite(sqlite_file(), database_copy)
        else:
            dump_postgres(database_copy)
        database_bytes = database_copy.stat().st_size
        say(f"database: {byte_size(database_bytes)}, {counted(len(migrations), 'migration')} applied")
        counts = {}
        with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as archive:
            archive.add(database_copy, arcname=SQLITE_MEMBER if engine == "sqlite" else POSTGRES_MEMBER)
            database_copy.unlink()
            for tree in trees:
                counts[tree.name] = _add_tree(archive, tree, Progress(say))
                say(f"{tree.name} ({tree.root}): {counted(counts[tree.name].files, 'file')}, "
                    f"{byte_size(counts[tree.name].bytes)}")
            manifest = manifest_for(engine=engine, migrations=migrations, trees=trees, counts=counts,
                                    database_bytes=database_bytes)
            _add_bytes(archive, MANIFEST, json.dumps(manifest, indent=2).encode())
        os.replace(partial, out)
        return manifest
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)


def _add_tree(archive: tarfile.TarFile, tree: Tree, progress: Progress) -> TreeCount:
    count = TreeCount()
    for path in tree_entries(tree):
        arcname = f"{tree.member_prefix}/{path.relative_to(tree.root).as_posix()}"
        if checkpoint_folder(path) and not path.is_symlink():
            if not add_checkpoint(archive, path, arcname, count):
                progress.say(f"{path.relative_to(tree.root).as_posix()}: left out, incomplete (being deleted or cut "
                             "short)")
            progress.tick(tree.name, files=count.files, size=count.bytes)
            continue
        size = add_entry(archive, path, arcname)
        if size is not None:
            count.files += 1
            count.bytes += size
            progress.tick(tree.name, files=count.files, size=count.bytes)
    return count


def add_checkpoint(archive: tarfile.TarFile, step_folder: Path, arcname: str, count: TreeCount) -> bool:
    """Add the checkpoint folder ``step_folder`` whole, or nothing of it (False). The trainer deletes its older
    checkpoints file by file as it saves newer ones (``keep_last``), while a backup may be copying them: the files
    are hard-linked into a hidden folder beside (which a deletion leaves whole; orbax never changes a checkpoint's
    files once it has renamed the folder into place), and only a snapshot that lost no file while it was made and
    is whole by ``checkpoint_folder_incomplete`` is added. Where the file system makes no hard links, the folder's
    files are added as they are read, as any other folder's."""
    work = None
    try:
        try:
            work = Path(tempfile.mkdtemp(prefix=WORK_PREFIX, dir=step_folder.parent.parent))
            snapshot, linked = work, _link_files(step_folder, work)
        except FileNotFoundError:  # a file, the folder or its run went away meanwhile
            return False
        except OSError:  # no hard links on this file system, or no folder made beside: as read, as other folders
            snapshot, linked = step_folder, _files_under(step_folder)
        if linked != _files_under(step_folder) or checkpoint_folder_incomplete(snapshot):
            return False
        add_entry(archive, step_folder, arcname)
        for parent, folder_names, file_names in os.walk(snapshot):
            folder_names.sort()
            relative = Path(parent).relative_to(snapshot)
            for name in folder_names:  # the folder itself, with its mode and time, not the snapshot's
                add_entry(archive, step_folder / relative / name, f"{arcname}/{(relative / name).as_posix()}")
            for name in sorted(file_names):
                size = add_entry(archive, Path(parent) / name, f"{arcname}/{(relative / name).as_posix()}")
                if size is not None:
                    count.files += 1
                    count.bytes += size
        return True
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)


def _files_under(folder: Path) -> set[str]:
    return {(Path(parent) / name).relative_to(folder).as_posix()
            for parent, _folders, names in os.walk(folder) for name in names}


def _link_files(source: Path, destination: Path) -> set[str]:
    """Hard-link every file under ``source`` to the same place under ``destination``; the files linked. A
    FileNotFoundError when one went away meanwhile."""
    linked = set()
    for parent, folder_names, file_names in os.walk(source):
        relative = Path(parent).relative_to(source)
        for name in folder_names:
            (destination / relative / name).mkdir()
        for name in file_names:
            os.link(Path(parent) / name, destination / relative / name)
            linked.add((relative / name).as_posix())
    if not source.is_dir():
        raise FileNotFoundError(source)
    return linked


def _add_bytes(archive: tarfile.TarFile, name: str, content: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(content), int(time.time()), 0o644
    archive.addfile(info, io.BytesIO(content))
