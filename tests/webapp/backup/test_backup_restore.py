"""``manage.py temper_backup`` and ``temper_restore`` on SQLite, each in a process of its own with the settings
of an installation (TEMPER_DATA, DATABASE_URL), as a team runs them: an installation with a user, a project, a
dataset version's file, a run with a checkpoint and an uploaded base model is backed up, then restored into a
fresh data directory and database elsewhere; refusals leave the target as it was."""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import sqlite3
import subprocess
import tarfile
import threading
from pathlib import Path

import pytest
import yaml

from tests.webapp.backup.installations import (
    DUMP,
    SEED,
    installation,
    moved,
    ok,
    run_in,
)


def file_digests(root: Path) -> dict[str, str]:
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(root.rglob("*")) if path.is_file()}


def snapshot(base: Path) -> dict[str, str]:
    """Every file under ``base`` with its digest: what a refused restore must leave as it was."""
    return file_digests(base) if base.exists() else {}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """An installation, seeded, with its backup: (its environment, its base folder, the backup, its rows)."""
    base = tmp_path_factory.mktemp("source")
    environment = installation(base)
    run_id = ok(run_in(environment, "-c", SEED)).strip().splitlines()[-1]
    backup = base / "temper.tar"
    result = run_in(environment, "temper_backup", str(backup))
    assert result.returncode == 0, result.stderr
    assert "database (sqlite): copying" in result.stderr and f"backup written to {backup}" in result.stdout
    return {"environment": environment, "base": base, "backup": backup, "run_id": run_id,
            "rows": json.loads(ok(run_in(environment, "-c", DUMP)))}


def test_a_backup_restores_into_a_fresh_installation_elsewhere(source, tmp_path):
    target = installation(tmp_path)
    result = run_in(target, "temper_restore", str(source["backup"]))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 user, 1 project, 1 dataset version, 1 base model, 1 run" in result.stdout
    old_data, new_data = source["environment"]["TEMPER_DATA"], target["TEMPER_DATA"]
    assert f"paths in the database moved from {old_data} to {new_data}" in result.stdout
    restored_rows = json.loads(ok(run_in(target, "-c", DUMP)))
    assert restored_rows == moved(source["rows"], old_data, new_data)
    assert source["rows"]["activity"] == [["backed-up", "owner", "run.launched", source["run_id"]]]  # the log came back
    # Every file but those a backup leaves out, byte for byte; the restored folders are where the rows say.
    source_files = {name: digest for name, digest in file_digests(Path(old_data)).items()
                    if not name.startswith(("jax-cache/", "temper.sqlite3", "staticfiles")) and ".part" not in name
                    and "/.deleting-checkpoint-" not in name}
    restored_files = {name: digest for name, digest in file_digests(Path(new_data)).items()
                      if not name.startswith("temper.sqlite3")}
    assert restored_files == source_files
    assert f"runs/{source['run_id']}/checkpoints/10/state.bin" in restored_files
    assert not any("/.deleting-checkpoint-" in name for name in restored_files)  # a checkpoint being deleted
    assert "secret_key" in restored_files and (Path(new_data) / "secret_key").stat().st_mode & 0o777 == 0o600
    assert all(Path(path).is_dir() for _run, _kind, path in restored_rows["artifacts"])
    assert all(Path(path).is_dir() for _id, path in restored_rows["base_models"])



def test_paths_the_engine_wrote_into_a_run_folder_move_with_the_data_directory(source, tmp_path):
    """A run resumes only where its folder's spec.yaml and its checkpoints' metadata name its model as its spec does
    (``jaxengine.job.job_identity``): restored elsewhere, they named the old data directory and every resume of a
    restored run failed, "holds the checkpoints of another job"."""
    old_data = source["environment"]["TEMPER_DATA"]
    model, output_dir = f"{old_data}/models/projects/backed-up/tiny", f"{old_data}/runs/{source['run_id']}"
    data_file, elsewhere = f"{old_data}/datasets/rows.jsonl", "/models/kept-outside/tiny"
    identity = json.dumps({"model": model, "peft": {"method": "none"}, "task": "sft"}, sort_keys=True)
    spec = yaml.safe_dump({"task": "sft", "model": model, "output_dir": output_dir,
                           "data": {"train": data_file, "eval": elsewhere}}, sort_keys=False)
    meta = json.dumps({"step": 10, "identity": identity, "settings": {"data": {"train": data_file}}})
    run_folder = f"trees/data/runs/{source['run_id']}"
    backup = with_added_files(source["backup"], tmp_path / "with-run-files.tar", {
        f"{run_folder}/spec.yaml": spec.encode(), f"{run_folder}/checkpoints/10/meta/metadata": meta.encode()})
    target = installation(tmp_path)
    result = run_in(target, "temper_restore", str(backup))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "paths in the files the engine wrote moved: 2 files" in result.stdout
    new_data = target["TEMPER_DATA"]
    restored_run = Path(new_data) / "runs" / source["run_id"]
    assert yaml.safe_load((restored_run / "spec.yaml").read_text()) == {
        "task": "sft", "model": f"{new_data}/models/projects/backed-up/tiny", "output_dir": str(restored_run),
        "data": {"train": f"{new_data}/datasets/rows.jsonl", "eval": elsewhere}}
    restored_meta = json.loads((restored_run / "checkpoints" / "10" / "meta" / "metadata").read_text())
    assert restored_meta["identity"] == json.dumps(
        {"model": f"{new_data}/models/projects/backed-up/tiny", "peft": {"method": "none"}, "task": "sft"},
        sort_keys=True)
    assert restored_meta["settings"] == {"data": {"train": f"{new_data}/datasets/rows.jsonl"}}


def test_paths_in_a_runs_summary_exports_and_serving_copies_move_with_the_data_directory(source, tmp_path):
    """The other files the engine writes with absolute paths in them: the run's summary.json (a run run again once
    done returns it, and its ``export`` paths are where the web registers the run's exports, ``run_finish``: left
    naming the old data directory, the restored run lost them), a LoRA export's ``adapter_config.json`` (its base
    model, which PEFT loads the adapter onto) and a serving copy's ``quantization.json`` (the model it was made
    from); and the engine's summary the database keeps as the run's."""
    old_data, run_id = source["environment"]["TEMPER_DATA"], source["run_id"]
    model, output_dir = f"{old_data}/models/projects/backed-up/tiny", f"{old_data}/runs/{run_id}"
    summary = {"status": "succeeded", "step": 10, "model": model,
               "export": {"model": f"{output_dir}/export", "adapter": f"{output_dir}/export/adapter"}}
    adapter = {"peft_type": "LORA", "base_model_name_or_path": model, "r": 8}
    quantization = {"scheme": "int8", "source": f"{output_dir}/export"}
    run_folder, copies = f"trees/data/runs/{run_id}", "trees/data/serving-copies/bm_tiny"
    documents = {
        f"{run_folder}/summary.json": summary,
        f"{run_folder}/export/adapter/adapter_config.json": adapter,
        f"{run_folder}/export-step-10/adapter/adapter_config.json": adapter,
        f"{run_folder}/export/quantized/quantization.json": quantization,
        f"{run_folder}/export-step-10/quantized/quantization.json": {**quantization,
                                                                     "source": f"{output_dir}/export-step-10"},
        f"{copies}/quantization.json": {**quantization, "source": model},
    }
    backup = with_added_files(source["backup"], tmp_path / "with-engine-files.tar",
                              {name: (json.dumps(document, indent=2) + "\n").encode()
                               for name, document in documents.items()})
    environment = installation(tmp_path / "source")
    shutil.copytree(source["base"] / "data", tmp_path / "source" / "data")
    ok(run_in(environment, "-c", RECORD_SUMMARY.format(run_id=run_id, summary=json.dumps(summary))))
    target = installation(tmp_path / "target")
    result = run_in(target, "temper_restore", str(with_database_of(backup, environment, tmp_path / "both.tar")))
    assert result.returncode == 0, result.stdout + result.stderr
    new_data = target["TEMPER_DATA"]
    for name, document in documents.items():
        restored = Path(new_data, *Path(name).parts[2:])
        assert json.loads(restored.read_text()) == moved(document, old_data, new_data), name
    restored_summary = json.loads(ok(run_in(target, "-c", READ_SUMMARY.format(run_id=run_id))))
    assert restored_summary == moved(summary, old_data, new_data)
    assert "paths in the files the engine wrote moved: 6 files" in result.stdout


# The engine's summary recorded as the run's, as ``runs.reporting.run_finish`` records it.
RECORD_SUMMARY = """
import django, json
django.setup()
from webapp.runs.models import Run
Run.objects.filter(public_id={run_id!r}).update(summary=json.loads({summary!r}))
"""
READ_SUMMARY = """
import django, json
django.setup()
from webapp.runs.models import Run
print(json.dumps(Run.objects.get(public_id={run_id!r}).summary))
"""


def with_database_of(backup: Path, environment: dict[str, str], out: Path) -> Path:
    """A copy of ``backup`` whose database is the one ``environment``'s installation holds now."""
    database = Path(environment["TEMPER_DATA"]) / "temper.sqlite3"
    return with_member(backup, out, "database/temper.sqlite3", lambda _content: database.read_bytes())


def test_a_checkpoint_deleted_while_the_backup_copies_it_is_left_out(source, tmp_path):
    """The trainer deletes its older checkpoints as it saves newer ones (``keep_last``), file by file: a backup
    walking one meanwhile stored what was left of it (here its bare folders, as orbax's deleter leaves them last),
    and the restored run's resume failed on it ("checkpoint 20 cannot be read")."""
    shutil.copytree(source["base"] / "data", tmp_path / "source" / "data")  # a seeded installation of its own
    environment, run_id = installation(tmp_path / "source"), source["run_id"]
    checkpoints = Path(environment["TEMPER_DATA"]) / "runs" / run_id / "checkpoints"
    (checkpoints / "20" / "state" / "d").mkdir(parents=True)
    backup = tmp_path / "temper.tar"
    result = run_in(environment, "temper_backup", str(backup))
    assert result.returncode == 0, result.stderr
    with tarfile.open(backup) as archive:
        names = archive.getnames()
    prefix = f"trees/data/runs/{run_id}/checkpoints/"
    assert f"{prefix}10/state.bin" in names
    assert not [name for name in names if name.startswith(f"{prefix}20")]
    assert f"runs/{run_id}/checkpoints/20: left out, incomplete (being deleted or cut short)" in result.stderr


def with_added_files(backup: Path, out: Path, files: dict[str, bytes]) -> Path:
    """A copy of ``backup`` that holds ``files`` (member name: bytes) too, its manifest counting them."""
    with tarfile.open(backup) as source, tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as copy:
        for member in source:
            if member.name == "manifest.json":
                manifest = json.loads(source.extractfile(member).read())
                continue
            copy.addfile(member, source.extractfile(member) if member.isfile() else None)
        [data_tree] = [tree for tree in manifest["trees"] if tree["name"] == "data"]
        for name, content in files.items():
            folder = name.rsplit("/", 1)[0]
            for depth in range(2, folder.count("/") + 1):  # below trees/data/, which is no member
                parent = "/".join(folder.split("/")[:depth + 1])
                if parent not in copy.getnames():
                    info = tarfile.TarInfo(parent)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    copy.addfile(info)
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(content), 0o644
            copy.addfile(info, io.BytesIO(content))
            data_tree["files"] += 1
            data_tree["bytes"] += len(content)
        encoded = json.dumps(manifest).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size, info.mode = len(encoded), 0o644
        copy.addfile(info, io.BytesIO(encoded))
    return out


def with_member(backup: Path, out: Path, name: str, change) -> Path:
    """A copy of ``backup`` whose member ``name`` holds ``change(its bytes)``."""
    with tarfile.open(backup) as source, tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as copy:
        for member in source:
            content = source.extractfile(member) if member.isfile() else None
            if member.name == name:
                changed = change(content.read())
                member.size, content = len(changed), io.BytesIO(changed)
            copy.addfile(member, content)
    return out


def with_manifest(backup: Path, out: Path, change) -> Path:
    """A copy of ``backup`` whose manifest ``change`` (a function of the manifest, in place) has altered."""
    def changed(content: bytes) -> bytes:
        manifest = json.loads(content)
        change(manifest)
        return json.dumps(manifest).encode()

    return with_member(backup, out, "manifest.json", changed)


def assert_refused(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode != 0 and "restored" not in result.stdout, result.stdout + result.stderr
    assert all(word in result.stderr for word in words), result.stderr


def test_it_refuses_a_database_or_data_directory_that_holds_data_and_replaces_them_with_force(source, tmp_path):
    target = installation(tmp_path)
    ok(run_in(target, "temper_restore", "--quiet", str(source["backup"])))
    data = Path(target["TEMPER_DATA"])
    (data / "notes.txt").write_text("a team's own file")
    before = {name: digest for name, digest in snapshot(data).items() if not name.endswith(("-wal", "-shm"))}
    result = run_in(target, "temper_restore", str(source["backup"]))
    assert_refused(result, "not restoring over an installation that holds data", "auth_user (1 row)",
                   "projects_project (1 row)",
                   f"{data}: datasets/ (1 file), models/ (1 file), notes.txt, runs/ (1 file)", "--force")
    assert {name: digest for name, digest in snapshot(data).items() if not name.endswith(("-wal", "-shm"))} == before
    result = run_in(target, "temper_restore", "--force", str(source["backup"]))
    assert result.returncode == 0, result.stderr
    # The seed's run launch is in the project's activity log, which a backup keeps with the rest of the database.
    assert "replacing (--force) the database: activity_activity (1 row), auth_user (1 row)" in result.stderr
    assert not (data / "notes.txt").exists() and not [path for path in data.iterdir() if path.name.startswith(".")]
    assert json.loads(ok(run_in(target, "-c", DUMP))) == moved(source["rows"], source["environment"]["TEMPER_DATA"],
                                                              str(data))


# A worker of the target installation heartbeating as worker/heartbeat.py does (the Workers page's rows).
HEARTBEAT = """
import django
django.setup()
from django.utils import timezone
from webapp.workers.services import worker_heartbeat_record, worker_mark_stopped
worker_heartbeat_record(name="train@gpu-host-1", host="gpu-host-1", pid=4242, queues=["train"], devices={},
                        current_jobs=[], started_at=timezone.now())
"""
# The same worker stopping cleanly, as its process does on its way out (worker/heartbeat.py).
STOPPED = """
worker_mark_stopped(name="train@gpu-host-1", pid=4242)
"""


def test_it_refuses_to_restore_under_a_live_worker_even_with_force(source, tmp_path):
    """Nothing told that Temper was running against the target: a restore with --force replaced the database and
    the data directory under its workers. A worker whose heartbeat says it is alive (as the Workers page reads
    them) refuses the restore by name, nothing changed, until it has stopped; --ignore-live-workers overrides."""
    target = installation(tmp_path)
    ok(run_in(target, "temper_restore", "--quiet", str(source["backup"])))
    ok(run_in(target, "-c", HEARTBEAT))
    data = Path(target["TEMPER_DATA"])
    before = {name: digest for name, digest in snapshot(data).items() if not name.endswith(("-wal", "-shm"))}
    result = run_in(target, "temper_restore", "--force", str(source["backup"]))
    assert_refused(result, "Temper is running against this installation: worker train@gpu-host-1 (on gpu-host-1, "
                           "pid 4242, queues train) sent a heartbeat ",
                   "Stop Temper (its web server and every worker) and run again",
                   "--ignore-live-workers")
    assert {name: digest for name, digest in snapshot(data).items() if not name.endswith(("-wal", "-shm"))} == before
    result = run_in(target, "temper_restore", "--force", "--ignore-live-workers", str(source["backup"]))
    assert result.returncode == 0, result.stderr
    assert "restoring under 1 live worker (--ignore-live-workers): train@gpu-host-1" in result.stderr
    # The restored database holds the backup's rows, no heartbeat: stopped cleanly, a worker refuses nothing.
    ok(run_in(target, "-c", HEARTBEAT + STOPPED))
    ok(run_in(target, "temper_restore", "--force", "--quiet", str(source["backup"])))


def test_it_refuses_a_backup_from_newer_migrations_naming_them(source, tmp_path):
    newer = with_manifest(source["backup"], tmp_path / "newer.tar",
                          lambda manifest: manifest["database"]["migrations"].append("runs.9999_from_the_future"))
    target = installation(tmp_path / "target")
    assert_refused(run_in(target, "temper_restore", str(newer)),
                   "comes from a newer Temper", "migrations this code does not have: runs.9999_from_the_future")
    assert sorted(os.listdir(target["TEMPER_DATA"])) == ["secret_key"]  # made by the command's own start


def test_it_restores_a_backup_from_older_migrations_and_says_to_migrate(source, tmp_path):
    older = with_manifest(source["backup"], tmp_path / "older.tar",
                          lambda manifest: manifest["database"]["migrations"].remove("runs.0001_initial"))
    result = run_in(installation(tmp_path / "target"), "temper_restore", str(older))
    assert result.returncode == 0, result.stderr
    assert "predates 1 migration of this code: run `python manage.py migrate`" in result.stdout


@pytest.mark.parametrize("cut", ["inside the database", "inside a checkpoint", "before the manifest"])
def test_it_refuses_a_truncated_backup_naming_where_it_ends(source, tmp_path, cut):
    with tarfile.open(source["backup"]) as archive:
        members = {member.name: member for member in archive}
    checkpoint = members[f"trees/data/runs/{source['run_id']}/checkpoints/10/state.bin"]
    end, words = {
        "inside the database": (members["database/temper.sqlite3"].offset_data + 1000,
                                "ends inside member database/temper.sqlite3 (1000 of its"),
        "inside a checkpoint": (checkpoint.offset_data + 10, f"ends inside member {checkpoint.name} (10 of its 16000"),
        "before the manifest": (members["manifest.json"].offset, "has no manifest.json, which a backup writes last"),
    }[cut]
    truncated = tmp_path / "truncated.tar"
    with source["backup"].open("rb") as whole:
        truncated.write_bytes(whole.read(end))
    target = installation(tmp_path / "target")
    assert_refused(run_in(target, "temper_restore", str(truncated)), words, "Nothing was restored")
    assert sorted(os.listdir(target["TEMPER_DATA"])) == ["secret_key"]


def test_a_backup_written_into_the_data_directory_leaves_itself_out_and_a_restore_from_there_keeps_it(source,
                                                                                                  tmp_path):
    shutil.copytree(source["base"] / "data", tmp_path / "data")
    environment, data = installation(tmp_path), tmp_path / "data"
    for _night in range(2):  # the second replaces the first, which it leaves out
        ok(run_in(environment, "temper_backup", "--quiet", str(data / "temper.tar")))
    with tarfile.open(data / "temper.tar") as archive:
        names = archive.getnames()
    assert "trees/data/datasets" in names and not [name for name in names if "temper.tar" in name or "/." in name]
    assert not [path.name for path in data.iterdir() if path.name.startswith(".")]  # its work folder is gone
    kept = (data / "temper.tar").read_bytes()
    result = run_in(environment, "temper_restore", "--force", str(data / "temper.tar"))
    assert result.returncode == 0, result.stderr
    assert (data / "temper.tar").read_bytes() == kept


def test_what_the_target_makes_again_stays_when_the_backup_holds_it_too(source, tmp_path):
    """A backup from an installation whose compiled-program cache lay elsewhere holds the data directory's
    jax-cache folder; restored where that folder is the cache, the workers' cache there stays."""
    shutil.copytree(source["base"] / "data", tmp_path / "source" / "data")
    elsewhere = {**installation(tmp_path / "source"), "TEMPER_JAX_CACHE": str(tmp_path / "cache-elsewhere")}
    ok(run_in(elsewhere, "temper_backup", "--quiet", str(tmp_path / "temper.tar")))
    with tarfile.open(tmp_path / "temper.tar") as archive:
        assert "trees/data/jax-cache/program.bin" in archive.getnames()
    target = installation(tmp_path / "target")
    cache = Path(target["TEMPER_DATA"]) / "jax-cache"
    cache.mkdir(parents=True)
    (cache / "compiled-here.bin").write_bytes(b"a worker's program")
    result = run_in(target, "temper_restore", str(tmp_path / "temper.tar"))
    assert result.returncode == 0, result.stderr
    assert "jax-cache: left as it is here" in result.stderr
    assert sorted(path.name for path in cache.iterdir()) == ["compiled-here.bin"]
    assert json.loads(ok(run_in(target, "-c", DUMP)))["users"] == source["rows"]["users"]


def test_it_refuses_a_backup_whose_database_is_damaged(source, tmp_path):
    """A whole archive whose database copy got damaged (a disk's bad block): its pages, past the header, zeroed."""
    damaged = with_member(source["backup"], tmp_path / "damaged.tar", "database/temper.sqlite3",
                          lambda content: content[:4096] + bytes(len(content) - 4096))
    target = installation(tmp_path / "target")
    assert_refused(run_in(target, "temper_restore", str(damaged)), "its database (sqlite) is damaged",
                   "nothing was restored")
    assert sorted(os.listdir(target["TEMPER_DATA"])) == ["secret_key"]


def test_a_file_with_two_names_is_restored_under_both(source, tmp_path):
    """Hard links (a model's weights linked into a second folder rather than copied) come back as files."""
    shutil.copytree(source["base"] / "data", tmp_path / "source" / "data")
    data = tmp_path / "source" / "data"
    weights = data / "models" / "projects" / "backed-up" / "tiny" / "model.safetensors"
    (data / "models" / "linked").mkdir()
    os.link(weights, data / "models" / "linked" / "model.safetensors")
    ok(run_in(installation(tmp_path / "source"), "temper_backup", "--quiet", str(tmp_path / "temper.tar")))
    target = installation(tmp_path / "target")
    result = run_in(target, "temper_restore", str(tmp_path / "temper.tar"))
    assert result.returncode == 0, result.stderr
    restored = Path(target["TEMPER_DATA"]) / "models"
    assert (restored / "linked" / "model.safetensors").read_bytes() == weights.read_bytes()
    assert (restored / "projects" / "backed-up" / "tiny" / "model.safetensors").read_bytes() == weights.read_bytes()


def test_it_refuses_a_member_written_through_a_link_out_of_its_folder(source, tmp_path):
    """A link member (``trees/data/escape`` -> a folder outside) then a file under it: written through the link, the
    file would land outside the data directory."""
    outside = tmp_path / "outside"
    outside.mkdir()
    crafted = tmp_path / "crafted.tar"
    with tarfile.open(source["backup"]) as backup, tarfile.open(crafted, "w", format=tarfile.PAX_FORMAT) as copy:
        for member in backup:
            if member.name == "manifest.json":
                link = tarfile.TarInfo("trees/data/escape")
                link.type, link.linkname = tarfile.SYMTYPE, str(outside)
                copy.addfile(link)
                planted = tarfile.TarInfo("trees/data/escape/planted.txt")
                planted.size = 7
                copy.addfile(planted, io.BytesIO(b"planted"))
            copy.addfile(member, backup.extractfile(member) if member.isfile() else None)
    target = installation(tmp_path / "target")
    assert_refused(run_in(target, "temper_restore", str(crafted)),
                   "member trees/data/escape/planted.txt lies through a link out of its folder")
    assert list(outside.iterdir()) == [] and sorted(os.listdir(target["TEMPER_DATA"])) == ["secret_key"]


PROBE_PAIRS = "CREATE TABLE IF NOT EXISTS backup_probe (pair INTEGER, side INTEGER, payload BLOB)"


def test_a_backup_taken_while_another_connection_writes_is_consistent(source, tmp_path):
    """A writer commits pairs of rows while the backup runs; its committed rows stay in the write-ahead log (no
    checkpoint), where a copy of the database file would miss them."""
    shutil.copytree(source["base"] / "data", tmp_path / "data")
    environment = installation(tmp_path)
    database = tmp_path / "data" / "temper.sqlite3"
    writer = sqlite3.connect(database, check_same_thread=False, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute(PROBE_PAIRS)
    stop, written = threading.Event(), []

    def write_pairs():
        while not stop.is_set():
            writer.execute("BEGIN IMMEDIATE")
            for side in (0, 1):
                writer.execute("INSERT INTO backup_probe VALUES (?, ?, ?)", (len(written), side, os.urandom(4096)))
            writer.execute("COMMIT")
            written.append(len(written))

    thread = threading.Thread(target=write_pairs)
    thread.start()
    try:
        while len(written) < 200:  # rows in the log before the backup starts
            stop.wait(0.01)
        committed_before = len(written)
        result = run_in(environment, "temper_backup", str(tmp_path / "live.tar"))
    finally:
        stop.set()
        thread.join()
        writer.close()
    assert result.returncode == 0, result.stderr
    with tarfile.open(tmp_path / "live.tar") as archive:
        (tmp_path / "copy.sqlite3").write_bytes(archive.extractfile("database/temper.sqlite3").read())
    copy = sqlite3.connect(tmp_path / "copy.sqlite3")
    try:
        assert copy.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        pairs = copy.execute("SELECT pair, COUNT(*) FROM backup_probe GROUP BY pair").fetchall()
        assert len(pairs) >= committed_before and {count for _pair, count in pairs} == {2}
        assert copy.execute("SELECT COUNT(*) FROM auth_user").fetchone() == (1,)
    finally:
        copy.close()
