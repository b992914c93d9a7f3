"""Restore a backup written by ``webapp.core.backup`` (``manage.py temper_restore``), with Temper stopped.

All or nothing: everything is checked, then extracted, then moved into place, and a failure anywhere puts back what
was there. In order:

1. The archive is read through: ``manifest.json`` (written last) must be there, else the archive was cut short,
   and the member it ends in is named; its members are only the database, the trees and the manifest, with no
   name reaching outside them. The manifest's migrations must all be known to this code (an archive from a newer
   Temper is refused, naming them); an older archive is restored as it is and ``migrate`` is left to the command
   that starts Temper (the compose file's web service, ``scripts/up.sh``), as after any upgrade.
2. No worker may be alive against the target: a heartbeat within ``TEMPER_WORKER_STALE_AFTER`` in its database,
   as the Workers page reads them (``live_workers``), would have its database and files replaced under its
   work; refused naming each, ``--force`` or not (the way to restore over data), unless ``ignore_live_workers``. A
   web server writes no heartbeat: the message says to stop it too. The targets must be empty — the database (rows in any table but Django's own bookkeeping) and each directory
   (anything but the signing key that every Temper process makes at start, and what Temper makes again) — unless
   ``force``; what was found is named.
3. Every member is extracted into a staging folder inside its target (so that moving into place is a rename on
   one file system, also when the target is a mount point such as the compose file's ``/data``), and the files
   and bytes are checked against the manifest.
4. The database holds absolute paths into the data directory (a run's output folder in its resolved spec, its
   artifacts' folders, an uploaded base model's folder): when the directories are elsewhere now, those are
   rewritten (``path_rewrites``), in the staged SQLite file or in PostgreSQL's restoring transaction; and so are
   those the engine wrote into the staged files that are read back as paths (``run_folder_rewrites``; which files,
   and why each: ``engine_documents``). Left as written, since nothing reads them back as paths: the run log's lines
   and a run's error message (what happened, then, for people), ``metrics.jsonl`` and ``samples.jsonl`` (numbers and
   text), a dataset's side files (its search index records the file's size and mapping, not its path), and the rows
   that keep no path: a serving copy's folder is found from its run or base model, a conversation's model and a
   pipeline's stages by their ``bm_``/``run_``/``dv_`` ids, a review campaign's export by its dataset version, a
   dataset version's file relative to the data directory.
5. What the targets held is moved aside, the staged trees moved in, then the database: SQLite's file renamed into
   place, or on PostgreSQL one ``psql --single-transaction`` that drops the tables and loads the dump. Only then
   is what was moved aside deleted.
"""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import tarfile
import tempfile
from collections.abc import Callable
from typing import Any
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import yaml
from django.conf import settings
from django.db import DatabaseError, connection
from django.utils import timezone
from django.db.migrations.loader import MigrationLoader

from jaxengine.memory import byte_size
from jaxengine.words import counted
from webapp.basemodels.models import BaseModel
from webapp.core.backup import (
    ASIDE_PREFIX, DATABASE_DIRECTORY, FORMAT, MANIFEST, SQLITE_SIDE_FILES, STAGING_PREFIX, TREES_DIRECTORY,
    BackupError, Progress, Tree, database_engine, installation_trees, libpq_connection, postgres_program, release_words,
    run_program, sqlite_file, transient,
)
from webapp.projects.storage import EXPORT_DIRECTORY, EXPORT_STEP_PREFIX
from webapp.runs.models import Artifact, Run
from webapp.runs.serving_copies import BASE_MODEL_COPIES, QUANTIZATION_FILE, QUANTIZED_SUBDIR
from webapp.runs.services import CHECKPOINTS_DIRECTORY, RUNS_DIRECTORY
from webapp.secret import KEY_FILE
from webapp.workers.models import Worker
from webapp.workers.selectors import workers_alive

CHUNK_BYTES = 1 << 20
# Rows Django writes into any migrated database: a database holding only these holds nothing of a team's.
BOOKKEEPING_TABLES = frozenset({"django_migrations", "django_content_type", "auth_permission", "sqlite_sequence"})


class RestoreError(BackupError):
    pass


@dataclass
class ArchiveContents:
    manifest: dict
    members: list[tarfile.TarInfo]


def read_archive(archive: tarfile.TarFile, path: Path) -> ArchiveContents:
    """The manifest and members of ``archive`` (opened from ``path``), checked as step 1 of the module note says."""
    members = []
    try:
        for member in archive:
            members.append(member)
    except tarfile.TarError as error:
        raise RestoreError(f"{path} cannot be read through ({error}): {_where_it_ends(members, path)}. Nothing was "
                           "restored; use a complete copy of the backup") from error
    names = {member.name: member for member in members}
    if MANIFEST not in names:
        raise RestoreError(f"{path} has no {MANIFEST}, which a backup writes last: {_where_it_ends(members, path)}. "
                           "Nothing was restored; use a complete copy of the backup")
    manifest = _manifest(archive, names[MANIFEST], path)
    tree_names = {tree["name"] for tree in manifest["trees"]}
    for member in members:
        _check_member(member, tree_names, path)
    if manifest["database"]["member"] not in names:
        raise RestoreError(f"{path} has no member {manifest['database']['member']} (its database), which its "
                           f"{MANIFEST} names: nothing was restored")
    return ArchiveContents(manifest, members)


def _where_it_ends(members: list[tarfile.TarInfo], path: Path) -> str:
    if not members:
        return "it holds no member at all; it is not a Temper backup, or is empty"
    last = members[-1]
    held = path.stat().st_size - last.offset_data
    if held < last.size:
        return (f"the archive is truncated: it ends inside member {last.name} ({max(held, 0)} of its {last.size} "
                "bytes there)")
    return f"the archive ends after member {last.name}: it is truncated, or is not a Temper backup"


MANIFEST_DATABASE_KEYS = ("engine", "member", "migrations")
MANIFEST_TREE_KEYS = ("name", "root", "resolved_root", "files", "bytes")


def _manifest(archive: tarfile.TarFile, member: tarfile.TarInfo, path: Path) -> dict:
    try:
        manifest = json.loads(archive.extractfile(member).read())
        missing = [f"database.{key}" for key in MANIFEST_DATABASE_KEYS if key not in manifest["database"]]
        missing += [f"trees[{index}].{key}" for index, tree in enumerate(manifest["trees"])
                    for key in MANIFEST_TREE_KEYS if key not in tree]
    except (ValueError, KeyError, TypeError, tarfile.TarError) as error:
        raise RestoreError(f"{path}: member {MANIFEST} is not a Temper backup manifest ({error!r}): nothing was "
                           "restored") from error
    if missing:
        raise RestoreError(f"{path}: member {MANIFEST} lacks {', '.join(missing)}: it is not a Temper backup "
                           "manifest; nothing was restored")
    if manifest.get("format") != FORMAT:
        raise RestoreError(f"{path}: {MANIFEST} is of format {manifest.get('format')}, this Temper reads format "
                           f"{FORMAT}: restore it with the Temper that made it")
    return manifest


def _check_member(member: tarfile.TarInfo, tree_names: set[str], path: Path) -> None:
    parts = PurePosixPath(member.name).parts
    allowed = (member.name == MANIFEST or (parts[:1] == (DATABASE_DIRECTORY,) and len(parts) == 2)
               or (len(parts) >= 3 and parts[0] == TREES_DIRECTORY and parts[1] in tree_names))
    if not allowed or ".." in parts or member.name.startswith("/"):
        raise RestoreError(f"{path}: member {member.name} is not where a Temper backup puts anything: nothing was "
                           "restored")
    if not (member.isfile() or member.isdir() or member.issym()):
        raise RestoreError(f"{path}: member {member.name} is neither a file, a folder nor a link: nothing was restored")


def migration_gaps(applied: list[str]) -> tuple[list[str], list[str]]:
    """(the archive's migrations this code lacks, this code's migrations the archive's database has not applied)."""
    known = {f"{app}.{name}" for app, name in MigrationLoader(None, ignore_no_migrations=True).disk_migrations}
    return sorted(set(applied) - known), sorted(known - set(applied))


def database_findings() -> list[str]:
    """``table (N rows)`` for each table of the target database holding rows of anything but bookkeeping."""
    if (database := sqlite_file()) is not None and not database.exists():
        return []
    found = []
    with connection.cursor() as cursor:
        for table in sorted(connection.introspection.table_names(cursor)):
            if table in BOOKKEEPING_TABLES:
                continue
            cursor.execute(f"SELECT COUNT(*) FROM {connection.ops.quote_name(table)}")
            if rows := cursor.fetchone()[0]:
                found.append(f"{table} ({counted(rows, 'row')})")
    return found


def live_workers() -> list[Worker]:
    """The workers alive against the target database (``workers.selectors.workers_alive``, as the Workers page reads
    their heartbeats); none for a database not there or not migrated yet, which no worker has written to."""
    if (database := sqlite_file()) is not None and not database.exists():
        return []
    try:
        return list(workers_alive())
    except DatabaseError:
        return []


def live_worker_words(worker: Worker) -> str:
    """``worker <name> (on <host>, pid <pid>, queues …) sent a heartbeat N s ago``."""
    seconds = round((timezone.now() - worker.last_seen).total_seconds())
    return (f"worker {worker.name} (on {worker.host}, pid {worker.pid}, queues {', '.join(worker.shared_queues)}) "
            f"sent a heartbeat {seconds} s ago")


def tree_findings(tree: Tree) -> list[str]:
    """What ``tree.root`` holds that a restore would replace: each entry, a folder with its file count."""
    if not tree.root.is_dir():
        return []
    found = []
    for entry in sorted(tree.root.iterdir()):
        if _kept_in_place(entry, tree) or entry.name == KEY_FILE:
            continue
        if entry.is_dir() and not entry.is_symlink():
            found.append(f"{entry.name}/ ({counted(sum(len(files) for _, _, files in os.walk(entry)), 'file')})")
        else:
            found.append(entry.name)
    return found


def _kept_in_place(entry: Path, tree: Tree) -> bool:
    """Entries a restore leaves where they are: its own work folders, and what the backup leaves out (the SQLite
    database, put in place by the database step; what Temper makes again)."""
    return transient(entry.name) or entry.absolute() in tree.left_out or entry.resolve() in tree.left_out


def path_rewrites(manifest: dict, trees: dict[str, Tree]) -> list[tuple[str, str]]:
    """(root in the backup, root here) for each tree restored elsewhere, as configured and as resolved, since the
    database holds both (a run's output folder as configured, a base model's path resolved)."""
    moves = []
    for recorded in manifest["trees"]:
        here = trees[recorded["name"]].root
        for old, new in ((recorded["root"], str(here)), (recorded["resolved_root"], str(here.resolve()))):
            if old != new and (old, new) not in moves:
                moves.append((old, new))
    return sorted(moves, key=lambda move: -len(move[0]))


def sql_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def path_rewrite_statements(moves: list[tuple[str, str]], *, vendor: str) -> list[str]:
    """SQL (the same for SQLite and PostgreSQL but for JSON's casts) that moves the paths the database holds from
    each old root to its new one: path columns equal to the root or under it, and in the JSON of a run's resolved
    spec and its engine summary each string that is the root or starts with it (matched as JSON writes it, with its
    opening quote)."""
    path_columns = [(model._meta.db_table, model._meta.get_field("path").column) for model in (BaseModel, Artifact)]
    # The engine's summary kept as the run's names its model and its exports as the run folder's summary.json does.
    json_columns = [(Run._meta.db_table, Run._meta.get_field(name).column) for name in ("resolved_spec", "summary")]
    statements = []
    for old, new in moves:
        for table, column in path_columns:
            statements.append(
                f"UPDATE {table} SET {column} = {sql_literal(new)} || substr({column}, {len(old) + 1}) "
                f"WHERE {column} = {sql_literal(old)} "
                f"OR substr({column}, 1, {len(old) + 1}) = {sql_literal(old + '/')}")
        # Django writes JSON on SQLite with non-ASCII escaped; PostgreSQL's jsonb reads back as UTF-8.
        old_json, new_json = (json.dumps(path, ensure_ascii=vendor == "sqlite")[:-1] for path in (old, new))
        for table, column in json_columns:
            text = f"{column}::text" if vendor == "postgresql" else column
            for end in ("/", '"'):
                text = f"replace({text}, {sql_literal(old_json + end)}, {sql_literal(new_json + end)})"
            cast = "::jsonb" if vendor == "postgresql" else ""
            statements.append(f"UPDATE {table} SET {column} = {text}{cast}")
    return statements


def moved_path(text: str, moves: list[tuple[str, str]]) -> str:
    """``text`` under the new root of the first move whose old root it is or lies under, else as it is."""
    for old, new in moves:
        if text == old or text.startswith(old + "/"):
            return new + text[len(old):]
    return text


def moved_paths(value: Any, moves: list[tuple[str, str]]) -> Any:
    """``value`` (a JSON or YAML document) with each string that is a moved path moved (``moved_path``)."""
    if isinstance(value, str):
        return moved_path(value, moves)
    if isinstance(value, list):
        return [moved_paths(item, moves) for item in value]
    if isinstance(value, dict):
        return {key: moved_paths(item, moves) for key, item in value.items()}
    return value


def run_folder_rewrites(data_root: Path, moves: list[tuple[str, str]]) -> int:
    """Move the paths that the engine recorded in the files it wrote under ``data_root`` (staged) as
    ``path_rewrite_statements`` moves the database's (``engine_documents``); returns how many files changed."""
    changed = 0
    for pattern, read, write, moved in engine_documents():
        for path in sorted(data_root.glob(pattern)):
            changed += _rewrite(path, moves, read=read, write=write, moved=moved)
    return changed


def engine_documents() -> list[tuple[str, Callable[[str], Any], Callable[[Any], str], Callable]]:
    """(glob under the data directory, read, write, move) of each file the engine writes with absolute paths in it
    that something reads back as a path:

    - a run's ``spec.yaml`` and its checkpoints' metadata: a run resumes only where they name the job it is resuming
      (``jaxengine.job.job_identity``: the model's resolved path) and the data it read; left naming the old data
      directory, every restored run that trained, re-queued or resumed, failed on "holds the checkpoints of another
      job";
    - a run's ``summary.json``: a run started again once done returns it, and the web registers the exports its
      ``export`` names (``runs.reporting.run_finish``, only folders that are there);
    - a LoRA export's ``adapter/adapter_config.json`` (``export/``, ``export-step-N/``): its
      ``base_model_name_or_path``, the folder PEFT loads the adapter onto;
    - a serving copy's ``quantization.json`` (a run's or a checkpoint's ``quantized/``, a base model's under
      ``serving-copies/``): its ``source``, the model it was made from (``jaxengine.job.quantized_copy_source``).

    What is left as written, and why, the module note says."""
    yaml_document = (yaml.safe_load, lambda document: yaml.safe_dump(document, sort_keys=False))
    json_document = (json.loads, lambda document: json.dumps(document, indent=2) + "\n")
    runs, exports = f"{RUNS_DIRECTORY}/*", (EXPORT_DIRECTORY, f"{EXPORT_STEP_PREFIX}*")
    return [
        (f"{runs}/spec.yaml", *yaml_document, moved_paths),
        (f"{runs}/{CHECKPOINTS_DIRECTORY}/*/meta/metadata", json.loads, json.dumps, _moved_checkpoint_meta),
        (f"{runs}/summary.json", *json_document, moved_paths),
        *((f"{runs}/{export}/adapter/adapter_config.json", *json_document, moved_paths) for export in exports),
        *((f"{runs}/{export}/{QUANTIZED_SUBDIR}/{QUANTIZATION_FILE}", *json_document, moved_paths)
          for export in exports),
        (f"{BASE_MODEL_COPIES}/*/{QUANTIZATION_FILE}", *json_document, moved_paths),
    ]


def _moved_checkpoint_meta(meta: Any, moves: list[tuple[str, str]]) -> Any:
    meta = moved_paths(meta, moves)
    # The job's identity is a JSON document in a string, compared as the engine writes it (sort_keys).
    if isinstance(meta, dict) and isinstance(meta.get("identity"), str):
        try:
            identity = json.loads(meta["identity"])
        except ValueError:
            return meta
        meta["identity"] = json.dumps(moved_paths(identity, moves), sort_keys=True)
    return meta


def _rewrite(path: Path, moves: list[tuple[str, str]], *, read: Callable[[str], Any], write: Callable[[Any], str],
             moved: Callable[[Any, list[tuple[str, str]]], Any] = moved_paths) -> int:
    """1 when ``path``'s document named a moved path and was written again with it moved, else 0 (a file this
    code cannot read is left as it is: the engine says what is wrong with it when it reads it)."""
    try:
        document = read(path.read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return 0
    rewritten = moved(document, moves)
    if rewritten == document:
        return 0
    path.write_text(write(rewritten))
    return 1


@dataclass
class Moves:
    """Renames done so far, undone newest first when a later step fails."""

    done: list[tuple[Path, Path]] = field(default_factory=list)

    def move(self, source: Path, destination: Path) -> None:
        os.rename(source, destination)
        self.done.append((source, destination))

    def undo(self) -> None:
        for source, destination in reversed(self.done):
            os.rename(destination, source)
        self.done.clear()


@dataclass
class Staged:
    tree: Tree
    folder: Path  # STAGING_PREFIX… inside tree.root, holding the tree's restored entries
    files: int = 0
    bytes: int = 0


class Restore:
    """One restore of ``path`` into this installation (the module note's steps), saying its progress to ``say``."""

    def __init__(self, path: Path, *, force: bool, say: Callable[[str], None], ignore_live_workers: bool = False):
        self.path, self.force, self.say, self.ignore_live_workers = path, force, say, ignore_live_workers
        self.engine = database_engine()
        # An archive kept in the data directory stays there, not moved aside with the rest and deleted.
        self.trees = {tree.name: tree for tree in installation_trees(also_left_out=(path,))}
        self.work: list[Path] = []  # staging folders and files, removed at the end whatever happens
        self.progress = Progress(say)

    def run(self) -> dict:
        """Restore; returns what the caller reports: the manifest, the staged trees and unapplied migrations."""
        try:
            with tarfile.open(self.path, "r:*") as archive:
                contents = read_archive(archive, self.path)
                manifest = contents.manifest
                unapplied = self._check(manifest)
                staged, database_file = self._extract(archive, contents)
            moves = path_rewrites(manifest, self.trees)
            run_files = run_folder_rewrites(staged["data"].folder, moves) if moves else 0
            self._apply(staged, database_file, moves)
            return {"manifest": manifest, "staged": staged, "unapplied": unapplied, "moves": moves,
                    "run_files_moved": run_files}
        except (OSError, tarfile.TarError) as error:
            raise RestoreError(f"restoring {self.path} failed: {error}; nothing was changed") from error
        finally:
            for path in self.work:
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)

    def _check(self, manifest: dict) -> list[str]:
        engine = manifest["database"]["engine"]
        if engine != self.engine:
            raise RestoreError(f"{self.path} holds a {engine} database and this Temper uses {self.engine} "
                               f"(DATABASE_URL): point DATABASE_URL at a {engine} database to restore it")
        unknown, unapplied = migration_gaps(manifest["database"]["migrations"])
        if unknown:
            raise RestoreError(
                f"{self.path} comes from a newer Temper ({release_words(manifest['temper'])}): its database has "
                f"migrations this code does not have: {', '.join(unknown)}. Install that Temper or a newer one, then "
                "restore")
        for recorded in manifest["trees"]:
            if recorded["name"] not in self.trees:
                raise RestoreError(
                    f"{self.path} holds a models root kept apart from the data directory (it was {recorded['root']}), "
                    f"and TEMPER_MODELS_ROOT here ({settings.MODELS_ROOT}) is inside TEMPER_DATA: set "
                    "TEMPER_MODELS_ROOT to a folder outside it")
        self._check_no_live_workers()
        findings = [f"the database: {', '.join(found)}"] if (found := database_findings()) else []
        restored = [self.trees[recorded["name"]] for recorded in manifest["trees"]]
        findings += [f"{tree.root}: {', '.join(found)}" for tree in restored if (found := tree_findings(tree))]
        if findings and not self.force:
            raise RestoreError("not restoring over an installation that holds data; found " + "; ".join(findings)
                               + ". Stop Temper and run again with --force to replace all of it with the backup")
        for found in findings:
            self.say(f"replacing (--force) {found}")
        return unapplied

    def _check_no_live_workers(self) -> None:
        if not (alive := live_workers()):
            return
        if not self.ignore_live_workers:
            raise RestoreError(
                f"Temper is running against this installation: {'; '.join(map(live_worker_words, alive))}. A restore would replace the "
                "database and the data directory under their work. Stop Temper (its web server and every worker) and "
                f"run again; a worker stopped without a clean shutdown counts as alive until "
                f"{settings.TEMPER_WORKER_STALE_AFTER} s (TEMPER_WORKER_STALE_AFTER) after its last heartbeat. Only "
                "for a worker you know has stopped, --ignore-live-workers restores anyway")
        self.say(f"restoring under {counted(len(alive), 'live worker')} (--ignore-live-workers): "
                 f"{', '.join(worker.name for worker in alive)}")

    def _extract(self, archive: tarfile.TarFile, contents: ArchiveContents) -> tuple[dict[str, Staged], Path]:
        staged = {}
        for recorded in contents.manifest["trees"]:
            tree = self.trees[recorded["name"]]
            tree.root.mkdir(parents=True, exist_ok=True)
            staged[tree.name] = Staged(tree, Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=tree.root)))
            self.work.append(staged[tree.name].folder)
        database_file = self._database_staging()
        for member in contents.members:
            if member.name == contents.manifest["database"]["member"]:
                self.say(f"database ({self.engine}): extracting {byte_size(member.size)}")
                self._extract_file(archive, member, database_file)
            elif member.name.startswith(f"{TREES_DIRECTORY}/"):
                self._extract_tree_member(archive, member, staged)
        for recorded in contents.manifest["trees"]:
            done = staged[recorded["name"]]
            if (done.files, done.bytes) != (recorded["files"], recorded["bytes"]):
                raise RestoreError(
                    f"{self.path}: tree {done.tree.name} holds {counted(done.files, 'file')}, {done.bytes} bytes; its "
                    f"{MANIFEST} says {counted(recorded['files'], 'file')}, {recorded['bytes']} bytes: nothing was "
                    "restored")
            self.say(f"{done.tree.name}: extracted {counted(done.files, 'file')}, {byte_size(done.bytes)}")
        if self.engine == "sqlite":
            self._check_sqlite(database_file)
        return staged, database_file

    def _database_staging(self) -> Path:
        if self.engine == "sqlite":
            target = sqlite_file()
            target.parent.mkdir(parents=True, exist_ok=True)
            descriptor, name = tempfile.mkstemp(prefix=STAGING_PREFIX, dir=target.parent)
        else:
            descriptor, name = tempfile.mkstemp(prefix=STAGING_PREFIX, dir=self.trees["data"].root)
        os.close(descriptor)
        self.work.append(Path(name))
        return Path(name)

    def _extract_tree_member(self, archive: tarfile.TarFile, member: tarfile.TarInfo, staged: dict[str, Staged]
                             ) -> None:
        _, tree_name, *relative = PurePosixPath(member.name).parts
        target = staged[tree_name].folder.joinpath(*relative)
        target.parent.mkdir(parents=True, exist_ok=True)
        # Through a link the archive made earlier, a member could be written anywhere: it stays in its tree.
        if not target.parent.resolve().is_relative_to(staged[tree_name].folder.resolve()):
            raise RestoreError(f"{self.path}: member {member.name} lies through a link out of its folder: nothing "
                               "was restored")
        if member.isdir():
            target.mkdir(exist_ok=True)
        elif member.issym():
            target.symlink_to(member.linkname)
        else:
            self._extract_file(archive, member, target)
            staged[tree_name].files += 1
            staged[tree_name].bytes += member.size
            self.progress.tick(f"{tree_name} (extracting)", files=staged[tree_name].files, size=staged[tree_name].bytes)

    def _extract_file(self, archive: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> None:
        try:
            with archive.extractfile(member) as source, target.open("wb") as destination:
                shutil.copyfileobj(source, destination, CHUNK_BYTES)
        except tarfile.ReadError as error:
            raise RestoreError(f"{self.path}: member {member.name} is cut short ({error}): nothing was restored"
                               ) from error
        os.chmod(target, member.mode & 0o777)
        os.utime(target, (member.mtime, member.mtime))

    def _check_sqlite(self, database_file: Path) -> None:
        database = sqlite3.connect(database_file)
        try:
            problems = [row[0] for row in database.execute("PRAGMA integrity_check")]
        except sqlite3.DatabaseError as error:
            problems = [str(error)]
        finally:
            database.close()
        if problems != ["ok"]:
            raise RestoreError(f"{self.path}: its database ({self.engine}) is damaged: {'; '.join(problems[:5])}: "
                               "nothing was restored")

    def _apply(self, staged: dict[str, Staged], database_file: Path, moves: list[tuple[str, str]]) -> None:
        statements = path_rewrite_statements(moves, vendor=self.engine)
        if self.engine == "sqlite" and statements:
            with sqlite3.connect(database_file) as database:
                for statement in statements:
                    database.execute(statement)
            database.close()
        renames = Moves()
        connection.close()  # its file is about to be replaced; the next query opens the restored one
        try:
            for done in staged.values():
                self._swap_tree(done, renames)
            if self.engine == "sqlite":
                self._swap_sqlite(database_file, renames)
            else:
                self._load_postgres(database_file, statements)
        except BaseException:
            renames.undo()
            raise

    def _swap_tree(self, done: Staged, renames: Moves) -> None:
        aside = Path(tempfile.mkdtemp(prefix=ASIDE_PREFIX, dir=done.tree.root))
        self.work.append(aside)
        for entry in sorted(done.tree.root.iterdir()):
            if entry not in (aside, done.folder) and not _kept_in_place(entry, done.tree):
                renames.move(entry, aside / entry.name)
        for entry in sorted(done.folder.iterdir()):
            if (done.tree.root / entry.name).exists():
                # What this installation leaves in place (its compiled-program cache, its collected static files)
                # and the backup's installation kept as data: what is here is what this one makes and reads.
                self.say(f"{entry.name}: left as it is here ({done.tree.root / entry.name}), not taken from the backup")
                continue
            renames.move(entry, done.tree.root / entry.name)

    def _swap_sqlite(self, database_file: Path, renames: Moves) -> None:
        target = sqlite_file()
        aside = Path(tempfile.mkdtemp(prefix=ASIDE_PREFIX, dir=target.parent))
        self.work.append(aside)
        # The old database's write-ahead log must go with it: left beside the restored file, SQLite would replay it.
        for suffix in SQLITE_SIDE_FILES:
            if (side := Path(f"{target}{suffix}")).exists():
                renames.move(side, aside / side.name)
        renames.move(database_file, target)
        self.say(f"database: restored into {target}")

    def _load_postgres(self, dump: Path, statements: list[str]) -> None:
        script = dump.with_name(dump.name + ".sql")
        self.work.append(script)
        run_program([postgres_program("pg_restore"), "--no-owner", "--no-privileges", "--file", str(script), str(dump)],
                    doing="pg_restore of the archive's database")
        before, after = dump.with_name(dump.name + ".before.sql"), dump.with_name(dump.name + ".after.sql")
        self.work += [before, after]
        before.write_text(DROP_TABLES)
        # The dump's script empties the search path; the rewrites name their tables unqualified.
        after.write_text("RESET search_path;\n" + "".join(f"{statement};\n" for statement in statements))
        arguments, environment = libpq_connection()
        self.say("database: loading into PostgreSQL in one transaction")
        run_program([postgres_program("psql"), "--no-psqlrc", "--quiet", "--set", "ON_ERROR_STOP=1",
                     "--single-transaction", "--file", str(before), "--file", str(script), "--file", str(after),
                     *arguments], environment=environment, doing="loading the database (nothing of it was changed)")
        self.say(f"database: restored into {settings.DATABASES['default']['NAME']}")


# Run in the restoring transaction, before the dump's script: the target's tables go (with --force; without it
# there were none holding a team's rows), so that tables of a later migration do not stay beside the restored ones.
DROP_TABLES = """
DO $$
DECLARE name text;
BEGIN
    FOR name IN SELECT tablename FROM pg_tables WHERE schemaname = current_schema() LOOP
        EXECUTE format('DROP TABLE IF EXISTS %I CASCADE', name);
    END LOOP;
    FOR name IN SELECT sequence_name FROM information_schema.sequences WHERE sequence_schema = current_schema() LOOP
        EXECUTE format('DROP SEQUENCE IF EXISTS %I CASCADE', name);
    END LOOP;
END $$;
"""
