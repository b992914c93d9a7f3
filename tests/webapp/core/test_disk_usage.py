"""webapp.core.disk_usage on real folders, checked against what ``du`` itself reports for them."""
from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from tests.webapp.factories import du_bytes, write_bytes
from webapp.core.disk_usage import folder_usage


def test_it_counts_what_du_counts_and_each_top_level_entry_apart(tmp_path):
    run = tmp_path / "run"
    write_bytes(run / "checkpoints" / "10" / "state" / "weights", 300_000)
    write_bytes(run / "checkpoints" / "10" / "metadata.json", 100)
    write_bytes(run / "export" / "model.safetensors", 70_000)
    write_bytes(run / "log.txt", 5)
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
    first = write_bytes(tmp_path / "a" / "weights", 500_000)
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
    outside = write_bytes(tmp_path / "elsewhere" / "big", 2_000_000)
    folder = tmp_path / "model"
    write_bytes(folder / "config.json", 10)
    (folder / "weights").symlink_to(outside)
    (folder / "all").symlink_to(outside.parent, target_is_directory=True)
    usage = folder_usage(folder)
    assert usage.bytes == du_bytes(folder) < 100_000


def test_files_and_folders_removed_during_the_walk_count_nothing_and_fail_nothing(tmp_path, monkeypatch):
    """A run rotating out a checkpoint while the page reads it: entries listed, then removed before the walk reached
    them (this ``os.scandir`` removes them just after a listing): a log file before its ``lstat``, a checkpoint
    folder after its ``lstat`` but before its own listing."""
    run = tmp_path / "run"
    write_bytes(run / "checkpoints" / "5" / "weights", 400_000)
    write_bytes(run / "checkpoints" / "10" / "weights", 400_000)
    write_bytes(run / "old.log", 400_000)
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


def a_checkpoint(run: Path, step: int, *, size: int = 200_000) -> Path:
    folder = run / "checkpoints" / str(step)
    write_bytes(folder / "state" / "ocdbt.process_0" / "d" / "data", size)
    write_bytes(folder / "_CHECKPOINT_METADATA", 300)
    return folder


def steps(path: str) -> bool:
    return Path(path).parent.name == "checkpoints"


def counting_listings(monkeypatch) -> list[str]:
    """The folders ``os.scandir`` lists from here on (the real listing: only counted)."""
    listed, calls = os.scandir, []

    def scandir(path):
        calls.append(str(path))
        return listed(path)

    monkeypatch.setattr(os, "scandir", scandir)
    return calls


def test_a_sealed_folder_is_walked_once_for_each_stamp_it_has(tmp_path, monkeypatch):
    """A checkpoint folder is written elsewhere and renamed into place: its sum is kept, and the Storage page of a
    project of hundreds of runs lists each checkpoint's tree once, not on every load."""
    run = tmp_path / "run"
    a_checkpoint(run, 10)
    first = folder_usage(run, sealed=steps)
    listings = counting_listings(monkeypatch)
    again = folder_usage(run, sealed=steps)
    assert again == first and first.bytes == du_bytes(run)
    assert not any("state" in folder for folder in listings)  # the step's own tree was not listed again


def test_a_sealed_folder_replaced_or_changed_is_walked_again(tmp_path):
    run = tmp_path / "run"
    a_checkpoint(run, 10)
    folder_usage(run, sealed=steps)
    staging = a_checkpoint(tmp_path / "staging", 10, size=900_000)
    shutil.rmtree(run / "checkpoints" / "10")
    staging.rename(run / "checkpoints" / "10")  # another inode in its place
    assert folder_usage(run, sealed=steps).bytes == du_bytes(run)
    write_bytes(run / "checkpoints" / "10" / "added-later", 500_000)  # its own entries changed: another mtime
    assert folder_usage(run, sealed=steps).bytes == du_bytes(run)


def test_a_sealed_folder_being_written_into_is_not_kept(tmp_path):
    """An export's serving copy is written into ``.quantized.writing-…`` inside it, then renamed: until then the
    export's stamp stays as files land in the staging folder, so its sum must not be kept."""
    export = tmp_path / "run" / "export"
    write_bytes(export / "model.safetensors", 100_000)
    staging = export / ".quantized.writing-ab12"
    write_bytes(staging / "part-1", 100_000)
    sealed = lambda path: Path(path).name == "export"  # noqa: E731
    assert folder_usage(tmp_path / "run", sealed=sealed).bytes == du_bytes(tmp_path / "run")
    write_bytes(staging / "part-2", 300_000)
    assert folder_usage(tmp_path / "run", sealed=sealed).bytes == du_bytes(tmp_path / "run")


def test_hard_links_in_a_sealed_folder_still_count_once_across_folders(tmp_path):
    weights = write_bytes(tmp_path / "a" / "checkpoints" / "1" / "weights", 500_000)
    os.link(weights, write_bytes(tmp_path / "b" / "placeholder", 1).parent / "weights")
    for _ in range(2):  # walked, then from what was kept
        seen: set = set()
        together = (folder_usage(tmp_path / "a", seen=seen, sealed=steps).bytes
                    + folder_usage(tmp_path / "b", seen=seen, sealed=steps).bytes)
        assert together == du_bytes(tmp_path / "a", tmp_path / "b")
