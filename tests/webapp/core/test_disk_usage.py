"""webapp.core.disk_usage on real folders, checked against what ``du`` itself reports for them."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

from webapp.core.disk_usage import folder_usage


def du_bytes(*paths: Path) -> int:
    """What ``du`` counts for ``paths`` together (a hard-linked inode once across them), in bytes."""
    output = subprocess.run(["du", "-s", "--block-size=1", "--total", *map(str, paths)], check=True,
                            capture_output=True, text=True).stdout
    return int(output.splitlines()[-1].split()[0])


def write(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))
    return path


def test_it_counts_what_du_counts_and_each_top_level_entry_apart(tmp_path):
    run = tmp_path / "run"
    write(run / "checkpoints" / "10" / "state" / "weights", 300_000)
    write(run / "checkpoints" / "10" / "metadata.json", 100)
    write(run / "export" / "model.safetensors", 70_000)
    write(run / "log.txt", 5)
    usage = folder_usage(run)
    assert usage.bytes == du_bytes(run) and not usage.gone
    assert usage.children == {"checkpoints": du_bytes(run / "checkpoints"), "export": du_bytes(run / "export"),
                              "log.txt": du_bytes(run / "log.txt")}
    assert usage.children["checkpoints"] >= 300_100  # the blocks, not fewer than the bytes written


def test_a_sparse_file_counts_the_blocks_it_takes_not_its_length(tmp_path):
    sparse = tmp_path / "folder" / "preallocated"
    sparse.parent.mkdir()
    with sparse.open("wb") as file:
        file.truncate(200 * 1024 * 1024)
        file.write(b"x")
    usage = folder_usage(sparse.parent)
    assert usage.bytes == du_bytes(sparse.parent)
    assert usage.bytes < 1024 * 1024 < sparse.stat().st_size


def test_a_hard_linked_file_counts_once_within_a_folder_and_across_folders_sharing_seen(tmp_path):
    first = write(tmp_path / "a" / "weights", 500_000)
    os.link(first, tmp_path / "a" / "weights-again")
    (tmp_path / "b").mkdir()
    os.link(first, tmp_path / "b" / "weights")
    alone = folder_usage(tmp_path / "a")
    assert alone.bytes == du_bytes(tmp_path / "a") < 2 * 500_000
    seen: set = set()
    together = folder_usage(tmp_path / "a", seen=seen).bytes + folder_usage(tmp_path / "b", seen=seen).bytes
    assert together == du_bytes(tmp_path / "a", tmp_path / "b")
    assert folder_usage(tmp_path / "b").bytes > together - alone.bytes  # unshared, b counts the file itself


def test_links_are_not_followed_to_a_big_file_or_folder_elsewhere(tmp_path):
    outside = write(tmp_path / "elsewhere" / "big", 2_000_000)
    folder = tmp_path / "model"
    write(folder / "config.json", 10)
    (folder / "weights").symlink_to(outside)
    (folder / "all").symlink_to(outside.parent, target_is_directory=True)
    usage = folder_usage(folder)
    assert usage.bytes == du_bytes(folder) < 100_000


def test_files_and_folders_removed_during_the_walk_count_nothing_and_fail_nothing(tmp_path, monkeypatch):
    """A run rotating out a checkpoint while the page reads it: entries listed, then removed before the walk reached
    them (this ``os.scandir`` removes them just after a listing): a log file before its ``lstat``, a checkpoint
    folder after its ``lstat`` but before its own listing."""
    run = tmp_path / "run"
    write(run / "checkpoints" / "5" / "weights", 400_000)
    write(run / "checkpoints" / "10" / "weights", 400_000)
    write(run / "old.log", 400_000)
    listed = os.scandir

    @contextlib.contextmanager
    def listing_then_pruning(path):
        if isinstance(path, int):  # shutil.rmtree's own listings, by file descriptor
            with listed(path) as entries:
                yield entries
            return
        path = Path(path)
        with listed(path) as entries:
            entries = list(entries)
        if path == run:
            (run / "old.log").unlink()
        if path.parent == run / "checkpoints":  # the other checkpoint is stat'd and waits to be listed
            for other in (run / "checkpoints").iterdir():
                if other != path:
                    shutil.rmtree(other)
        yield iter(entries)

    monkeypatch.setattr(os, "scandir", listing_then_pruning)
    usage = folder_usage(run)
    monkeypatch.undo()
    (tmp_path / "empty").mkdir()
    gone_folder_entry = os.lstat(tmp_path / "empty").st_blocks * 512  # stat'd before it went: its own entry counts
    assert usage.bytes == du_bytes(run) + gone_folder_entry and set(usage.children) == {"checkpoints"}
    assert len(list((run / "checkpoints").iterdir())) == 1


def test_a_folder_already_gone_is_gone_with_no_bytes(tmp_path):
    assert folder_usage(tmp_path / "deleted") == folder_usage(tmp_path / "deleted" / "below")
    assert folder_usage(tmp_path / "deleted").gone and folder_usage(tmp_path / "deleted").bytes == 0
    assert not folder_usage(tmp_path).gone
