"""How much disk a folder takes, as ``du`` counts it: the Storage page's and API's one measure.

Design note. A file's size (``st_size``) is not what it costs the disk: a sparse file (orbax preallocates) takes
less, a small file a whole block. So each entry counts ``st_blocks * 512``, directories included, as ``du`` does.
Symbolic links are never followed (a model linked in from elsewhere is not this folder's disk), an inode with
several hard links is counted once (``seen``, which callers share across folders so that a project's total counts it
once too), and the walk is made for folders being written meanwhile: a run rotating out its checkpoints, an export
renamed into place. A file or folder that vanishes between its listing and its ``stat`` counts 0, and a root that is
no longer there is reported ``gone``. ``os.scandir`` by hand rather than ``os.walk``: it keeps the listing's
``lstat`` in the entry and lets each top-level entry be summed apart (``FolderUsage.children``), which is how a
run's checkpoints, exports and the rest are told apart without walking it twice. A folder the caller names sealed
(written whole elsewhere and renamed into place, as orbax's checkpoints and the engine's exports are) keeps its sum
under its stamp, so a page over hundreds of runs stats each checkpoint once rather than every file in it each time.
"""
from __future__ import annotations

import os
import stat
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

BLOCK = 512  # st_blocks is in 512-byte units on Linux and macOS, whatever the filesystem's block size


@dataclass(frozen=True)
class FolderUsage:
    """``bytes``: the disk the folder takes, its own entry included; ``children``: each top-level entry's share of
    it by name (the root's own blocks are in ``bytes`` only); ``gone``: there was nothing at the path."""
    bytes: int
    children: dict[str, int] = field(default_factory=dict)
    gone: bool = False


def folder_usage(path: str | os.PathLike, *, seen: set[tuple[int, int]] | None = None,
                 sealed: Callable[[str], bool] | None = None) -> FolderUsage:
    """The disk usage of ``path`` (a folder, or a file), walked without following links. ``seen`` holds the
    (device, inode) of the multiply-linked files counted already; pass one set to several calls to count each once
    across all of them. ``sealed(path)``: whether a folder under ``path`` is written whole elsewhere and renamed into
    place, never changed inside after (a checkpoint's step, an export): its sum is kept under its stamp
    (``_sealed_bytes``)."""
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
            size += _folder_bytes(entry.path, entry_status, seen, sealed)
        children[entry.name] = size
    return FolderUsage(own + sum(children.values()), children)


def _folder_bytes(folder: str, status: os.stat_result, seen: set[tuple[int, int]],
                  sealed: Callable[[str], bool] | None) -> int:
    if sealed is not None and sealed(folder):
        return _sealed_bytes(folder, status, seen)
    return _tree_bytes(folder, seen, sealed)


def _tree_bytes(folder: str, seen: set[tuple[int, int]], sealed: Callable[[str], bool] | None,
                hidden: list[str] | None = None) -> int:
    """The bytes of everything under ``folder`` (not its own entry), depth first with a stack (no recursion limit to
    meet, however deep the tree). ``hidden`` collects the paths of entries whose names start with a dot."""
    total, folders = 0, [folder]
    while folders:
        for entry in _listing(folders.pop()):
            entry_status = _lstat(entry)
            if entry_status is None:
                continue
            if hidden is not None and entry.name.startswith("."):
                hidden.append(entry.path)
            total += _entry_bytes(entry_status, seen)
            if not stat.S_ISDIR(entry_status.st_mode):
                continue
            if sealed is not None and sealed(entry.path):
                total += _sealed_bytes(entry.path, entry_status, seen)
            else:
                folders.append(entry.path)
    return total


# A sealed folder's sum by path: (its stamp, bytes), or (stamp, None) for one holding hard links, which is walked
# each time so that they count once against the caller's other folders. A stamp is the folder's device, inode,
# modification and change times: a folder renamed into place is another inode, one whose entries change another
# time. At most SEALED_KEPT (a project of 1,000 runs of 20 checkpoints and their exports), the oldest read dropped.
SEALED_KEPT = 50_000
_sealed: OrderedDict[str, tuple[tuple[int, ...], int | None]] = OrderedDict()
_sealed_lock = threading.Lock()


def _sealed_bytes(folder: str, status: os.stat_result, seen: set[tuple[int, int]]) -> int:
    """The bytes under the sealed ``folder``, walked once for each stamp it has. Not kept while it holds a hidden
    entry: something is being written into it (a serving copy's ``.quantized.writing-…`` inside an export), which
    renames into place, changing the stamp, only once whole."""
    stamp = (status.st_dev, status.st_ino, status.st_mtime_ns, status.st_ctime_ns)
    with _sealed_lock:
        kept = _sealed.get(folder)
        fresh = kept is not None and kept[0] == stamp
        if fresh:
            _sealed.move_to_end(folder)
    if fresh:
        total = kept[1]
    else:
        linked: set[tuple[int, int]] = set()
        hidden: list[str] = []
        total = _tree_bytes(folder, linked, None, hidden)
        if linked:
            total = None
        if not hidden:
            _keep(folder, stamp, total)
    # Hard links count once against the caller's other folders: such a folder is walked with its ``seen``, each time.
    return _tree_bytes(folder, seen, None) if total is None else total


def _keep(folder: str, stamp: tuple[int, ...], total: int | None) -> None:
    with _sealed_lock:
        _sealed[folder] = (stamp, total)
        _sealed.move_to_end(folder)
        while len(_sealed) > SEALED_KEPT:
            _sealed.popitem(last=False)


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
