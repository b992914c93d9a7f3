"""README.md's Python examples of the engine run as written, on a tiny model directory in place of their paths."""
import re
from pathlib import Path

import pytest

from tests import factories

README = Path(__file__).resolve().parents[2] / "README.md"


def python_example(marker: str) -> str:
    """The README's one ```python block that contains ``marker``."""
    [block] = [block for block in re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
               if marker in block]
    return block


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return factories.build_tiny_model_dir(tmp_path_factory.mktemp("readme-model"))


def test_the_batch_decoder_example_runs(model_dir, capsys):
    """It passed on_token=lambda row, token_id, delta, which BatchDecoder.run does not take (a TypeError):
    its callback is on_tokens, given the token ids one read of the device brought."""
    example = python_example("BatchDecoder(").replace('"runs/run_x/export/quantized"', repr(str(model_dir)))
    namespace = {"prompt_id_lists": [[1, 2, 3], [4, 5]]}
    exec(example, namespace)
    assert [result.finish_reason for result in namespace["results"]] != []
    assert all(result.finish_reason in ("stop", "length") for result in namespace["results"])
    assert capsys.readouterr().out != ""


def test_the_sampler_example_runs(model_dir):
    example = python_example("Sampler(model, tokenizer)").replace('"path/to/model"', repr(str(model_dir)))
    namespace = {}
    exec(example, namespace)
    assert namespace["out"].finish_reason in ("stop", "length")
