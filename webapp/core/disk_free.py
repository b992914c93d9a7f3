"""Free space on the disks Temper writes to: said before it bites.

Design note. A run that fills the data directory's disk dies mid-checkpoint, and an upload fails half-written; so
the Storage page, its API answer and the Workers page say the free and total space of the filesystem holding
``TEMPER_DATA`` (and of ``TEMPER_MODELS_ROOT``'s when it is another one), every signed-in page shows a banner when it
runs low (``low_filesystems``), a launch warns when its run would not fit (``webapp.runs.services``), and an upload
larger than the room left is refused before its body is written (``upload_room_refusal``). ``statvfs`` is cheap but
the banner asks on every page: each path's answer is kept ``KEPT_SECONDS`` per process, short enough that a disk
freed or filled shows within moments.

The banner's threshold, unless ``TEMPER_DISK_WARN_FREE_BYTES`` sets one, is 5 GiB (a checkpoint or an export of a
few-billion-parameter model, the next write likely to fail) or 5 % of the filesystem, whichever is smaller: on a small
disk 5 GiB is most of it, and a banner that never goes away is one nobody reads (ext4 keeps 5 % for root for the same
reason). A threshold an administrator sets is taken as it is, above 5 % too.
"""
from __future__ import annotations

import errno
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from shutil import disk_usage

from django.conf import settings
from django.template.defaultfilters import filesizeformat

KEPT_SECONDS = 5.0
# The banner's threshold when TEMPER_DISK_WARN_FREE_BYTES is unset: the smaller of these.
DEFAULT_WARN_FREE_BYTES = 5 * 1024**3
WARN_FRACTION = 0.05  # of the filesystem's size
# Room an upload leaves on the disk it is refused for taking: the database, logs and the runs' next writes go on.
UPLOAD_MARGIN_BYTES = 256 * 1024**2
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
FREE_SPACE_REMEDY = ("nothing was saved: ask an administrator to free space (a project's Storage page shows what its "
                     "runs, datasets and models take), then send it again")


@dataclass(frozen=True, kw_only=True)
class DiskSpace:
    """The filesystem holding the folder of ``setting`` (TEMPER_DATA, TEMPER_MODELS_ROOT): its free and total bytes."""

    setting: str
    free_bytes: int
    filesystem_bytes: int

    @property
    def warn_below_bytes(self) -> int:
        configured = settings.TEMPER_DISK_WARN_FREE_BYTES
        if configured is not None:
            return configured
        return min(DEFAULT_WARN_FREE_BYTES, int(self.filesystem_bytes * WARN_FRACTION))

    @property
    def low(self) -> bool:
        return self.free_bytes < self.warn_below_bytes


_kept: dict[str, tuple[float, int, int]] = {}
_kept_spaces: dict[str, tuple[float, tuple[DiskSpace, ...]]] = {}
_kept_lock = threading.Lock()


def free_and_total(path: str | os.PathLike) -> tuple[int, int]:
    """``shutil.disk_usage(path)``'s free (for an unprivileged writer) and total bytes, kept ``KEPT_SECONDS``. A path
    not made yet (a fresh data directory) is measured at its nearest existing parent, the disk it will be made on."""
    key = str(path)
    now = time.monotonic()
    with _kept_lock:
        kept = _kept.get(key)
    if kept is not None and now - kept[0] < KEPT_SECONDS:
        return kept[1], kept[2]
    usage = disk_usage(_existing(Path(path)))
    with _kept_lock:
        _kept[key] = (now, usage.free, usage.total)
    return usage.free, usage.total


def forget_kept() -> None:
    """Drop every kept answer (a test that changes the disk under a path, or the settings)."""
    with _kept_lock:
        _kept.clear()
        _kept_spaces.clear()


def _existing(path: Path) -> Path:
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def data_filesystems() -> list[DiskSpace]:
    """The filesystem of ``TEMPER_DATA``, and ``TEMPER_MODELS_ROOT``'s when that is another one (a shared models
    mount): its own free space, as uploads of base models unpack there. Kept ``KEPT_SECONDS`` whole, the devices'
    ``stat`` calls with the free space: the banner asks on every page, which otherwise stats nothing on disk for a
    page whose files' stamps are fresh (``webapp.core.file_stamps``)."""
    key = f"filesystems:{settings.DATA_ROOT}:{settings.MODELS_ROOT}"
    now = time.monotonic()
    with _kept_lock:
        kept = _kept_spaces.get(key)
    if kept is not None and now - kept[0] < KEPT_SECONDS:
        return list(kept[1])
    spaces = _measured_filesystems()
    with _kept_lock:
        _kept_spaces[key] = (now, tuple(spaces))
    return spaces


def _measured_filesystems() -> list[DiskSpace]:
    places = [("TEMPER_DATA", Path(settings.DATA_ROOT)), ("TEMPER_MODELS_ROOT", Path(settings.MODELS_ROOT))]
    spaces, devices = [], set()
    for setting, path in places:
        device = _device(path)
        if device in devices:
            continue
        devices.add(device)
        free, total = free_and_total(path)
        spaces.append(DiskSpace(setting=setting, free_bytes=free, filesystem_bytes=total))
    return spaces


def low_filesystems() -> list[DiskSpace]:
    """The data filesystems with less free space than their warning threshold (the banner's)."""
    if settings.TEMPER_DISK_WARN_FREE_BYTES == 0:
        return []
    return [space for space in data_filesystems() if space.low]


def is_disk_full(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS


def disk_full_message(path: str | os.PathLike) -> str:
    """What a write that failed for want of room says, with the free space now (measured afresh: the kept answer is
    from before the write filled the disk)."""
    free = disk_usage(_existing(Path(path))).free
    return f"the server's disk is full ({filesizeformat(free)} free); {FREE_SPACE_REMEDY}"


def upload_room_refusal(content_length: str | int | None, *, destination: str | os.PathLike,
                        unpacked: bool = False) -> str | None:
    """Why an upload whose request body is ``content_length`` bytes cannot be taken, before a byte of it is written;
    None when it fits, or its length is not given. Its bytes land three times at most: Django's ASGI handler spools
    the body to a temporary file, the multipart parser writes the file in it to another (``FILE_UPLOAD_TEMP_DIR``),
    and that one is renamed under ``destination`` (copied there when on another filesystem) or, an archive, unpacked
    there (``unpacked``). Each filesystem's share is held to its free space less ``UPLOAD_MARGIN_BYTES``."""
    try:
        length = int(content_length or 0)
    except (TypeError, ValueError):
        return None
    if length <= 0:
        return None
    spool = Path(tempfile.gettempdir())
    parsed = Path(settings.FILE_UPLOAD_TEMP_DIR or spool)
    writes = [(spool, length), (parsed, length)]
    if unpacked or _device(Path(destination)) != _device(parsed):  # else renamed into place: no more bytes
        writes.append((Path(destination), length))
    needs: dict[int, tuple[Path, int]] = {}  # by filesystem: a path on it, and the bytes written there
    for path, size in writes:
        measured, held = needs.get(_device(path), (path, 0))
        needs[_device(path)] = (measured, held + size)
    for path, need in needs.values():
        free, _total = free_and_total(path)
        if need > free - UPLOAD_MARGIN_BYTES:
            return (f"the upload ({filesizeformat(length)}) needs about {filesizeformat(need)} on the server's disk "
                    f"as it is received and stored, more than the room left there ({filesizeformat(free)} free, of "
                    f"which {filesizeformat(UPLOAD_MARGIN_BYTES)} is kept for the runs and the database); "
                    f"{FREE_SPACE_REMEDY}")
    return None


def _device(path: Path) -> int:
    return os.stat(_existing(path)).st_dev
