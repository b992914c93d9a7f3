"""What ``stat`` says of a few named files of a directory, remembered for a few seconds.

The chat list, the arena and ``/v1/models`` look at every model of the project on each load: its tokenizer and
template files (is the Thinking switch offered, which variables are) and its serving copy's ``quantization.json``.
What is read from those files is kept under their stamp (``stamp``), so an unchanged model costs no read and no parse;
the stamp itself is kept per directory and taken again once it is ``TEMPER_MODEL_FILES_RECHECK_SECONDS`` old, so a
load of a project of hundreds of models makes no ``stat`` call either. A model written anew is seen at most that many
seconds later. One mechanism for both kinds of file (``webapp.chat.selectors``, ``webapp.runs.serving_copies``).
"""
from __future__ import annotations

import time
from pathlib import Path

from django.conf import settings

FileStamp = tuple[int, int, int, int] | None  # (inode, mtime ns, ctime ns, size); None where the file is missing

# (directory, names) -> (monotonic time taken, stamps). An entry is a path and a few numbers per model, unbounded
# as the Thinking switch's cache is: a new one comes only with a new model directory.
_taken: dict[tuple[str, tuple[str, ...]], tuple[float, tuple[FileStamp, ...]]] = {}


def stamp(directory: str | Path, names: tuple[str, ...]) -> tuple[FileStamp, ...]:
    """Each of ``names`` in ``directory`` as ``stat`` has it: inode, modification and change times, size (a file
    renamed over the old one with its source's time kept, as rsync -a and download tools write, has another inode
    or change time), or None where it cannot be read. Taken anew once the one kept is older than the setting."""
    key = (str(directory), names)
    now = time.monotonic()
    kept = _taken.get(key)
    if kept is not None and now - kept[0] < settings.TEMPER_MODEL_FILES_RECHECK_SECONDS:
        return kept[1]
    stamps = tuple(_file_stamp(Path(directory) / name) for name in names)
    _taken[key] = (now, stamps)
    return stamps


def _file_stamp(path: Path) -> FileStamp:
    try:
        status = path.stat()
    except OSError:
        return None
    return (status.st_ino, status.st_mtime_ns, status.st_ctime_ns, status.st_size)
