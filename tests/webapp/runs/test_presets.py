"""Every preset of every task is a valid spec for the engine (with a model and data filled in)."""
import pytest

from jaxengine.spec import parse_spec
from webapp.runs.presets import PRESETS, preset_spec
from webapp.runs.specform import tasks


@pytest.mark.parametrize("task", tasks())
def test_every_preset_is_a_valid_spec(task):
    for preset in PRESETS.get(task, []) or [None]:
        spec = preset_spec(task, preset["name"] if preset else None)
        spec = {**spec, "model": "/models/m", "output_dir": "/runs/r",
                "data": {**spec.get("data", {}), "train": "/data/train.jsonl"}}
        spec.setdefault("train", {"max_steps": 1})
        parse_spec(spec)  # raises SpecError naming the key
