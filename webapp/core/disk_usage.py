"""How much disk a folder takes, as ``du`` counts it: the Storage page's and API's one measure.

Design note. A file's size (``st_size``) is not what it costs the disk: a sparse file (orbax preallocates) takes
less, a small file a whole block. So each entry counts ``st_blocks * 512``, directories included, as ``du`` does.
Symbolic links are never followed (a model linked in from elsewhere is not this folder's disk), an inode with
several hard links is counted once (``seen``, which callers share across folders so that a project's total counts it
once too), and the walk is made for folders being written meanwhile: a run rotating out its checkpoints, an export
renamed into place. A file or folder that vanishes between its listing and its ``stat`` counts 0, and a root that is
no longer there is reported ``gone``. ``os.scandir`` by hand rather than ``os.walk``: it keeps the listing's
``lstat`` in the entry and lets each top-level entry be summed apart (``FolderUsage.children``), which is how a
run's checkpoints, exports and the rest are told apart without walking it twice.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

BLOCK = 512  # st_blocks is in 512-byte units on Linux and macOS, whatever the filesystem's block size


@dataclass(frozen=True)
class FolderUsage:
    """``bytes``: the disk the folder takes, its own entry included; ``children``: each top-level entry's share of
    it by name (the root's own blocks are in ``bytes`` only); ``gone``: there was nothing at the path."""
    bytes: int
    children: dict[str, int] = field(default_factory=dict)
    gone: bool = False


def folder_usage(path: str | os.PathLike, *, seen: set[tuple[int, int]] | None = None) -> FolderUsage:
    """The disk usage of ``path`` (a folder, or a file), walked without following links. ``seen`` holds the
    (device, inode) of the multiply-linked files counted already; pass one set to several calls to count each once
    across all of them."""
    seen = set() if seen is None else seen
    try:
        status = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return FolderUsage(0, gone=True)
    own = _entry_bytes(status, seen)
    if not stat.S_ISDIR(status.st_mode):
        return FolderUsage(own)
    children = {}
    for entry in _listing(path):
        entry_status = _lstat(entry)
        if entry_status is None:
            continue
        size = _entry_bytes(entry_status, seen)
        if stat.S_ISDIR(entry_status.st_mode):
            size += _tree_bytes(entry.path, seen)
        children[entry.name] = size
    return FolderUsage(own + sum(children.values()), children)


def _tree_bytes(folder: str, seen: set[tuple[int, int]]) -> int:
    """The bytes of everything under ``folder`` (not its own entry), depth first with a stack: checkpoint trees are
    deep enough that recursion would cost more than the walk."""
    total, folders = 0, [folder]
    while folders:
        for entry in _listing(folders.pop()):
            entry_status = _lstat(entry)
            if entry_status is None:
                continue
            total += _entry_bytes(entry_status, seen)
            if stat.S_ISDIR(entry_status.st_mode):
                folders.append(entry.path)
    return total


def _listing(folder: str | os.PathLike) -> list[os.DirEntry]:
    # A folder removed (or made unreadable) after its parent listed it holds nothing to count.
    try:
        with os.scandir(folder) as entries:
            return list(entries)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []


def _lstat(entry: os.DirEntry) -> os.stat_result | None:
    try:
        return entry.stat(follow_symlinks=False)
    except FileNotFoundError:  # removed after the listing: a checkpoint rotated out as we read
        return None


def _entry_bytes(status: os.stat_result, seen: set[tuple[int, int]]) -> int:
    if status.st_nlink > 1 and not stat.S_ISDIR(status.st_mode):
        inode = (status.st_dev, status.st_ino)
        if inode in seen:
            return 0
        seen.add(inode)
    return status.st_blocks * BLOCK
