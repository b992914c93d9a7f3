"""``jaxengine export``: flags that cannot apply are refused before any checkpoint is read, and a run
finds the model it was trained from."""
import json
from pathlib import Path

import pytest

from jaxengine.cli import main
from jaxengine.job import export_run
from jaxengine.spec import load_spec


@pytest.mark.parametrize("flags, message", [
    (["--group-size", "32"], "--group-size sets the quantized copy's groups; give --quantize int8 or int4 with it"),
    (["--quantize", "int8", "--eval-limit", "-3"], "--eval-limit must be 0 (no scoring) or more, got -3"),
], ids=["group size without quantize", "negative eval limit"])
def test_it_rejects_flags_that_cannot_apply(tmp_path, capsys, flags, message):
    assert main(["export", "--run", str(tmp_path), *flags]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"jaxengine export: error: {message}\n"


SPEC = """task: sft
model: demo-tiny
output_dir: {run_dir}
data: {{train: sft.jsonl}}
train: {{max_steps: 2}}
"""


@pytest.mark.parametrize("make_checkpoint_dir", [False, True], ids=["no checkpoints directory", "an empty one"])
def test_it_rejects_a_run_that_saved_no_checkpoint_before_building_its_model(tmp_path, capsys, monkeypatch,
                                                                              make_checkpoint_dir):
    """QA: it built the spec's model first, so a run whose demo-tiny was not found (TEMPER_DEMO_DIR unset)
    was refused for its model, and one whose model loaded said only 'checkpoints: no checkpoints to restore',
    after creating that directory."""
    monkeypatch.delenv("TEMPER_DEMO_DIR", raising=False)
    monkeypatch.setenv("TEMPER_MODELS_ROOT", str(tmp_path / "no-models"))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "spec.yaml").write_text(SPEC.format(run_dir=run_dir))
    if make_checkpoint_dir:
        (run_dir / "checkpoints").mkdir()
    assert main(["export", "--run", str(run_dir)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"jaxengine export: error: --run {run_dir}: no checkpoint in {run_dir / 'checkpoints'}; "
                            f"train the run first (`jaxengine train {run_dir / 'spec.yaml'}`) and export it once "
                            "it has saved one\n")
    assert (run_dir / "checkpoints").exists() == make_checkpoint_dir


def test_it_rejects_a_run_directory_that_does_not_exist(tmp_path, capsys):
    assert main(["export", "--run", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err == (f"jaxengine export: error: --run {tmp_path / 'nope'}: no such directory; "
                                       "give the output_dir of a `jaxengine train` spec\n")


def test_a_run_of_the_demo_preset_exports_without_temper_demo_dir(demo_dir, tmp_path, capsys, monkeypatch):
    """QA: a run trained as ``model: demo-tiny`` with TEMPER_DEMO_DIR set could not be exported once it
    was unset: export looked the preset up again. The run's spec.yaml records the directory it resolved to."""
    monkeypatch.setenv("TEMPER_DEMO_DIR", str(demo_dir))
    monkeypatch.setenv("TEMPER_MODELS_ROOT", str(tmp_path / "no-models"))
    run_dir = tmp_path / "run"
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(SPEC.format(run_dir=run_dir).replace("sft.jsonl", str(demo_dir / "data/sft.jsonl")))
    assert main(["train", str(spec_path), "--no-progress"]) == 0
    assert load_spec(run_dir / "spec.yaml").model == str((demo_dir / "model").resolve())
    capsys.readouterr()

    monkeypatch.delenv("TEMPER_DEMO_DIR")
    assert main(["export", "--run", str(run_dir)]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["export"]["model"] == str(run_dir / "export")
    assert main(["train", str(spec_path), "--no-progress"]) == 2  # the spec itself still needs the variable
    assert "model: the demo-tiny preset is not built" in capsys.readouterr().err


def test_a_run_whose_model_directory_is_gone_is_named_with_its_spec(tmp_path, capsys):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "2").mkdir(parents=True)
    (run_dir / "spec.yaml").write_text(SPEC.format(run_dir=run_dir).replace("demo-tiny", str(tmp_path / "gone")))
    assert main(["export", "--run", str(run_dir)]) == 2
    assert capsys.readouterr().err == (
        f"jaxengine export: error: {run_dir / 'spec.yaml'}: model: '{tmp_path / 'gone'}': no such directory; give a "
        "Hugging Face-format model directory (holding config.json) or the preset demo-tiny\n")


def test_an_export_is_replaced_whole_and_a_failed_one_leaves_the_earlier_export(demo_dir, tmp_path, capsys,
                                                                                monkeypatch):
    """QA: an export was written into ``export/`` in place: one that failed part way (disk full, Ctrl-C)
    left a config.json beside no weights, and one of another step kept the earlier export's quantized
    serving copy, a copy of a different model. It is written beside ``export/`` and renamed into place."""
    from jaxengine.checkpoint import hf

    run_dir = tmp_path / "run"
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(SPEC.format(run_dir=run_dir).replace("demo-tiny", str(demo_dir / "model"))
                         .replace("sft.jsonl", str(demo_dir / "data/sft.jsonl"))
                         .replace("train: {max_steps: 2}", "train: {max_steps: 2, save_every: 1, batch_size: 2}"))
    assert main(["train", str(spec_path), "--no-progress"]) == 0
    export = run_dir / "export"
    weights = (export / "model.safetensors").read_bytes()
    (export / "quantized").mkdir()
    (export / "quantized" / "quantization.json").write_text("{}")  # a serving copy of step 2
    capsys.readouterr()

    def save_then_fail(model, config, out_dir, **kwargs):
        (Path(out_dir) / "config.json").write_text("{}")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hf, "save_hf_model", save_then_fail)
    with pytest.raises(OSError, match="No space left"):
        export_run(run_dir, step=1)
    assert (export / "model.safetensors").read_bytes() == weights and (export / "quantized").is_dir()
    assert json.loads((export / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert sorted(path.name for path in run_dir.iterdir()) == [
        "checkpoints", "export", "metrics.jsonl", "spec.yaml", "summary.json"]

    monkeypatch.undo()
    assert main(["export", "--run", str(run_dir), "--step", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["step"] == 1
    assert (export / "model.safetensors").read_bytes() != weights and not (export / "quantized").exists()
    assert sorted(path.name for path in run_dir.iterdir()) == [
        "checkpoints", "export", "metrics.jsonl", "spec.yaml", "summary.json"]


def test_it_rejects_a_run_path_that_is_a_file_as_a_file(tmp_path, capsys):
    """QA: ``--run`` naming a file (e.g. the run's spec.yaml) said 'no such directory'."""
    (tmp_path / "spec.yaml").write_text("task: sft\n")
    assert main(["export", "--run", str(tmp_path / "spec.yaml")]) == 2
    assert capsys.readouterr().err == (f"jaxengine export: error: --run {tmp_path / 'spec.yaml'}: a file, not a "
                                       "directory; give the output_dir of a `jaxengine train` spec\n")


def test_it_rejects_a_step_the_run_did_not_keep_naming_those_it_did(tmp_path, capsys, monkeypatch):
    """QA: `--step 99` built the run's model first and then said '<run>/checkpoints: no checkpoint for step 99;
    there are [2]' (a Python list, and no word of --step); a run whose model was not found said only that."""
    monkeypatch.delenv("TEMPER_DEMO_DIR", raising=False)
    monkeypatch.setenv("TEMPER_MODELS_ROOT", str(tmp_path / "no-models"))
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "spec.yaml").write_text(SPEC.format(run_dir=run_dir))
    for step in (10, 2):
        (run_dir / "checkpoints" / str(step)).mkdir()
    assert main(["export", "--run", str(run_dir), "--step", "5"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"jaxengine export: error: --step 5: {run_dir} kept no checkpoint of that step; its "
                            "checkpoints are at steps 2, 10: give one of them, or leave --step out for the latest "
                            "(10)\n")
    assert not (run_dir / "export").exists()


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_quantize_writes_the_serving_copy_of_the_export_and_prints_its_description(demo_dir, tmp_path, capsys,
                                                                                   scheme):
    """`jaxengine export --run DIR --quantize int8|int4` end to end (its parts were tested apart): the export, then
    its serving copy in export/quantized/, scored on the run's data.eval, both in the one printed object."""
    from jaxengine.quantize import is_quantized_dir

    run_dir = tmp_path / "run"
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(SPEC.format(run_dir=run_dir).replace("demo-tiny", str(demo_dir / "model"))
                         .replace("{train: sft.jsonl}", f"{{train: {demo_dir / 'data/sft.jsonl'}, "
                                                        f"eval: {demo_dir / 'data/eval.jsonl'}}}"))
    assert main(["train", str(spec_path), "--no-progress"]) == 0
    capsys.readouterr()
    groups = ["--group-size", "16"] if scheme == "int4" else []  # the micro model's width is 32: int4's 64 is refused
    assert main(["export", "--run", str(run_dir), "--quantize", scheme, *groups, "--eval-limit", "3"]) == 0, (
        capsys.readouterr().err)
    printed = json.loads(capsys.readouterr().out)
    assert printed["step"] == 2 and printed["export"]["model"] == str(run_dir / "export")
    quantized = printed["quantized"]
    assert quantized["scheme"] == scheme and quantized["source"] == str(run_dir / "export")
    assert quantized["group_size"] == (16 if scheme == "int4" else None)
    assert quantized["eval_sequences"] == 3 and 0.0 <= quantized["greedy_agreement"] <= 1.0
    assert quantized["ratio_to_bfloat16"] < 1.0  # smaller than the model in bfloat16
    assert is_quantized_dir(run_dir / "export" / "quantized")


@pytest.mark.parametrize(("flags", "message"), [
    ([], "--group-size: int4's default of 64 (no --group-size was given) does not divide a projection's input width "
         "32; give --group-size with a size that divides every hidden and intermediate size"),
    (["--group-size", "24"], "--group-size: 24 does not divide a projection's input width 64; give --group-size with "
                             "a size that divides every hidden and intermediate size"),
], ids=["the default", "given"])
def test_a_group_size_the_model_does_not_divide_is_named_as_the_flag(demo_dir, tmp_path, capsys, flags, message):
    """The micro model is 32 wide: int4's default groups of 64 were refused as 'quantize group_size: 64', a setting
    the command line does not have, though no size had been given."""
    run_dir = tmp_path / "run"
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(SPEC.format(run_dir=run_dir).replace("demo-tiny", str(demo_dir / "model"))
                         .replace("sft.jsonl", str(demo_dir / "data/sft.jsonl")))
    assert main(["train", str(spec_path), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["export", "--run", str(run_dir), "--quantize", "int4", *flags, "--eval-limit", "0"]) == 2
    assert capsys.readouterr().err == f"jaxengine export: error: {message}\n"
    assert not (run_dir / "export" / "quantized").exists()
