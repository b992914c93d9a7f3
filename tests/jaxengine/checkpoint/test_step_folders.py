"""A training checkpoint folder judged whole or incomplete from its files alone (``step_folders``), on the layout
orbax writes (``test_job`` checks the same judgement on folders the engine saved, and its restore failing on them)."""
import json
from pathlib import Path

import pytest

from jaxengine.checkpoint.step_folders import checkpoint_folder_incomplete, incomplete_checkpoint_message


def saved_like_orbax(step_dir: Path, items=("meta", "state")) -> Path:
    """A step folder as orbax leaves a finished save: its record naming the items, each item's files, and the
    state's OCDBT array stores with their data."""
    step_dir.mkdir(parents=True)
    (step_dir / "_CHECKPOINT_METADATA").write_text(json.dumps({"item_handlers": {item: "handler" for item in items}}))
    (step_dir / "commit_success.txt").write_text("ok")
    (step_dir / "meta").mkdir()
    (step_dir / "meta" / "metadata").write_text("{}")
    for store in ("state", "state/ocdbt.process_0"):
        (step_dir / store / "d").mkdir(parents=True)
        (step_dir / store / "manifest.ocdbt").write_bytes(b"manifest")
        (step_dir / store / "d" / "f56dfcd8").write_bytes(b"chunk")
    return step_dir


def test_a_finished_save_is_whole(tmp_path):
    assert not checkpoint_folder_incomplete(saved_like_orbax(tmp_path / "6"))


@pytest.mark.parametrize("damage", ["emptied", "item gone", "data deleted", "data cut to nothing", "record unreadable"])
def test_a_folder_missing_what_a_restore_reads_is_incomplete(tmp_path, damage):
    import shutil

    step_dir = saved_like_orbax(tmp_path / "6")
    if damage == "emptied":
        shutil.rmtree(step_dir)
        step_dir.mkdir()
        (step_dir / "state").mkdir()  # folders, no file
    elif damage == "item gone":
        shutil.rmtree(step_dir / "meta")
    elif damage == "data deleted":
        (step_dir / "state" / "ocdbt.process_0" / "d" / "f56dfcd8").unlink()
    elif damage == "data cut to nothing":
        (step_dir / "state" / "d" / "f56dfcd8").write_bytes(b"")
    else:
        (step_dir / "_CHECKPOINT_METADATA").write_text("{not json")
    assert checkpoint_folder_incomplete(step_dir)


def test_an_item_the_record_does_not_name_is_not_asked_for(tmp_path):
    """A checkpoint saved without host arrays has no ``extra`` item: it is whole."""
    step_dir = saved_like_orbax(tmp_path / "6")
    assert not (step_dir / "extra").exists() and not checkpoint_folder_incomplete(step_dir)
    step_dir = saved_like_orbax(tmp_path / "7", items=("meta", "state", "extra"))
    assert checkpoint_folder_incomplete(step_dir)


def test_the_engines_words_name_the_folder_and_its_step(tmp_path):
    assert incomplete_checkpoint_message(tmp_path / "checkpoints" / "6") == (
        f"{tmp_path / 'checkpoints' / '6'}: checkpoint 6 cannot be read (it is incomplete: a save or a copy that "
        "stopped part way); move it out of checkpoints/ to go on from the one before")
