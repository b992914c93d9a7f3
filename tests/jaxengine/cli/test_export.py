"""``jaxengine export``: flags that cannot apply are refused before any checkpoint is read."""
import pytest

from jaxengine.cli import main


@pytest.mark.parametrize("flags, message", [
    (["--group-size", "32"], "--group-size sets the quantized copy's groups; give --quantize int8 or int4 with it"),
    (["--quantize", "int8", "--eval-limit", "-3"], "--eval-limit must be 0 (no scoring) or more, got -3"),
], ids=["group size without quantize", "negative eval limit"])
def test_it_rejects_flags_that_cannot_apply(tmp_path, capsys, flags, message):
    assert main(["export", "--run", str(tmp_path), *flags]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"jaxengine export: error: {message}\n"
