"""A run's training checkpoints as folders on disk (``checkpoints/<step>/``, orbax's layout), judged from their files
alone: no jax, no orbax, so that the web process (which never imports them) can tell before it queues a resume
whether the checkpoint the engine would restore is whole, in the words the engine fails in when it is not
(``trainer.Checkpoints._read``)."""
from __future__ import annotations

import json
import os
from pathlib import Path

# Orbax's record of a save, in each step folder: the items it saved ("state", "meta", "extra").
STEP_METADATA_FILE = "_CHECKPOINT_METADATA"
# The data folder of an OCDBT array store (an item's, and each process's): a save or a copy that stopped leaves it
# empty, or with a file cut to nothing; tensorstore then fails the restore (``trainer._is_missing_data``).
ARRAY_DATA_FOLDER = "d"


def incomplete_checkpoint_message(step_dir: Path) -> str:
    """What the engine says of the checkpoint folder ``step_dir`` it cannot read."""
    return (f"{step_dir}: checkpoint {step_dir.name} cannot be read (it is incomplete: a save or a copy that stopped "
            "part way); move it out of checkpoints/ to go on from the one before")


def checkpoint_folder_incomplete(step_dir: Path) -> bool:
    """Whether the checkpoint folder ``step_dir`` lacks what a restore reads, as far as its files tell: it holds no
    file (made by hand, a copy that stopped before its first), an item orbax's record names is missing or holds no
    file, or an array store's data folder is empty or holds a file cut to nothing. A store missing some of its data
    files among others is found only by reading it, as the engine's restore does."""
    record = step_dir / STEP_METADATA_FILE
    if record.is_file():
        try:
            items = json.loads(record.read_text()).get("item_handlers") or {}
        except (OSError, ValueError, AttributeError):
            return True
        if any(not _holds_a_file(step_dir / item) for item in items):
            return True
    elif not _holds_a_file(step_dir):
        return True
    for folder, _subfolders, files in os.walk(step_dir):
        if Path(folder).name == ARRAY_DATA_FOLDER and (
                not files or any(_size(Path(folder) / name) == 0 for name in files)):
            return True
    return False


def _holds_a_file(folder: Path) -> bool:
    return any(files for _folder, _subfolders, files in os.walk(folder))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # removed as it was looked at
        return 0
