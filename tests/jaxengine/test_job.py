"""Jobs from specs, end to end on a micro demo build: SFT with LoRA and DPO write a complete run directory."""
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from jaxengine.checkpoint.hf import load_hf_model
from jaxengine.checkpoint.step_folders import checkpoint_folder_incomplete
from jaxengine.cli import main
from jaxengine.evaluate import answers_match
from jaxengine.job import (JobError, RunLogOnce, RunLogWarning, data_cut_warnings, job_identity, refuse_another_jobs_directory,
                           resolve_model_dir, run_job, spec_as_run)
from jaxengine.spec import dump_spec, load_spec
from jaxengine.spec import parse_spec


def spec_for(demo_dir, run_dir, **overrides):
    spec = {
        "task": "sft", "model": str(demo_dir / "model"), "output_dir": str(run_dir),
        "data": {"train": str(demo_dir / "data/sft.jsonl"), "eval": str(demo_dir / "data/eval.jsonl"),
                 "max_seq_len": 64},
        "peft": {"method": "lora", "rank": 4, "alpha": 8, "targets": ["q_proj", "v_proj"]},
        "optim": {"learning_rate": 1e-2, "warmup_steps": 1},
        "train": {"max_steps": 4, "batch_size": 4, "eval_every": 4, "eval_samples": 3, "sample_max_new_tokens": 6},
    }
    spec.update(overrides)
    return parse_spec(spec)


def test_demo_build_writes_a_loadable_model_and_the_datasets(demo_dir):
    summary = json.loads((demo_dir / "demo.json").read_text())
    assert summary["steps"] == 3 and summary["datasets"]["eval"] == 8
    model, config = load_hf_model(demo_dir / "model")
    assert config.family == "llama" and config.num_layers == 2
    for name in ("sft", "preference", "prompts", "eval"):
        assert (demo_dir / "data" / f"{name}.jsonl").stat().st_size > 0
    assert (demo_dir / "model" / "tokenizer.model").is_file()


def test_pretrain_on_a_text_file_trains_every_token_but_each_texts_first_and_exports(demo_dir, tmp_path):
    """task: pretrain end to end (only the demo build's own loop pretrained before): next-token loss on raw text,
    packed, every token trained but the first of each text; no prompts, so no samples."""
    rows = [json.loads(line) for line in (demo_dir / "data/sft.jsonl").read_text().splitlines()[:200]]
    text = tmp_path / "text.jsonl"
    text.write_text("".join(json.dumps({"text": f"{row['prompt']} {row['completion']}"}) + "\n" for row in rows))
    spec = spec_for(demo_dir, tmp_path / "run", task="pretrain", peft={"method": "none"},
                    data={"train": str(text), "eval": str(text), "max_seq_len": 64, "packing": True},
                    optim={"learning_rate": 1e-2, "schedule": "constant"},
                    train={"max_steps": 8, "batch_size": 4, "eval_every": 4})
    summary = run_job(spec, progress_bar=False)
    assert summary["status"] == "succeeded" and summary["step"] == 8
    train = summary["data"]["train"]
    assert train["rows"] == 200 and train["loss_tokens"] == train["tokens"] - 200
    metrics = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, 9))
    assert metrics[-1]["eval/loss"] < metrics[3]["eval/loss"] < metrics[0]["loss"]
    assert not (tmp_path / "run/samples.jsonl").exists()
    _, config = load_hf_model(tmp_path / "run/export")
    assert config.family == "llama" and summary["export"] == {"model": str(tmp_path / "run/export")}


def test_sft_with_lora_writes_the_run_directory(demo_dir, tmp_path):
    summary = run_job(spec_for(demo_dir, tmp_path / "run"), progress_bar=False)
    run = tmp_path / "run"
    assert summary["status"] == "succeeded" and summary["step"] == 4
    assert summary["data"]["train"]["examples"] > 300 and summary["trainable_parameters"] < 5000
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert "eval/loss" in metrics[-1] and 0.0 <= metrics[-1]["eval/exact_match"] <= 1.0
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 3 and all(s["step"] == 4 and "answer" in s for s in samples)
    assert yaml.safe_load((run / "spec.yaml").read_text())["peft"]["rank"] == 4
    assert json.loads((run / "summary.json").read_text())["status"] == "succeeded"
    assert (run / "export/adapter/adapter_config.json").is_file()
    assert json.loads((run / "export/config.json").read_text())["dtype"] == "float32"  # the base's own
    exported, _ = load_hf_model(run / "export")  # merged weights, plain Hugging Face format
    base, _ = load_hf_model(demo_dir / "model")
    assert not np.allclose(exported.layers[0].self_attn.q_proj.kernel[...], base.layers[0].self_attn.q_proj.kernel[...])
    np.testing.assert_array_equal(exported.layers[0].self_attn.k_proj.kernel[...],
                                  base.layers[0].self_attn.k_proj.kernel[...])

    # `jaxengine export` rebuilds the same export from the checkpoint.
    shutil.rmtree(run / "export")
    assert main(["export", "--run", str(run)]) == 0
    again, _ = load_hf_model(run / "export")
    np.testing.assert_allclose(again.layers[0].self_attn.q_proj.kernel[...],
                               exported.layers[0].self_attn.q_proj.kernel[...], atol=1e-6)
    assert (run / "export/adapter/adapter_model.safetensors").is_file()


def test_a_bfloat16_base_is_exported_in_bfloat16_and_its_adapter_in_float32(demo_dir, tmp_path):
    import jax.numpy as jnp
    from safetensors import safe_open

    from jaxengine.checkpoint.hf import iter_hf_tensors, save_hf_model
    from jaxengine.job import build_job_model
    from jaxengine.peft.lora import merge_lora
    from jaxengine.trainer import restore_trained_model

    model, config = load_hf_model(demo_dir / "model")
    save_hf_model(model, config, tmp_path / "base", source_dir=demo_dir / "model", dtype=jnp.bfloat16)
    spec = spec_for(demo_dir, tmp_path / "run", model=str(tmp_path / "base"))
    assert run_job(spec, progress_bar=False)["status"] == "succeeded"
    export = tmp_path / "run" / "export"
    assert json.loads((export / "config.json").read_text())["dtype"] == "bfloat16"

    def stored(path):
        with safe_open(str(path), framework="numpy") as handle:
            return {name: handle.get_tensor(name) for name in handle.keys()}

    exported = stored(export / "model.safetensors")
    assert {str(array.dtype) for array in exported.values()} == {"bfloat16"}
    assert {str(array.dtype) for array in stored(export / "adapter/adapter_model.safetensors").values()} == {"float32"}
    # The float32 merge (the trainer's float32 weights), rounded to the nearest bfloat16.
    job_model = build_job_model(spec)
    trained, _ = restore_trained_model(job_model.model, trainable=job_model.trainable, optim=spec.optim,
                                       checkpoint_dir=tmp_path / "run" / "checkpoints")
    merge_lora(trained)
    merged = dict(iter_hf_tensors(trained))
    assert merged.keys() == exported.keys()
    for name, array in merged.items():
        assert array.dtype == np.float32
        np.testing.assert_array_equal(exported[name], array.astype(jnp.bfloat16), err_msg=name)


def test_lora_on_a_bfloat16_base_keeps_float32_adapters(demo_dir, tmp_path):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxengine.job import build_job_model
    from jaxengine.peft.lora import LoraParam

    spec = spec_for(demo_dir, tmp_path / "run", train={**spec_for(demo_dir, tmp_path).train.model_dump(),
                                                        "param_dtype": "bfloat16"})
    job_model = build_job_model(spec)
    base = {str(value.dtype) for value in jax.tree.leaves(nnx.state(job_model.model, nnx.Param))}
    adapters = {str(value.dtype) for value in jax.tree.leaves(nnx.state(job_model.model, LoraParam))}
    assert base == {"bfloat16"} and adapters == {"float32"}
    summary = run_job(spec, progress_bar=False)
    losses = [json.loads(line)["loss"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert summary["status"] == "succeeded" and len(losses) == 4 and all(np.isfinite(losses))
    assert json.loads((tmp_path / "run" / "export" / "config.json").read_text())["dtype"] == "bfloat16"
    # The float32 update survived the merge into the bfloat16 base: the adapted projection moved.
    exported, _ = load_hf_model(tmp_path / "run" / "export", param_dtype=jnp.bfloat16)
    base, _ = load_hf_model(demo_dir / "model", param_dtype=jnp.bfloat16)
    assert not np.array_equal(np.asarray(exported.layers[0].self_attn.q_proj.kernel[...]),
                              np.asarray(base.layers[0].self_attn.q_proj.kernel[...]))


def test_qlora_trains_on_quantized_base_weights_and_reports_their_memory(demo_dir, tmp_path):
    spec = spec_for(demo_dir, tmp_path / "q", peft={"method": "qlora", "rank": 4, "alpha": 8, "quant_bits": 4,
                                                    "group_size": 32},
                    data={"train": str(demo_dir / "data/sft.jsonl"), "max_seq_len": 64},
                    train={"max_steps": 2, "batch_size": 4})
    summary = run_job(spec, progress_bar=False)
    assert summary["status"] == "succeeded" and np.isfinite(summary["final_metrics"]["loss"])
    assert summary["quantization"]["ratio_to_bfloat16"] == pytest.approx((0.5 + 4 / 32) / 2)
    exported, _ = load_hf_model(tmp_path / "q/export")  # dequantized, merged, plain Hugging Face format
    assert exported.layers[0].self_attn.q_proj.kernel[...].dtype == np.float32


def test_dpo_full_fine_tuning_logs_the_preference_metrics(demo_dir, tmp_path):
    spec = spec_for(demo_dir, tmp_path / "dpo", task="dpo", peft={"method": "none"},
                    data={"train": str(demo_dir / "data/preference.jsonl"), "max_seq_len": 64},
                    train={"max_steps": 2, "batch_size": 4}, dpo={"beta": 0.1})
    summary = run_job(spec, progress_bar=False)
    assert summary["status"] == "succeeded"
    first = json.loads((tmp_path / "dpo/metrics.jsonl").read_text().splitlines()[0])
    assert abs(first["loss"] - np.log(2)) < 1e-4  # the policy starts as its own reference
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen",
                "logps/rejected"):
        assert key in first


def test_reward_with_lora_exports_a_model_that_scores_text(demo_dir, tmp_path):
    from jaxengine.data.pipeline import encode_rows, make_batch
    from jaxengine.tasks import load_reward_model
    from jaxengine.tokenizer import load_tokenizer

    spec = spec_for(demo_dir, tmp_path / "rm", task="reward",
                    data={"train": str(demo_dir / "data/preference.jsonl"), "max_seq_len": 64},
                    train={"max_steps": 2, "batch_size": 4})
    summary = run_job(spec, progress_bar=False)
    assert summary["status"] == "succeeded" and "accuracy" in summary["final_metrics"]
    reward_model = load_reward_model(tmp_path / "rm/export")
    pairs, _ = encode_rows([{"prompt": "What is 2 + 2?", "chosen": "4", "rejected": "5"}], task="reward",
                           tokenizer=load_tokenizer(demo_dir / "model"), max_seq_len=64)
    assert reward_model(make_batch(pairs, max_seq_len=64, pad_id=0).chosen).shape == (1,)


def test_cli_reports_an_invalid_spec_and_exits_2(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("task: sft\nmodel: m\noutput_dir: o\ndata: {train: t.jsonl}\ntrain: {max_steps: 1}\n"
                    "optim: {schedule: cosin}\n")
    assert main(["train", str(path)]) == 2
    assert f"{path}:6: optim.schedule: 'cosin' is not one of constant, linear, cosine" in capsys.readouterr().err


@pytest.mark.parametrize("key", ["train", "eval"])
def test_cli_names_a_missing_data_file_before_making_the_run(tmp_path, capsys, key):
    present = tmp_path / "present.jsonl"
    present.write_text('{"prompt": "a", "completion": "b"}\n')
    files = {"train": str(present), "eval": str(present), key: str(tmp_path / "missing.jsonl")}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"task": "sft", "model": "demo-tiny", "output_dir": str(tmp_path / "run"),
                                    "data": files, "train": {"max_steps": 1}}))
    assert main(["train", str(path), "--no-progress"]) == 2
    assert capsys.readouterr().err == f"{path}: data.{key}: {tmp_path / 'missing.jsonl'}: no such file\n"
    assert not (tmp_path / "run").exists()


def test_cli_warns_of_a_warmup_as_long_as_the_run_before_it_starts(tmp_path, capsys):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"task": "sft", "model": "demo-tiny", "output_dir": str(tmp_path / "run"),
                                    "data": {"train": str(tmp_path / "missing.jsonl")}, "train": {"max_steps": 20},
                                    "optim": {"warmup_steps": 20, "learning_rate": 2e-4}}))
    assert main(["train", str(path), "--no-progress"]) == 2  # the missing file, after the warning
    assert capsys.readouterr().err.splitlines()[0] == (
        f"{path}: warning: optim.warmup_steps: 20 is not below the run's 20 optimizer steps (train.max_steps), so "
        "the learning rate never reaches optim.learning_rate 0.0002: the run ends still warming up; give "
        "warmup_steps below 20 (a tenth of the steps is common) or train longer")


def test_an_unknown_model_is_named(tmp_path):
    with pytest.raises(JobError, match="^model: 'nope': no such directory; give a Hugging Face-format model "
                                       "directory \\(holding config.json\\) or the preset demo-tiny$"):
        resolve_model_dir("nope")
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(JobError, match="^model: '.*weights.bin': a file, not a directory; give a Hugging Face"):
        resolve_model_dir(str(tmp_path / "weights.bin"))


def test_a_quantized_serving_copy_is_named_as_one_when_given_as_the_model(tmp_path):
    """QA: ``model:`` naming a run's export/quantized/ said a tensor was missing and to check
    num_hidden_layers and tie_word_embeddings, as for a broken checkpoint."""
    from jaxengine import job, quantize

    assert job.QUANTIZATION_FILE == quantize.QUANTIZATION_FILE
    copy = tmp_path / "export" / "quantized"
    copy.mkdir(parents=True)
    (copy / "config.json").write_text("{}")
    (copy / "quantization.json").write_text(json.dumps({"format": "temper-quantized", "source": "/runs/x/export"}))
    with pytest.raises(JobError, match=f"^model: '{copy}' is a quantized serving copy \\(quantization.json\\), "
                                       "which is for serving only; train from the model it was made from: "
                                       "/runs/x/export$"):
        resolve_model_dir(str(copy))


def test_cli_refuses_a_model_or_data_it_cannot_read_before_making_the_run(demo_dir, tmp_path, capsys):
    """QA: a model path that does not exist left an empty output_dir behind (made before the model was
    looked for); a row of the wrong type in the data did too."""
    bad_row = tmp_path / "bad.jsonl"
    bad_row.write_text('{"prompt": 1, "completion": "b"}\n')
    for model, train, message in (
            (str(tmp_path / "no-model"), str(demo_dir / "data/sft.jsonl"),
             f"model: '{tmp_path / 'no-model'}': no such directory; give a Hugging Face-format model directory "
             "(holding config.json) or the preset demo-tiny"),
            (str(demo_dir / "model"), str(bad_row),
             f"{bad_row}: line 1, row 1, field 'prompt': must be a string, got a number: write it as text, in quotes (\"1\")")):
        path = tmp_path / "spec.yaml"
        path.write_text(yaml.safe_dump({"task": "sft", "model": model, "output_dir": str(tmp_path / "runs" / "run"),
                                        "data": {"train": train}, "train": {"max_steps": 1}}))
        assert main(["train", str(path), "--no-progress"]) == 2
        assert capsys.readouterr().err == f"{path}: {message}\n"
        assert not (tmp_path / "runs").exists()


CHAT_EVAL = ('{"messages": [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"}]}\n'
             '{"messages": [{"role": "user", "content": "What is 3 + 3?"}, {"role": "assistant", "content": "6"}]}\n'
             '{"messages": [{"role": "user", "content": "What is 1 + 3?"}, {"role": "bot", "content": "4"}]}\n')
PROMPTS_EVAL = ('{"prompt": "What is 2 + 2?", "answer": "4"}\n{"prompt": "What is 3 + 3?", "answer": "6"}\n'
                '{"prompt": "What is 1 + 3?", "answer": "4"\n')


@pytest.mark.parametrize(("content", "message"), [
    (CHAT_EVAL, "line 3, row 3, field 'messages[1].role': role is 'bot', another chat format's name; write it as "
                "'assistant'"),
    (PROMPTS_EVAL, "line 3, row 3: broken JSON at column 43: Expecting ',' delimiter; each line must be one JSON object"),
], ids=["sft chats", "prompts with answers"])
def test_cli_names_the_bad_row_of_an_sft_eval_file_of_either_kind_it_takes(demo_dir, tmp_path, capsys, content,
                                                                            message):
    """An sft run's data.eval is sft rows or prompts with answers: read as sft and, failing that, as prompts, a file
    of chats whose third row was bad was told the prompts reading's error, that its first row lacked a 'prompt'
    (and to upload it as a dataset of kind sft). The error of the kind that read further is the file's."""
    evaluation = tmp_path / "eval.jsonl"
    evaluation.write_text(content)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"task": "sft", "model": str(demo_dir / "model"), "output_dir": str(tmp_path / "run"),
                                    "data": {"train": str(demo_dir / "data/sft.jsonl"), "eval": str(evaluation)},
                                    "train": {"max_steps": 1}}))
    assert main(["train", str(path), "--no-progress"]) == 2
    assert capsys.readouterr().err == f"{path}: {evaluation}: {message}\n"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("where", ["the file", "below the file"])
def test_cli_refuses_an_output_dir_that_is_a_file_before_loading_anything(demo_dir, tmp_path, capsys, where):
    """QA: an output_dir naming a file (or a path below one) was a FileExistsError / NotADirectoryError
    traceback from the trainer's mkdir, after the model and the data had been read."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine\n")
    output_dir = a_file if where == "the file" else a_file / "run"
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"task": "sft", "model": str(demo_dir / "model"), "output_dir": str(output_dir),
                                    "data": {"train": str(demo_dir / "data/sft.jsonl")}, "train": {"max_steps": 1}}))
    assert main(["train", str(path), "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        f"{path}: output_dir: {output_dir}: {a_file} is a file, not a directory; give a directory for the run "
        "(a new path is made)\n")
    assert a_file.read_text() == "mine\n"


def test_cli_names_the_data_row_a_models_chat_template_refuses(demo_dir, tmp_path, capsys):
    """QA: a chat template that raises (here on a system turn, as Gemma's do) was a ChatTemplateError
    traceback from jaxengine train; it is one line naming the row, and nothing is left behind."""
    model = tmp_path / "model"
    shutil.copytree(demo_dir / "model", model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = ("{% for m in messages %}{% if m.role == 'system' %}"
                               "{{ raise_exception('System role not supported') }}{% endif %}"
                               "{{ m.role }}: {{ m.content }}\n{% endfor %}")
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    data = tmp_path / "chats.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}\n'
                    '{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "a"}, '
                    '{"role": "assistant", "content": "b"}]}\n')
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"task": "sft", "model": str(model), "output_dir": str(tmp_path / "run"),
                                    "data": {"train": str(data)}, "train": {"max_steps": 1}}))
    assert main(["train", str(path), "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        f"{path}: {data}: row 2: {model / 'tokenizer_config.json'}: chat template line 1: System role not supported; "
        "change the row or the model's chat template\n")
    assert not (tmp_path / "run").exists()


def trained_with_checkpoints(demo_dir, tmp_path):
    """(run directory, spec file, spec) of a 2-step SFT of the demo model that saved a checkpoint each step."""
    run_dir = tmp_path / "run"
    path = tmp_path / "spec.yaml"
    spec = {"task": "sft", "model": str(demo_dir / "model"), "output_dir": str(run_dir),
            "data": {"train": str(demo_dir / "data/sft.jsonl"), "max_seq_len": 64},
            "train": {"max_steps": 2, "batch_size": 2, "save_every": 1}}
    path.write_text(yaml.safe_dump(spec))
    assert main(["train", str(path), "--no-progress"]) == 0
    return run_dir, path, spec


def test_a_checkpoint_left_incomplete_is_named_by_train_and_export(demo_dir, tmp_path, capsys):
    """QA: a checkpoint directory without its items (a run directory copied part way, a save that stopped
    on a full disk) was a KeyError traceback from orbax ('Item "meta" was not found') on resume and export."""
    run_dir, path, spec = trained_with_checkpoints(demo_dir, tmp_path)
    (run_dir / "checkpoints" / "3").mkdir()
    # The web judges the folders by their files alone (no orbax there) before it offers Resume: as the engine does.
    assert not checkpoint_folder_incomplete(run_dir / "checkpoints" / "2")
    assert checkpoint_folder_incomplete(run_dir / "checkpoints" / "3")
    spec["train"]["max_steps"] = 4
    path.write_text(yaml.safe_dump(spec))
    capsys.readouterr()
    problem = (f"{run_dir / 'checkpoints' / '3'}: checkpoint 3 cannot be read (it is incomplete: a save or a copy "
               "that stopped part way); move it out of checkpoints/ to go on from the one before")
    assert main(["train", str(path), "--no-progress"]) == 2
    assert capsys.readouterr().err == f"{path}: {problem}\n"
    assert main(["export", "--run", str(run_dir)]) == 2
    assert capsys.readouterr().err == f"jaxengine export: error: {problem}\n"


def test_a_checkpoint_whose_array_files_are_gone_is_named_by_train(demo_dir, tmp_path, capfd):
    """QA: a checkpoint whose array data files were lost (deleted, or cut to nothing by a copy that stopped)
    was a tensorstore FAILED_PRECONDITION traceback ('Truncated Zstd-compressed stream') on resume."""
    run_dir, path, spec = trained_with_checkpoints(demo_dir, tmp_path)
    # The arrays' chunks (OCDBT data files of process 0); the database's manifest and index stay.
    data_files = list((run_dir / "checkpoints" / "2" / "state").glob("ocdbt.process_0/d/*"))
    assert data_files
    assert not checkpoint_folder_incomplete(run_dir / "checkpoints" / "2")
    for file in data_files:
        file.unlink()
    assert checkpoint_folder_incomplete(run_dir / "checkpoints" / "2")
    spec["train"]["max_steps"] = 4
    path.write_text(yaml.safe_dump(spec))
    capfd.readouterr()
    assert main(["train", str(path), "--no-progress"]) == 2
    assert capfd.readouterr().err == (
        f"{path}: {run_dir / 'checkpoints' / '2'}: checkpoint 2 cannot be read (it is incomplete: a save or a copy "
        "that stopped part way); move it out of checkpoints/ to go on from the one before\n")


def test_cli_refuses_data_the_models_vocabulary_does_not_cover(tiny_hf_model_dir, tmp_path, capsys):
    """QA: a model directory holding another model's tokenizer (403 tokens for a 256-token model) trained
    on token ids past its embedding, and the run failed at step 1 with 'loss is nan ... Lower
    optim.learning_rate', leaving a run directory; the row and the mismatch are named before it starts."""
    from tests import factories

    model = shutil.copytree(tiny_hf_model_dir("qwen2"), tmp_path / "model")
    factories.build_bpe_tokenizer_dir(tmp_path / "tokenizer", style="qwen")
    for path in (tmp_path / "tokenizer").iterdir():
        if path.name != "generation_config.json":
            shutil.copyfile(path, model / path.name)
    data = tmp_path / "sft.jsonl"
    data.write_text('{"prompt": "hello world", "completion": "the quick brown fox"}\n')
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"task": "sft", "model": str(model), "output_dir": str(tmp_path / "run"),
                                    "data": {"train": str(data), "max_seq_len": 64}, "train": {"max_steps": 1}}))
    capsys.readouterr()  # transformers' progress bar, saving the tiny model
    assert main(["train", str(path), "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"{path}: {data}: row 1: token id ") and error.count("\n") == 1
    assert error.endswith(" is outside the model's vocabulary (vocab_size=256 in its config.json): the "
                          "tokenizer is not the model's own; give the model directory its own tokenizer files\n")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("finished", [True, False], ids=["finished", "cancelled"])
def test_cli_warns_when_the_output_dir_is_past_the_specs_max_steps(demo_dir, tmp_path, capsys, finished):
    """QA: run again with a lower train.max_steps on an output_dir whose checkpoint was further on, the job
    trained nothing and exported (or kept) the later step's model, saying nothing of it (exit 0)."""
    run_dir = tmp_path / "run"
    path = tmp_path / "spec.yaml"
    spec = {"task": "sft", "model": str(demo_dir / "model"), "output_dir": str(run_dir),
            "data": {"train": str(demo_dir / "data/sft.jsonl"), "max_seq_len": 64},
            "train": {"max_steps": 3, "batch_size": 2, "save_every": 1}}
    path.write_text(yaml.safe_dump(spec))
    assert main(["train", str(path), "--no-progress"]) == 0
    if not finished:
        (run_dir / "summary.json").unlink()
    spec["train"]["max_steps"] = 2
    path.write_text(yaml.safe_dump(spec))
    capsys.readouterr()
    assert main(["train", str(path), "--no-progress"]) == 0
    assert capsys.readouterr().err == (
        f"{path}: resumed from step 3 with a changed setting: train.max_steps 3 -> 2\n"
        f"{path}: warning: output_dir {run_dir} is at step 3, past train.max_steps 2: nothing was trained and its "
        "model is the step-3 one; use a new output_dir to train 2 steps\n")


def test_a_run_killed_with_sigkill_resumes_to_the_same_metrics(demo_dir, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    def spec_dict(run_dir):
        spec = spec_for(demo_dir, run_dir, data={"train": str(demo_dir / "data/sft.jsonl"), "max_seq_len": 64},
                        train={"max_steps": 60, "batch_size": 4, "save_every": 5, "keep_last": 2})
        return spec.model_dump(mode="json")

    run_job(parse_spec(spec_dict(tmp_path / "straight")), progress_bar=False)
    spec_path = tmp_path / "killed.yaml"
    spec_path.write_text(yaml.safe_dump(spec_dict(tmp_path / "killed")))
    process = subprocess.Popen([sys.executable, "-m", "jaxengine", "train", str(spec_path), "--no-progress"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=os.environ.copy())
    deadline = time.monotonic() + 240
    while not (tmp_path / "killed/checkpoints/10").is_dir():
        assert process.poll() is None, process.stderr.read().decode()
        assert time.monotonic() < deadline, "no checkpoint at step 10 within 4 minutes"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (tmp_path / "killed/summary.json").exists(), "the run finished before it could be killed"

    summary = run_job(parse_spec(spec_dict(tmp_path / "killed")), progress_bar=False)
    assert summary["status"] == "succeeded" and summary["resumed_from_step"] >= 10
    straight = [json.loads(line) for line in (tmp_path / "straight/metrics.jsonl").read_text().splitlines()]
    resumed = [json.loads(line) for line in (tmp_path / "killed/metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in resumed] == list(range(1, 61))
    for before, after in zip(straight, resumed):
        for key in ("loss", "grad_norm", "learning_rate"):
            assert abs(before[key] - after[key]) <= 1e-5, (before["step"], key, before[key], after[key])


def test_eval_group_by_logs_exact_match_for_each_group(demo_dir, tmp_path):
    """data.eval_group_by: eval/exact_match/<task> for each task among the sampled eval rows, each the
    share of that task's samples whose text matches, and together (by count) eval/exact_match."""
    spec = spec_for(demo_dir, tmp_path / "run",
                    data={"train": str(demo_dir / "data/sft.jsonl"), "eval": str(demo_dir / "data/eval.jsonl"),
                          "max_seq_len": 64, "eval_group_by": "task"},
                    train={"max_steps": 2, "batch_size": 4, "eval_every": 2, "eval_samples": 8,
                           "sample_max_new_tokens": 4})
    assert run_job(spec, progress_bar=False)["status"] == "succeeded"
    final = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()][-1]
    task_of = {row["prompt"]: row["task"] for row in map(json.loads, (demo_dir / "data/eval.jsonl").open())}
    samples = [json.loads(line) for line in (tmp_path / "run/samples.jsonl").read_text().splitlines()]
    by_task: dict[str, list[bool]] = {}
    for sample, match in zip(samples, answers_match([sample["text"] for sample in samples], samples)):
        by_task.setdefault(task_of[sample["prompt"]], []).append(match)
    assert len(samples) == 8 and len(by_task) >= 2
    grouped = {key: value for key, value in final.items() if key.startswith("eval/exact_match/")}
    assert grouped == {f"eval/exact_match/{task}": pytest.approx(sum(hits) / len(hits))
                       for task, hits in by_task.items()}
    weighted = sum(grouped[f"eval/exact_match/{task}"] * len(hits) for task, hits in by_task.items()) / 8
    assert weighted == pytest.approx(final["eval/exact_match"])


def test_eval_group_by_a_column_a_row_lacks_fails_naming_the_row(demo_dir, tmp_path):
    rows = [json.loads(line) for line in (demo_dir / "data/eval.jsonl").open()][:4]
    del rows[2]["task"]
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    spec = spec_for(demo_dir, tmp_path / "run",
                    data={"train": str(demo_dir / "data/sft.jsonl"), "eval": str(eval_file), "max_seq_len": 64,
                          "eval_group_by": "task"})
    with pytest.raises(JobError, match=f"data.eval_group_by: row 3 of {eval_file} has no 'task' value to group by"):
        run_job(spec, progress_bar=False)


def test_eval_previews_longer_than_the_context_has_left_are_cut_to_fit(tmp_path):
    """QA: train.sample_max_new_tokens 100000 stopped a run at its first evaluation, steps in ('the longest
    prompt plus max_new_tokens exceeds the model's context length')."""
    from jaxengine.job import make_sample_hook
    from jaxengine.tokenizer import load_tokenizer
    from tests.factories import build_tiny_model_dir

    model_dir = build_tiny_model_dir(tmp_path / "tiny")
    model, _config = load_hf_model(model_dir)
    tokenizer = load_tokenizer(model_dir)
    hook = make_sample_hook(tokenizer=tokenizer, rows=[{"prompt": "Hello", "answer": "x"}],
                            samples_path=tmp_path / "samples.jsonl", max_new_tokens=100_000)
    metrics = hook(model, 3)
    [record] = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert record["step"] == 3 and record["prompt"] == "Hello" and metrics["eval/exact_match"] in (0.0, 1.0)


def test_a_refused_job_leaves_the_other_jobs_directory_as_it_was_and_a_rerun_keeps_its_summary(demo_dir, tmp_path):
    """QA: a dpo spec pointed at an sft run's directory was refused, but only after it had written its own
    spec.yaml there, so the sft run could no longer be exported; and running a finished job again rewrote its
    summary.json with no metrics."""
    run = tmp_path / "run"
    assert run_job(spec_for(demo_dir, run), progress_bar=False)["status"] == "succeeded"
    written, summary = (run / "spec.yaml").read_text(), (run / "summary.json").read_text()
    other = spec_for(demo_dir, run, peft={"method": "none"})
    with pytest.raises(JobError, match=f"output_dir: {run} holds the checkpoints of another job"):
        run_job(other, progress_bar=False)
    assert (run / "spec.yaml").read_text() == written
    assert main(["export", "--run", str(run), "--best"]) == 0
    again = run_job(spec_for(demo_dir, run), progress_bar=False)
    assert again == json.loads(summary) and (run / "summary.json").read_text() == summary


def test_a_broken_model_or_a_reward_column_the_data_lacks_is_refused_before_the_run_starts(demo_dir, tmp_path, capsys):
    """QA: a config.json that is not JSON, a missing tokenizer and weights cut short were tracebacks from
    `jaxengine train` (each leaving spec.yaml), and GRPO on sft data failed mid-step on exact_match's
    missing 'answer' column. A directory given as the spec was a traceback too."""
    broken = tmp_path / "broken"
    shutil.copytree(demo_dir / "model", broken)
    (broken / "config.json").write_text('{"architectures": ["LlamaForCausalLM"],\n')
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump({**spec_for(demo_dir, tmp_path / "run").model_dump(mode="json"),
                                         "model": str(broken)}))
    assert main(["train", str(spec_path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"model: {broken}:" in err and "Traceback" not in err and not (tmp_path / "run" / "spec.yaml").exists()
    shutil.copytree(demo_dir / "model", broken, dirs_exist_ok=True)
    (broken / "model.safetensors").write_bytes((broken / "model.safetensors").read_bytes()[:1000])
    assert main(["train", str(spec_path), "--no-progress"]) == 2
    assert f"model: {broken}:" in capsys.readouterr().err
    grpo = {"task": "grpo", "model": str(demo_dir / "model"), "output_dir": str(tmp_path / "grpo"),
            "data": {"train": str(demo_dir / "data/sft.jsonl"), "max_seq_len": 64},
            "train": {"max_steps": 1, "batch_size": 2},
            "grpo": {"num_generations": 2, "max_new_tokens": 4, "rewards": [{"name": "exact_match"}]}}
    with pytest.raises(JobError, match=f"data.train: row 1 of {demo_dir / 'data/sft.jsonl'} has no 'answer', the "
                                       "reference column reward exact_match reads"):
        run_job(parse_spec(grpo), progress_bar=False)
    assert not (tmp_path / "grpo" / "spec.yaml").exists()
    assert main(["train", str(tmp_path), "--no-progress"]) == 2
    assert f"{tmp_path}: a directory; give the spec's YAML file" in capsys.readouterr().err


def test_the_preset_and_every_spelling_of_its_directory_are_one_job(demo_dir, tmp_path, monkeypatch):
    """QA: a job run as ``model: demo-tiny`` and again with the directory that name resolves to was
    taken for another job (its run directory refused)."""
    monkeypatch.setenv("TEMPER_DEMO_DIR", str(demo_dir))
    monkeypatch.chdir(demo_dir)
    run = tmp_path / "run"
    spellings = ["demo-tiny", str(demo_dir / "model"), "model", "./model/", str(demo_dir / "data" / ".." / "model")]
    identities = {job_identity(spec_for(demo_dir, run, model=model)) for model in spellings}
    assert len(identities) == 1
    run.mkdir()
    (run / "spec.yaml").write_text(dump_spec(spec_for(demo_dir, run, model=str(demo_dir / "model"))))
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "1").mkdir()
    refuse_another_jobs_directory(spec_for(demo_dir, run, model="demo-tiny"), run)
    with pytest.raises(JobError, match="holds the checkpoints of another job"):
        refuse_another_jobs_directory(spec_for(demo_dir, run, model="demo-tiny", task="pretrain",
                                               data={"train": str(demo_dir / "data/sft.jsonl")}), run)


def test_the_demo_model_is_looked_for_where_the_web_app_keeps_models(tmp_path, monkeypatch):
    """QA: an empty TEMPER_DATA or TEMPER_MODELS_ROOT (set but blank, as compose files leave them) made the engine
    look for demo-tiny under the current directory, while the web app's settings read blank as unset; and a ~
    was taken literally."""
    from jaxengine.job import demo_model_candidates

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TEMPER_DATA", "")
    monkeypatch.setenv("TEMPER_MODELS_ROOT", "")
    monkeypatch.delenv("TEMPER_DEMO_DIR", raising=False)
    assert demo_model_candidates() == [Path("var/models/demo/model")]
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TEMPER_MODELS_ROOT", "~/models")
    monkeypatch.setenv("TEMPER_DEMO_DIR", "~/demo")
    assert demo_model_candidates() == [tmp_path / "home/demo/model", tmp_path / "home/models/demo/model"]


def test_eval_previews_of_preference_rows_record_the_chosen_answer(tmp_path):
    """QA: a DPO run's eval samples showed "—" as their reference: the rows hold no ``answer``, but their chosen
    answer is what the run is taught to prefer. It is recorded as ``chosen`` (the text of a chat's last
    assistant turn), and is no answer to score exact match against."""
    from jaxengine.job import make_sample_hook
    from jaxengine.tokenizer import load_tokenizer
    from tests.factories import build_tiny_model_dir

    model_dir = build_tiny_model_dir(tmp_path / "tiny")
    model, _config = load_hf_model(model_dir)
    rows = [{"prompt": "Hello", "chosen": "Hi there", "rejected": "Go away"},
            {"prompt": [{"role": "user", "content": "Hey"}],
             "chosen": [{"role": "assistant", "content": "Hello!"}], "rejected": [{"role": "assistant", "content": "No"}]}]
    hook = make_sample_hook(tokenizer=load_tokenizer(model_dir), rows=rows, samples_path=tmp_path / "samples.jsonl",
                            max_new_tokens=4)
    assert hook(model, 2) == {}
    records = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [record["chosen"] for record in records] == ["Hi there", "Hello!"]
    assert not any("answer" in record for record in records)


def test_eval_previews_of_sft_rows_record_their_completion(tmp_path):
    """QA: an SFT run's eval samples showed "—" as their reference, though each eval row holds the completion
    the run is taught to write. It is recorded as ``completion`` (a reference to read, not an answer that exact
    match scores: those are the ``answer`` of a prompts file)."""
    from jaxengine.job import make_sample_hook
    from jaxengine.tokenizer import load_tokenizer
    from tests.factories import build_tiny_model_dir

    model_dir = build_tiny_model_dir(tmp_path / "tiny")
    model, _config = load_hf_model(model_dir)
    rows = [{"prompt": "What is 2 + 2?", "completion": "4"}, {"prompt": "Hello", "completion": "Hi there"}]
    hook = make_sample_hook(tokenizer=load_tokenizer(model_dir), rows=rows, samples_path=tmp_path / "samples.jsonl",
                            max_new_tokens=4)
    assert hook(model, 2) == {}
    records = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [record["completion"] for record in records] == ["4", "Hi there"]
    assert not any("answer" in record for record in records)


def test_a_relative_model_path_is_kept_absolute_so_the_run_is_found_from_elsewhere(demo_dir, tmp_path, monkeypatch):
    """QA: a run trained with `model: model` (relative) kept that spelling in its spec.yaml; from another working
    directory `jaxengine export --run` said "'model': no such directory", and the same job (the model's absolute
    path) was refused its own output_dir as "the checkpoints of another job"."""
    monkeypatch.chdir(demo_dir)
    run = tmp_path / "run"
    run.mkdir()
    spec = spec_for(demo_dir, run, model="model")
    (run / "spec.yaml").write_text(dump_spec(spec_as_run(spec, resolve_model_dir(spec.model))))
    (run / "checkpoints" / "1").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    kept = load_spec(run / "spec.yaml").model
    assert kept == str(demo_dir / "model") and resolve_model_dir(kept) == demo_dir / "model"
    refuse_another_jobs_directory(spec_for(demo_dir, run, model=str(demo_dir / "model")), run)


def test_a_max_seq_len_past_the_models_positions_is_refused_before_the_model_loads(demo_dir, tmp_path):
    """Issue 9: data.max_seq_len 4096 on the demo model (max_position_embeddings 2048) trained with no word,
    its long rows at positions the model never saw. It is refused at the start, naming both numbers; a model
    whose config.json declares a RoPE scaling that extends its range is held to the extended range."""
    data = {"train": str(demo_dir / "data/sft.jsonl"), "max_seq_len": 4096}
    with pytest.raises(JobError) as raised:
        run_job(spec_for(demo_dir, tmp_path / "run", data=data), progress_bar=False)
    assert str(raised.value) == (
        "data.max_seq_len: 4096 is past the model's 2048 positions (max_position_embeddings 2048 in its config.json): "
        "tokens after position 2048 would sit at positions the model was never trained on; give data.max_seq_len "
        "at most 2048, or choose a model with a longer context")
    assert not (tmp_path / "run").exists()
    from jaxengine.job import check_model_positions

    scaled = shutil.copytree(demo_dir / "model", tmp_path / "scaled")
    config = json.loads((scaled / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}
    (scaled / "config.json").write_text(json.dumps(config))
    check_model_positions(spec_for(demo_dir, tmp_path / "run", model=str(scaled), data=data), scaled)
    check_model_positions(spec_for(demo_dir, tmp_path / "run", model=str(scaled),
                                   data={**data, "max_seq_len": 8192}), scaled)
    with pytest.raises(JobError, match=r"^data.max_seq_len: 8200 is past the model's 8192 positions "
                                       r"\(max_position_embeddings 2048 × rope_parameters factor 4 \(linear\) in its "
                                       r"config.json\): .* give data.max_seq_len at most 8192, or choose"):
        run_job(spec_for(demo_dir, tmp_path / "run", model=str(scaled), data={**data, "max_seq_len": 8200}),
                progress_bar=False)
    assert not (tmp_path / "run").exists()


def resumable_sft(demo_dir, tmp_path, *, learning_rate=1e-2, max_steps=2):
    """An SFT spec on copies of the demo's data files (a test replaces them), saving a checkpoint each step."""
    for name in ("sft", "eval"):
        if not (tmp_path / f"{name}.jsonl").exists():
            shutil.copyfile(demo_dir / f"data/{name}.jsonl", tmp_path / f"{name}.jsonl")
    return spec_for(demo_dir, tmp_path / "run", optim={"learning_rate": learning_rate, "warmup_steps": 1},
                    data={"train": str(tmp_path / "sft.jsonl"), "eval": str(tmp_path / "eval.jsonl"), "max_seq_len": 64},
                    train={"max_steps": max_steps, "batch_size": 2, "save_every": 1, "eval_every": 10, "eval_samples": 1,
                           "sample_max_new_tokens": 2})


def test_a_resume_under_a_changed_optimizer_setting_goes_on_under_it_and_says_so(demo_dir, tmp_path):
    """Issue 8: a resume under another learning rate (or loss, reward, eval file) went on with no word of it:
    the run's curves changed and nothing said why. Each change is reported, saved value -> new value, through
    ``on_log`` and in the summary, and the run trains on under the new value."""
    assert run_job(resumable_sft(demo_dir, tmp_path), progress_bar=False)["step"] == 2
    lines = []
    summary = run_job(resumable_sft(demo_dir, tmp_path, learning_rate=5e-3, max_steps=3), progress_bar=False,
                      on_log=lines.append)
    assert lines == ["resumed from step 2 with a changed setting: optim.learning_rate 0.01 -> 0.005",
                     "resumed from step 2 with a changed setting: train.max_steps 2 -> 3"]
    assert summary["status"] == "succeeded" and summary["resumed_from_step"] == 2
    assert summary["resumed_with_changes"] == lines
    logged = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert logged[-1]["step"] == 3 and 0 < logged[-1]["learning_rate"] <= 5e-3  # cosine from the new peak

    # The eval file edited since: scored on other rows from here on, which the log says; training goes on.
    rows = (tmp_path / "eval.jsonl").read_text().splitlines()
    before = hashlib.sha256((tmp_path / "eval.jsonl").read_bytes()).hexdigest()
    (tmp_path / "eval.jsonl").write_text("\n".join(rows[:4]) + "\n")
    after = hashlib.sha256((tmp_path / "eval.jsonl").read_bytes()).hexdigest()
    lines.clear()
    summary = run_job(resumable_sft(demo_dir, tmp_path, learning_rate=5e-3, max_steps=4), progress_bar=False,
                      on_log=lines.append)
    assert summary["status"] == "succeeded" and summary["step"] == 4
    assert lines == ["resumed from step 3 with a changed setting: train.max_steps 3 -> 4",
                     f"resumed from step 3 with a changed setting: data.eval {tmp_path / 'eval.jsonl'} changed since "
                     f"that step (sha256 {before[:12]} -> {after[:12]}): eval scores from here on are over other rows"]
    # Resumed as saved, nothing is reported.
    (tmp_path / "run/summary.json").unlink()
    summary = run_job(resumable_sft(demo_dir, tmp_path, learning_rate=5e-3, max_steps=4), progress_bar=False,
                      on_log=lines.append)
    assert summary["resumed_with_changes"] == [] and len(lines) == 2


def test_a_run_of_relative_paths_names_them_absolute_and_resumes_from_its_spec_yaml_unchanged(demo_dir, tmp_path,
                                                                                            monkeypatch):
    """A run's summary.json named its model as the spec spelled it and its spec.yaml kept a relative output_dir, so
    read from another directory (`jaxengine export --run DIR`, a script reading the summary) neither resolved. Both
    files name every path absolute; resumed from its own spec.yaml, the run reports no setting as changed, though
    the spec it started from spelled its data files relative."""
    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    elsewhere.mkdir()
    start.mkdir()
    for name in ("model", "data"):
        (start / name).symlink_to(demo_dir / name)
    monkeypatch.chdir(start)
    spec = spec_for(demo_dir, "run", model="model",
                    data={"train": "data/sft.jsonl", "eval": "data/eval.jsonl", "max_seq_len": 64},
                    train={"max_steps": 1, "batch_size": 2, "save_every": 1, "eval_every": 10, "eval_samples": 1,
                           "sample_max_new_tokens": 2})
    assert run_job(spec, progress_bar=False)["status"] == "succeeded"
    monkeypatch.chdir(elsewhere)
    run = start / "run"
    kept = load_spec(run / "spec.yaml")
    summary = json.loads((run / "summary.json").read_text())
    assert (kept.output_dir, kept.model) == (str(run), str(start / "model"))
    assert summary["model"] == str(start / "model")
    assert summary["export"]["model"] == str(run / "export")
    lines = []
    resumed = run_job(kept.model_copy(update={"train": kept.train.model_copy(update={"max_steps": 2})}),
                      progress_bar=False, on_log=lines.append)
    assert resumed["resumed_from_step"] == 1
    assert lines == ["resumed from step 1 with a changed setting: train.max_steps 1 -> 2"]


def test_a_resume_over_a_replaced_training_file_is_refused_naming_the_file(demo_dir, tmp_path):
    """Issue 8: a resume goes on from the saved data position, a cursor into the shuffled rows of the training
    file as it was; over a file edited or replaced since, the resumed run read other rows than its step count
    said (some twice, some never), with no word. It is refused before the model loads, leaving the run's files as
    they were, naming the file, both fingerprints and what to do; put back, the file resumes."""
    assert run_job(resumable_sft(demo_dir, tmp_path), progress_bar=False)["step"] == 2
    run, data = tmp_path / "run", tmp_path / "sft.jsonl"
    written, original = (run / "spec.yaml").read_text(), data.read_bytes()
    rows = original.decode().splitlines()
    data.write_text("\n".join(reversed(rows)) + "\n")
    with pytest.raises(JobError) as raised:
        run_job(resumable_sft(demo_dir, tmp_path, max_steps=3), progress_bar=False)
    saved, now = hashlib.sha256(original).hexdigest(), hashlib.sha256(data.read_bytes()).hexdigest()
    assert str(raised.value) == (
        f"data.train: {data} changed since checkpoint 2 was saved (sha256 {saved[:12]} then, {now[:12]} now): a "
        "resume goes on from the saved position in the training file's shuffled rows, so over other contents the "
        "run would train on other rows than its steps say; put the file back as it was to resume, or start a new "
        "run (another output_dir)")
    assert (run / "spec.yaml").read_text() == written
    assert sorted(int(entry.name) for entry in (run / "checkpoints").iterdir() if entry.name.isdigit()) == [1, 2]
    data.write_bytes(original)
    summary = run_job(resumable_sft(demo_dir, tmp_path, max_steps=3), progress_bar=False)
    assert summary["status"] == "succeeded" and summary["resumed_from_step"] == 2


def test_a_resume_under_other_columns_or_loss_on_is_refused_naming_each(demo_dir, tmp_path):
    """A resume under another data.columns (another column of the same file as the completion) or data.loss_on
    (the loss on every token instead of the completions) went on, only reported among the changed settings: from
    the saved position the run trained on other examples than its steps say. It is refused before the model loads,
    as a changed training file is, leaving the run's files as they were, naming each setting with its saved and its
    new value and what to do; put back, the run resumes."""
    (tmp_path / "sft.jsonl").write_text("".join(
        json.dumps({**row, "answer": f"it is {row['completion']}"}) + "\n"
        for row in map(json.loads, (demo_dir / "data/sft.jsonl").read_text().splitlines())))
    assert run_job(resumable_sft(demo_dir, tmp_path), progress_bar=False)["step"] == 2
    run = tmp_path / "run"
    written = (run / "spec.yaml").read_text()

    def resumed(**data):
        spec = resumable_sft(demo_dir, tmp_path, max_steps=3).model_dump(mode="json")
        return parse_spec({**spec, "data": {**spec["data"], **data}})

    with pytest.raises(JobError) as raised:
        run_job(resumed(columns={"completion": "answer"}), progress_bar=False)
    assert str(raised.value) == (
        'data.columns {} when checkpoint 2 was saved, {"completion": "answer"} in this spec: it decides what the run '
        "trains on in each row of the training file, so the resumed run would train on other examples than its "
        "checkpoint's; put it back as saved to resume, or train under the new value as a new run from checkpoint 2: "
        "its Launch a run from it, under Checkpoints on the run's page, exports it first and opens the launch form "
        f"with it (or jaxengine export --run {run} --step 2, then a run from the exported model)")
    with pytest.raises(JobError) as raised:
        run_job(resumed(columns={"completion": "answer"}, loss_on="all"), progress_bar=False)
    assert str(raised.value).startswith(
        'data.columns {} when checkpoint 2 was saved, {"completion": "answer"} in this spec; data.loss_on '
        '"completion" when checkpoint 2 was saved, "all" in this spec: they decide what the run trains on in each '
        "row of the training file, so the resumed run would train on other examples than its checkpoint's; put them "
        "back as saved to resume, or train under the new values as a new run from checkpoint 2")
    assert (run / "spec.yaml").read_text() == written
    assert sorted(int(entry.name) for entry in (run / "checkpoints").iterdir() if entry.name.isdigit()) == [1, 2]
    summary = run_job(resumed(columns={}, loss_on="completion"), progress_bar=False)
    assert summary["status"] == "succeeded" and summary["resumed_from_step"] == 2


def test_a_resumed_job_hashes_its_data_files_once(demo_dir, tmp_path, monkeypatch):
    """A resume fingerprinted each data file twice, whole (the early refusal of a changed training file, then the
    trainer's checkpoint record): a large training file took its reading time twice over. ``run_job`` hashes them
    once and both read those fingerprints."""
    from jaxengine import job

    assert run_job(resumable_sft(demo_dir, tmp_path), progress_bar=False)["step"] == 2
    hashed = []
    real = job.data_files
    monkeypatch.setattr(job, "data_files", lambda spec: hashed.append(spec.output_dir) or real(spec))
    summary = run_job(resumable_sft(demo_dir, tmp_path, max_steps=3), progress_bar=False)
    assert summary["status"] == "succeeded" and summary["resumed_from_step"] == 2
    assert hashed == [str(tmp_path / "run")]


def test_cli_prints_a_resumes_changed_settings(demo_dir, tmp_path, capsys):
    """Issue 8: `jaxengine train` on an output_dir with checkpoints says on stderr what its spec changed."""
    run_dir, path, spec = trained_with_checkpoints(demo_dir, tmp_path)
    spec["optim"] = {"learning_rate": 5e-5}
    spec["train"]["max_steps"] = 3
    path.write_text(yaml.safe_dump(spec))
    capsys.readouterr()
    assert main(["train", str(path), "--no-progress"]) == 0
    assert capsys.readouterr().err == (
        f"{path}: resumed from step 2 with a changed setting: optim.learning_rate 0.0001 -> 5e-05\n"
        f"{path}: resumed from step 2 with a changed setting: train.max_steps 2 -> 3\n")


def test_sft_on_qwen3s_template_trains_every_assistant_turn_of_multi_turn_chats(tmp_path):
    """Issue 8: a Qwen3 model's template renders earlier assistant turns without their reasoning, and SFT on any
    chat of two or more assistant turns stopped with 'the chat template does not render conversations prefix by
    prefix'. Each turn is now an example of its own, and the run's log says so once."""
    from tests.factories import build_tiny_model_dir

    model_dir = build_tiny_model_dir(tmp_path / "tiny")
    templates = Path(__file__).parent / "tokenizer" / "real_templates"
    shutil.copyfile(templates / "qwen3.jinja", model_dir / "chat_template.jinja")
    chats = [[{"role": "user", "content": f"{a}+{a}?"}, {"role": "assistant", "content": str(2 * a)},
              {"role": "user", "content": "and doubled?"}, {"role": "assistant", "content": str(4 * a)},
              {"role": "user", "content": "thanks"}, {"role": "assistant", "content": "you are welcome"}]
             for a in range(1, 5)]
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps({"messages": chat}) + "\n" for chat in chats))
    spec = parse_spec({"task": "sft", "model": str(model_dir), "output_dir": str(tmp_path / "run"),
                       "data": {"train": str(data), "max_seq_len": 128,
                                "chat_template_kwargs": {"enable_thinking": False}},
                       "train": {"max_steps": 2, "batch_size": 2}})
    lines = []
    summary = run_job(spec, progress_bar=False, on_log=lines.append)
    assert summary["status"] == "succeeded" and summary["step"] == 2
    train = summary["data"]["train"]
    assert (train["rows"], train["examples"], train["split_by_turn"], train["dropped"], train["truncated"]) == (
        4, 12, 4, 0, 0)
    # The tokens splitting costs: the examples' (none cut), against the conversations rendered whole.
    from jaxengine.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    assert tokenizer.bos_id is None  # Qwen's: the rendering is the whole example
    whole = sum(len(tokenizer.encode(tokenizer.apply_chat_template(chat, enable_thinking=False))) for chat in chats)
    assert (train["split_tokens"], train["whole_tokens"]) == (train["tokens"], whole) and whole < train["tokens"]
    assert lines == [
        "data.train: the chat template renders earlier assistant turns otherwise than the latest (Qwen3 drops their "
        "reasoning), so 4 of 4 conversations were trained one assistant turn per example, each from the prompt a chat "
        f"sends for that turn (12 examples; those conversations take {train['tokens']:,} tokens so, {whole:,} whole); "
        "a template with {% generation %} markers trains a conversation as one example, and so does data.loss_on: all "
        "(every token trained)"]
    # Said again by each attempt of the run (a resume after a worker loss): the train worker logs it once.
    assert isinstance(lines[0], RunLogOnce) and not isinstance(lines[0], RunLogWarning)
    assert json.loads((tmp_path / "run" / "export" / "chat_template_kwargs.json").read_text()) == {
        "enable_thinking": False}


def test_the_demo_preset_lowers_the_loss_more_than_the_lora_preset_did(demo_dir, tmp_path):
    """The launch form's LoRA preset (2e-4, right for models of 1 B parameters and more) barely moved the demo model
    in its first 30 steps (loss 11.6 -> 9.5); the demo model's preset (1e-3) took it to 4.3 (bench/RESULTS.md, "The
    demo model's first LoRA run"). On the micro demo build, with the same batches, the demo preset's first 30 steps
    lower the loss (mean of the first 3 steps' less the last 3's) over 1.8 times as much as the LoRA preset's."""
    from webapp.runs.presets import DEMO_PRESET, preset_spec

    drops = {}
    for name in ("LoRA", DEMO_PRESET):
        preset = preset_spec("sft", name)
        run_dir = tmp_path / name.replace(", ", "-").replace(" ", "-")
        spec = spec_for(demo_dir, run_dir, peft=preset["peft"], optim=preset["optim"],
                        data={"train": str(demo_dir / "data/sft.jsonl"), "max_seq_len": 64},
                        train={"max_steps": 30, "batch_size": preset["train"]["batch_size"]})
        assert run_job(spec, progress_bar=False)["status"] == "succeeded"
        losses = [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        drops[name] = np.mean(losses[:3]) - np.mean(losses[-3:])
    assert drops["LoRA"] > 0 and drops[DEMO_PRESET] >= 1.8 * drops["LoRA"], drops  # measured: 0.096 and 0.217


PAIRS = '{"prompt": "2 + 2?", "chosen": "4", "rejected": "5"}\n'
RENAMED = '{"question": "2 + 2?", "answer_text": "4"}\n'
ARRAY = '[{"prompt": "2 + 2?", "completion": "4"},\n {"prompt": "3 + 3?", "completion": "6"}]\n'


@pytest.mark.parametrize(("key", "content", "advice"), [
    ("train", PAIRS, "data.train of task sft is read as sft rows: give a file of sft rows for data.train, or set "
                     "task to reward or dpo, which train on preference rows"),
    ("eval", PAIRS, "data.eval of task sft is read as sft rows: give a file of sft rows for data.eval"),
    ("eval", RENAMED, "(map a differently named column to it: data.columns in the job spec)"),
    ("train", ARRAY, "not one JSON object per line: give the file the .json extension"),
], ids=["kind of data.train", "kind of data.eval", "mapping", "format"])
def test_cli_data_errors_name_what_the_spec_can_set(demo_dir, tmp_path, capsys, key, content, advice):
    """Session-33 audit: a spec's data file with rows of another kind was told to "upload it as a dataset of kind
    preference (Kind on the upload form, kind in the API, --kind on the command line)", and one JSON array in a
    .jsonl file to use "--format on the command line": neither is anything jaxengine train or its spec has."""
    data = tmp_path / "rows.jsonl"
    data.write_text(content)
    files = {"train": str(demo_dir / "data/sft.jsonl"), key: str(data)}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"task": "sft", "model": str(demo_dir / "model"), "output_dir": str(tmp_path / "run"),
                                    "data": files, "train": {"max_steps": 1}}))
    assert main(["train", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{path}: {data}: ") and advice in err
    for elsewhere in ("upload", "--kind", "--format", "--map", "command line", " API"):
        assert elsewhere not in err


def test_cli_rl_data_errors_name_what_the_spec_can_set(demo_dir, tmp_path, capsys):
    """GRPO and PPO read their prompts through grpo.read_prompts, which run_job tells where the spec came from: the
    command line's spec keeps the spec's words (a run launched in the web app gets the launch form's:
    tests/worker/test_launch_data_words.py)."""
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "2 + 2?", "answer": "4"}\n' + RENAMED)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({
        "task": "grpo", "model": str(demo_dir / "model"), "output_dir": str(tmp_path / "run"),
        "data": {"train": str(data), "max_seq_len": 64}, "train": {"max_steps": 1, "batch_size": 2},
        "grpo": {"num_generations": 2, "max_new_tokens": 4, "rewards": [{"name": "exact_match"}]}}))
    assert main(["train", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{path}: {data}: line 2, row 2, field 'prompt': ")
    assert err.endswith("(map a differently named column to it: data.columns in the job spec)\n")
    for elsewhere in ("upload", "Column mapping", "--map", " API"):
        assert elsewhere not in err


def test_cli_names_the_first_five_bad_rows_of_a_data_file_and_counts_the_rest(demo_dir, tmp_path, capsys):
    """Session-33 audit: jaxengine train named the first bad row only, where an upload's check lists the first
    problems and counts them all: a file with nine bad rows was mended and run again row by row."""
    good = '{"prompt": "2 + 2?", "completion": "4"}\n'
    empty = '{"prompt": "2 + 2?", "completion": ""}\n'
    rows = [good, empty, good, empty, '{"prompt": 4, "completion": "4"}\n', empty, '{"prompt": "x"\n', empty, empty,
            good, empty, empty]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(rows))
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"task": "sft", "model": str(demo_dir / "model"), "output_dir": str(tmp_path / "run"),
                                    "data": {"train": str(data)}, "train": {"max_steps": 1}}))
    assert main(["train", str(path), "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        f"{path}: {data}: line 2, row 2, field 'completion': is an empty string; give it text or drop the row; "
        "8 more bad rows: line 4, row 4, field 'completion': the same problem; line 5, row 5, field 'prompt': must be a "
        'string, got a number: write it as text, in quotes ("4"); line 6, row 6, field \'completion\': the same '
        "problem; line 7, row 7: broken JSON at column 15: Expecting ',' delimiter; each line must be one JSON "
        "object; and 4 more\n")
    assert not (tmp_path / "run").exists()


def test_relative_data_paths_are_kept_absolute_so_export_scores_from_elsewhere(demo_dir, tmp_path, monkeypatch):
    """Docs audit: the README's first spec (`data: {train: var/models/demo/data/sft.jsonl, eval: ...}`) trained
    from the repository root kept those relative paths in the run's spec.yaml; `jaxengine export --run DIR
    --quantize int8` from any other directory then read data.eval there to score the quantized copy and died with
    a FileNotFoundError traceback, while the README says the run's spec.yaml lets export work from any working
    directory. The data files are kept as absolute paths, as a relative model path is."""
    from jaxengine.quantize import quantize_run_export

    monkeypatch.chdir(demo_dir)
    run = tmp_path / "run"
    run.mkdir()
    spec = spec_for(demo_dir, run, data={"train": "data/sft.jsonl", "eval": "data/eval.jsonl", "max_seq_len": 64})
    (run / "spec.yaml").write_text(dump_spec(spec_as_run(spec, resolve_model_dir(spec.model))))
    monkeypatch.chdir(tmp_path)
    kept = load_spec(run / "spec.yaml").data
    assert (kept.train, kept.eval) == (str(demo_dir / "data/sft.jsonl"), str(demo_dir / "data/eval.jsonl"))
    shutil.copytree(demo_dir / "model", run / "export")
    assert quantize_run_export(run, eval_limit=2)["eval_sequences"] == 2


def test_an_eval_file_gone_since_the_run_is_named_by_export_quantize(demo_dir, tmp_path, capsys):
    """Docs audit: a run whose data.eval was moved away since it trained made `jaxengine export --quantize` end in a
    FileNotFoundError traceback; it is bad input (exit 2) naming the key, the file and the way around it."""
    from jaxengine.data.formats import Entry
    from jaxengine.quantize import quantize_run_export

    run = tmp_path / "run"
    run.mkdir()
    gone = tmp_path / "moved" / "eval.jsonl"
    spec = spec_for(demo_dir, run, data={"train": str(demo_dir / "data/sft.jsonl"), "eval": str(gone),
                                         "max_seq_len": 64})
    (run / "spec.yaml").write_text(dump_spec(spec))
    shutil.copytree(demo_dir / "model", run / "export")
    with pytest.raises(JobError) as raised:
        quantize_run_export(run, eval_limit=2)
    assert str(raised.value) == (
        f"data.eval: {gone} (in {run / 'spec.yaml'}): no such file; the quantized copy is scored on its rows: put "
        "it back, or give --eval-limit 0 to write the copy unscored")
    assert "eval_sequences" not in quantize_run_export(run, eval_limit=0)
    with pytest.raises(JobError) as raised:  # the web's workers: no command line to advise, no spec.yaml path
        quantize_run_export(run, eval_limit=2, entry=Entry.LAUNCH)
    assert str(raised.value) == (f"data.eval: {gone}: no such file (its dataset version deleted since the run?); the "
                                 "quantized copy is scored on its rows")


def test_rows_cut_to_max_seq_len_are_said_before_the_first_step(demo_dir, tmp_path):
    """A run whose every row was cut to a too small data.max_seq_len said so at its end only (in its summary's data):
    the encoding's cuts are said through ``on_log`` once the data is encoded, before the first step's progress, as
    warnings (``RunLogWarning``, which the train worker logs as such)."""
    heard = []
    spec = spec_for(demo_dir, tmp_path / "run", data={"train": str(demo_dir / "data/sft.jsonl"), "max_seq_len": 8},
                    train={"max_steps": 1, "batch_size": 2})
    summary = run_job(spec, progress_bar=False, on_log=heard.append,
                      on_progress=lambda progress: heard.append(("step", progress.step)))
    rows = summary["data"]["train"]["rows"]
    assert summary["status"] == "succeeded" and summary["data"]["train"]["truncated"] == rows
    cut = (f"data.train: {rows} of {rows} rows (100%) were longer than data.max_seq_len 8 tokens and were cut to it: "
           "raise data.max_seq_len, or shorten those rows")
    assert heard == [cut, ("step", 1)] and isinstance(heard[0], RunLogWarning)


def test_a_run_that_ends_before_its_first_step_still_says_what_its_data_lost(demo_dir, tmp_path):
    """Stopped before its first step (cancelled here; a failed reference pass or first step alike): the cuts were
    said all the same, the summary's data being the only place they were before."""
    heard = []
    spec = spec_for(demo_dir, tmp_path / "run", data={"train": str(demo_dir / "data/sft.jsonl"), "max_seq_len": 8},
                    train={"max_steps": 1, "batch_size": 2})
    summary = run_job(spec, progress_bar=False, on_log=heard.append, should_stop=lambda: True)
    assert (summary["status"], summary["step"]) == ("cancelled", 0)
    assert len(heard) == 1 and heard[0].startswith("data.train: ") and "were cut to it" in heard[0]


def test_data_cut_warnings_say_each_use_and_a_few_rows_as_under_one_percent():
    """Held-out rows cut too are said of data.eval, a few as under 1%; data that fit says nothing."""
    fit = {"train": {"rows": 8, "examples": 8, "truncated": 0, "dropped": 0, "split": 0}}
    assert data_cut_warnings(fit, max_seq_len=512) == []
    data = {**fit, "eval": {"rows": 500, "examples": 499, "truncated": 2, "dropped": 1, "split": 0}}
    assert data_cut_warnings(data, max_seq_len=512) == [
        "data.eval: 2 of 500 rows (under 1%) were longer than data.max_seq_len 512 tokens and were cut to it: raise "
        "data.max_seq_len, or shorten those rows",
        "data.eval: 1 of 500 rows was left out, with no token to score (an empty completion, or no assistant turn): "
        "fill or remove them"]


def test_data_cut_warnings_say_the_prompts_a_grpo_or_ppo_run_left_out_as_too_long():
    """A GRPO or PPO data summary (``grpo.read_rl_prompts``: rows read, examples kept, dropped_long_prompts, and the
    room a prompt had) says its prompts left out as an sft one says its cut rows, naming the task's max_new_tokens;
    one that left none out says nothing."""
    fit = {"train": {"rows": 8, "examples": 8, "dropped_long_prompts": 0}, "eval": {}, "max_prompt_tokens": 448}
    assert data_cut_warnings(fit, max_seq_len=512, section="grpo") == []
    data = {**fit, "train": {"rows": 500, "examples": 499, "dropped_long_prompts": 1}}
    assert data_cut_warnings(data, max_seq_len=512, section="ppo") == [
        "data.train: 1 of 500 rows (under 1%) had a prompt longer than the 448 tokens data.max_seq_len 512 leaves "
        "before ppo.max_new_tokens, and was left out: raise data.max_seq_len, lower ppo.max_new_tokens, or shorten it"]


def test_one_row_cut_to_max_seq_len_is_said_in_the_singular():
    """Seen in a run's log: "1 of 500 rows (under 1%) was longer than data.max_seq_len … and were cut to it"."""
    data = {"train": {"rows": 500, "examples": 500, "truncated": 1, "dropped": 0, "split": 0}}
    assert data_cut_warnings(data, max_seq_len=512) == [
        "data.train: 1 of 500 rows (under 1%) was longer than data.max_seq_len 512 tokens and was cut to it: raise "
        "data.max_seq_len, or shorten it"]


def test_jaxengine_train_prints_the_cuts_as_a_warning(demo_dir, tmp_path, capsys):
    spec = spec_for(demo_dir, tmp_path / "run", data={"train": str(demo_dir / "data/sft.jsonl"), "max_seq_len": 8},
                    train={"max_steps": 1, "batch_size": 2})
    path = tmp_path / "spec.yaml"
    path.write_text(dump_spec(spec))
    assert main(["train", str(path), "--no-progress"]) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out.splitlines()[-1])["data"]["train"]["rows"]
    assert [line for line in captured.err.splitlines() if "max_seq_len" in line] == [
        f"{path}: warning: data.train: {rows} of {rows} rows (100%) were longer than data.max_seq_len 8 tokens and were cut "
        "to it: raise data.max_seq_len, or shorten those rows"]


def test_a_web_launchs_missing_model_is_told_without_the_command_lines_advice(tmp_path):
    """A web launch's job (``Entry.LAUNCH``) names a directory the web resolved (a base model's, a run's export): one
    deleted since says so and what to do on the run's page, not "or the preset demo-tiny", and leaves the path bare
    for the web to name as the project does (``in_project_terms``)."""
    from jaxengine.data.formats import Entry

    gone = tmp_path / "models" / "mine"
    with pytest.raises(JobError) as raised:
        resolve_model_dir(str(gone), entry=Entry.LAUNCH)
    assert str(raised.value) == (
        f"model: {gone}: no such directory; its folder was deleted or moved since the run was queued. Put the "
        "model's files back in it, or duplicate the run on its page and choose another starting model")
