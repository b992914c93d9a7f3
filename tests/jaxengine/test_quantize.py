"""Serving quantization: codes by hand, the half-step error bound, sizes, save/load round trip, perplexity
and greedy agreement on a tiny model."""
import gc
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxengine import quantize
from jaxengine.checkpoint.hf import load_hf_model
from jaxengine.quantize import QuantScheme
from jaxengine.tokenizer import load_tokenizer
from tests import factories


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return factories.build_tiny_model_dir(tmp_path_factory.mktemp("tiny-serving"))


def test_int8_per_channel_codes_by_hand():
    kernel = jnp.array([[1.0, 0.0], [-0.5, 0.5], [0.25, -0.125]])
    codes, scales = quantize.quantize_kernel(kernel, QuantScheme(bits=8))
    np.testing.assert_allclose(scales, [[1 / 127, 0.5 / 127]], rtol=1e-7)  # one scale per output column
    assert codes.dtype == jnp.int8
    # column 0: 127, -63.5 -> -64 (half to even), 31.75 -> 32; column 1: 0, 127, -31.75 -> -32
    assert codes.tolist() == [[127, 0], [-64, 127], [32, -32]]


def test_int4_group_codes_and_packing_by_hand():
    # Two groups of two rows in one column: absmax 0.7 -> scale 0.1; absmax 0.2 -> scale 0.2 / 7.
    kernel = jnp.array([[0.7], [-0.3], [0.14], [-0.2]])
    packed, scales = quantize.quantize_kernel(kernel, QuantScheme(bits=4, group_size=2))
    np.testing.assert_allclose(scales, [[0.1], [0.2 / 7]], rtol=1e-6)
    # codes 7, -3, 0.14 / (0.2 / 7) = 4.9 -> 5, -7; offset by 8: 15, 5, 13, 1; rows 2i low nibble, 2i+1 high
    assert packed.dtype == jnp.uint8 and packed[:, 0].tolist() == [15 | 5 << 4, 13 | 1 << 4]
    restored = quantize.dequantize_kernel(packed, scales, bits=4, dtype=jnp.float32)
    np.testing.assert_allclose(restored[:, 0], [0.7, -0.3, 5 * 0.2 / 7, -0.2], rtol=1e-6)


@pytest.mark.parametrize("scheme", [QuantScheme(bits=8), QuantScheme(bits=4, group_size=32)])
def test_dequantization_error_is_at_most_half_a_step(scheme):
    kernel = jax.random.normal(jax.random.key(0), (128, 48)) * jnp.linspace(0.01, 3.0, 48)
    codes, scales_go = quantize.quantize_kernel(kernel, scheme)
    error = jnp.abs(quantize.dequantize_kernel(codes, scales_go, bits=scheme.bits, dtype=jnp.float32) - kernel)
    scale_per_weight = jnp.repeat(scales_go, 128 // scales_go.shape[0], axis=0)
    # Rounding to the nearest code: |w - scale * code| <= scale / 2 (plus float32 rounding of the product).
    assert bool(jnp.all(error <= scale_per_weight / 2 * (1 + 1e-5) + 1e-7))
    assert float(jnp.max(error / scale_per_weight)) > 0.45  # the bound is tight, not vacuous


def test_a_zero_group_stays_zero():
    codes, scales = quantize.quantize_kernel(jnp.zeros((4, 2)), QuantScheme(bits=4, group_size=2))
    np.testing.assert_array_equal(quantize.dequantize_kernel(codes, scales, bits=4, dtype=jnp.float32), 0.0)


def test_it_rejects_a_group_size_that_does_not_divide_a_projection():
    with pytest.raises(quantize.QuantizationError, match="group_size: 48 does not divide"):
        quantize.quantize_kernel(jnp.zeros((64, 2)), QuantScheme(bits=4, group_size=48))
    with pytest.raises(quantize.QuantizationError, match="'int3' is not one of int8, int4"):
        QuantScheme.named("int3")


@pytest.mark.parametrize("name", ["int8", "int4"])
def test_a_group_size_of_zero_is_refused_not_replaced_by_the_default(name):
    with pytest.raises(quantize.QuantizationError, match="group_size: 0 must be an even number"):
        QuantScheme.named(name, group_size=0)
    assert QuantScheme.named("int4").group_size == quantize.DEFAULT_INT4_GROUP_SIZE


def test_sizes_match_the_hand_count(tiny_model_dir):
    model, config = load_hf_model(tiny_model_dir)
    parameter_count = sum(int(np.prod(v.shape)) for v in jax.tree.leaves(nnx.state(model, nnx.Param)))
    sizes = quantize.quantize_for_serving(model, QuantScheme(bits=8))
    d, h, kv, f, layers = (config.hidden_size, config.num_heads * config.head_dim,
                           config.num_kv_heads * config.head_dim, config.intermediate_size, config.num_layers)
    # [in, out] of q, k, v, o, gate, up, down
    shapes = [(d, h), (d, kv), (d, kv), (h, d), (d, f), (d, f), (f, d)]
    projection_weights = layers * sum(i * o for i, o in shapes)
    projection_scales = layers * sum(o for _, o in shapes)  # int8 per channel: one float32 per output column
    expected = projection_weights + 4 * projection_scales + 2 * (parameter_count - projection_weights)
    assert sizes["model_bytes"] == expected
    assert sizes["bfloat16_bytes"] == 2 * parameter_count


def test_round_trip_gives_the_same_logits(tiny_model_dir, tmp_path):
    model, config = load_hf_model(tiny_model_dir)
    scheme = QuantScheme(bits=4, group_size=32)
    sizes = quantize.quantize_for_serving(model, scheme)
    out = quantize.save_quantized(model, config, tmp_path / "q", scheme=scheme,
                                  tokenizer=load_tokenizer(tiny_model_dir), sizes=sizes)
    assert quantize.is_quantized_dir(out) and (out / "tokenizer_config.json").exists()
    loaded, _, description = quantize.load_quantized(out, compute_dtype=jnp.float32)
    assert description["bits"] == 4 and description["group_size"] == 32 and len(description["modules"]) == 14
    ids_bt = jnp.array([[5, 17, 99, 3, 42, 8]])
    positions_bt = jnp.arange(6)[None]
    np.testing.assert_array_equal(np.asarray(loaded(ids_bt, positions_bt)[0]), np.asarray(model(ids_bt, positions_bt)[0]))
    loaded_bytes = sum(int(v.nbytes) for v in jax.tree.leaves(nnx.state(loaded)) if hasattr(v, "nbytes"))
    assert loaded_bytes == sizes["model_bytes"]


def test_perplexity_by_hand_ignores_right_padding(tiny_model_dir):
    model, _ = load_hf_model(tiny_model_dir)
    rows = [[5, 17, 99, 3], [42, 8, 7, 120, 64, 33]]
    token_nll = []  # per row, the negative log-likelihood of tokens 1..n-1, from one unpadded forward
    for row in rows:
        logits = model(jnp.array([row]), jnp.arange(len(row))[None])[0][0]
        logprobs = jax.nn.log_softmax(logits[:-1], axis=-1)
        token_nll.append([-float(logprobs[t, row[t + 1]]) for t in range(len(row) - 1)])
    everything = sum(map(sum, token_nll)) / 8
    assert quantize.perplexity(model, rows) == pytest.approx(math.exp(everything), rel=1e-5)
    # Scoring completions only: tokens 2, 3 of the first row and token 5 of the second.
    scored = [[False, False, True, True], [False, False, False, False, False, True]]
    completions = (token_nll[0][1] + token_nll[0][2] + token_nll[1][4]) / 3
    assert quantize.perplexity(model, rows, scored=scored) == pytest.approx(math.exp(completions), rel=1e-5)


def test_int8_copy_agrees_with_the_unquantized_model(tiny_model_dir, tmp_path):
    reference, _ = load_hf_model(tiny_model_dir)
    tokenizer = load_tokenizer(tiny_model_dir)
    prompts = [tokenizer.encode(text) for text in ("Hello world", "the quick brown fox", "a b c d")]
    assert quantize.greedy_agreement(reference, reference, tokenizer, prompts, max_new_tokens=12) == 1.0
    rows = [{"prompt": "Hello world", "completion": " and goodbye"}, {"prompt": "the quick", "completion": " fox"}]
    description = quantize.export_quantized(tiny_model_dir, tmp_path / "int8", scheme=QuantScheme.named("int8"),
                                            eval_rows=rows, eval_kind="sft", max_new_tokens=12)
    # A tiny random model's logits are nearly flat, so rounding flips some argmaxes; a broken copy
    # agrees with about 1 / vocabulary of them.
    assert description["greedy_agreement"] >= 0.8
    assert abs(description["perplexity_increase"]) < 0.05
    assert description["ratio_to_bfloat16"] < 0.7


def test_the_copy_is_scored_against_the_whole_float32_model(tiny_model_dir, tmp_path):
    # The quantized copy shares the reference's arrays (no second copy in memory); quantizing it must
    # leave the reference float32 and unchanged, so its perplexity is a freshly loaded model's.
    rows = [{"prompt": "Hello world", "completion": " and goodbye"}, {"prompt": "the quick", "completion": " fox"}]
    description = quantize.export_quantized(tiny_model_dir, tmp_path / "int8", scheme=QuantScheme.named("int8"),
                                            eval_rows=rows, eval_kind="sft", max_new_tokens=4)
    fresh, _ = load_hf_model(tiny_model_dir)
    sequences, scored, _ = quantize.eval_token_sets(load_tokenizer(tiny_model_dir), rows, kind="sft")
    assert description["perplexity_reference"] == quantize.perplexity(fresh, sequences, scored=scored)
    assert description["perplexity_quantized"] != description["perplexity_reference"]


@pytest.mark.parametrize("name", ["int8", "int4"])
def test_expanded_kernels_compute_what_the_codes_compute(tiny_model_dir, tmp_path, name):
    # On CPU the serve worker expands a copy's codes once (no fused dequantization there): the model must
    # still answer as the quantized one, not as the unquantized one it came from.
    from jaxengine.serving import load_serving_model

    model, config = load_hf_model(tiny_model_dir)
    scheme = QuantScheme.named(name, group_size=32 if name == "int4" else None)
    sizes = quantize.quantize_for_serving(model, scheme)
    out = quantize.save_quantized(model, config, tmp_path / name, scheme=scheme,
                                  tokenizer=load_tokenizer(tiny_model_dir), sizes=sizes)
    codes, _, _ = quantize.load_quantized(out, compute_dtype=jnp.float32)
    expanded, _, _ = quantize.load_quantized(out, compute_dtype=jnp.float32)
    quantize.expand_serving_kernels(expanded)
    assert not any(isinstance(module, quantize.ServingKernel) for _, module in nnx.iter_modules(expanded))
    ids_bt, positions_bt = jnp.array([[5, 17, 99, 3, 42, 8]]), jnp.arange(6)[None]

    @nnx.jit
    def logits(model):
        return model(ids_bt, positions_bt)[0]

    np.testing.assert_array_equal(np.asarray(logits(expanded)), np.asarray(logits(codes)))
    original, _ = load_hf_model(tiny_model_dir)
    assert not np.array_equal(np.asarray(logits(expanded)), np.asarray(logits(original)))
    served = load_serving_model(out)  # this test runs on CPU: expanded, and in the inference layout
    assert not any(isinstance(module, quantize.ServingKernel) for _, module in nnx.iter_modules(served.model))
    np.testing.assert_allclose(np.asarray(logits(served.model)), np.asarray(logits(codes)), rtol=0, atol=1e-5)


PREFERENCE_ROWS = [{"prompt": "Hello world", "chosen": " and goodbye", "rejected": " no"},
                   {"prompt": "the quick", "chosen": " brown fox", "rejected": " dog"},
                   {"prompt": "a b c", "chosen": " d e f", "rejected": " z"}]


def write_jsonl(path, rows):
    import json

    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_a_base_models_copy_reports_its_memory_alone_without_eval_data(tiny_model_dir, tmp_path):
    # A base model has no eval set: the copy is written (outside the model's own directory) with its sizes only.
    out = tmp_path / "serving-copies" / "bm_tiny"
    description = quantize.quantize_model_dir(tiny_model_dir, out, scheme_name="int8")
    assert quantize.is_quantized_dir(out) and description["scheme"] == "int8"
    assert description["ratio_to_bfloat16"] == description["model_bytes"] / description["bfloat16_bytes"]
    # int8 codes are half of bfloat16's bytes; the bfloat16 embedding and head keep it above one half.
    assert 0.5 < description["ratio_to_bfloat16"] < 0.7
    assert not {"perplexity_quantized", "greedy_agreement", "eval_sequences"} & description.keys()
    assert sorted(path.name for path in out.parent.iterdir()) == ["bm_tiny"]  # no staging directory left


def test_a_base_models_copy_is_measured_on_a_dataset_file_of_the_project(tiny_model_dir, tmp_path):
    eval_file = write_jsonl(tmp_path / "pairs.jsonl", PREFERENCE_ROWS)
    description = quantize.quantize_model_dir(tiny_model_dir, tmp_path / "copy", scheme_name="int8",
                                              eval_path=eval_file, eval_data_kind="preference")
    # Preference rows are scored on their chosen answers: every row is a sequence and a prompt.
    assert description["eval_sequences"] == 3 and description["eval_prompts"] == 3
    assert abs(description["perplexity_increase"]) < 0.05 and description["greedy_agreement"] >= 0.8
    sequences, scored, _ = quantize.eval_token_sets(
        load_tokenizer(tiny_model_dir), [{"prompt": row["prompt"], "completion": row["chosen"]} for row in PREFERENCE_ROWS],
        kind="sft")
    fresh, _ = load_hf_model(tiny_model_dir)
    assert description["perplexity_reference"] == quantize.perplexity(fresh, sequences, scored=scored)
    limited = quantize.quantize_model_dir(tiny_model_dir, tmp_path / "copy-2", scheme_name="int8", eval_path=eval_file,
                                          eval_data_kind="preference", eval_limit=2)
    assert limited["eval_sequences"] == 2


def test_a_checkpoints_copy_is_written_inside_its_export_and_scored_on_the_runs_eval_set(tiny_model_dir, tmp_path):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(tiny_model_dir, run_dir / "export-step-3")
    eval_file = write_jsonl(tmp_path / "eval.jsonl", [{"prompt": "Hello there", "completion": " general"},
                                                      {"prompt": "a b c", "completion": " d e"}])
    (run_dir / "spec.yaml").write_text(f"task: sft\nmodel: {tiny_model_dir}\noutput_dir: {run_dir}\n"
                                       f"data: {{train: {eval_file}, eval: {eval_file}}}\ntrain: {{max_steps: 1}}\n")
    description = quantize.quantize_run_export(run_dir, scheme_name="int4", model_dir=run_dir / "export-step-3")
    assert quantize.is_quantized_dir(run_dir / "export-step-3" / "quantized") and not (run_dir / "export").exists()
    assert description["scheme"] == "int4" and description["group_size"] == quantize.DEFAULT_INT4_GROUP_SIZE
    assert description["eval_sequences"] == 2 and 0 <= description["greedy_agreement"] <= 1
    assert description["ratio_to_bfloat16"] < 0.6  # int4 codes: a quarter of bfloat16's bytes, plus the scales


def test_a_failed_copy_leaves_the_earlier_copy_whole_and_nothing_half_written(tiny_model_dir, tmp_path, monkeypatch):
    out = tmp_path / "export" / "quantized"
    quantize.export_quantized(tiny_model_dir, out, scheme=QuantScheme.named("int8"))
    save = quantize.save_quantized

    def save_then_fail(model, config, out_dir, **kwargs):
        save(model, config, out_dir, **kwargs)  # every file written, then the disk fills up
        raise OSError("No space left on device")

    monkeypatch.setattr(quantize, "save_quantized", save_then_fail)
    with pytest.raises(OSError, match="No space left"):
        quantize.export_quantized(tiny_model_dir, out, scheme=QuantScheme.named("int4"))
    assert quantize.load_quantized(out)[2]["scheme"] == "int8"  # the earlier copy still serves, whole
    assert sorted(path.name for path in out.parent.iterdir()) == ["quantized"]
    monkeypatch.setattr(quantize, "save_quantized", save)
    quantize.export_quantized(tiny_model_dir, out, scheme=QuantScheme.named("int4"))  # made again: replaced
    assert quantize.load_quantized(out)[2]["scheme"] == "int4"
    assert sorted(path.name for path in out.parent.iterdir()) == ["quantized"]


def test_a_copy_is_never_seen_half_written(tiny_model_dir, tmp_path, monkeypatch):
    # While the files are written, the served directory has no quantization.json (a server would take the
    # unquantized model): the copy is written aside and renamed into place whole.
    out = tmp_path / "quantized"
    seen = []
    save = quantize.save_quantized

    def save_and_look(model, config, out_dir, **kwargs):
        written = save(model, config, out_dir, **kwargs)
        seen.append((Path(out_dir) != out, quantize.is_quantized_dir(out)))
        return written

    monkeypatch.setattr(quantize, "save_quantized", save_and_look)
    quantize.export_quantized(tiny_model_dir, out, scheme=QuantScheme.named("int8"))
    assert seen == [(True, False)] and quantize.is_quantized_dir(out)


@pytest.mark.parametrize("content", [b"\xff\xfe{}", b'{"format": ', b"[1, 2]"], ids=["not UTF-8", "not JSON", "a list"])
def test_a_damaged_quantization_json_is_named_by_inspect_and_generate(tiny_model_dir, tmp_path, capsys, content):
    """QA: a serving copy whose quantization.json was damaged (not UTF-8, cut short, not an object) was a
    traceback from ``generate`` and the serve worker's load (and a message without the file's line from
    ``inspect``); both name the file, the problem and the remedy now."""
    from jaxengine.cli import main

    out = tmp_path / "copy"
    quantize.quantize_model_dir(tiny_model_dir, out, scheme_name="int8")
    (out / "quantization.json").write_bytes(content)
    problem = {b"\xff\xfe{}": "not UTF-8 text (byte 0 is not valid UTF-8)",
               b'{"format": ': "line 1: not valid JSON (Expecting value)",
               b"[1, 2]": "expected a JSON object at the top level, found list"}[content]
    expected = f"{out / 'quantization.json'}: {problem}; export the serving copy again"
    with pytest.raises(quantize.QuantizationError) as caught:
        quantize.load_quantized(out)
    assert str(caught.value) == expected
    capsys.readouterr()
    for command in (["inspect", "--model", str(out)], ["generate", "--model", str(out), "--prompt", "x", "--max-new-tokens", "2"]):
        assert main(command) == 2
        assert capsys.readouterr().err == f"jaxengine {command[0]}: error: {expected}\n"


def live_programs() -> int:
    return len(jax.devices()[0].client.live_executables())


def test_serving_copies_of_many_structures_leave_no_programs_behind(tmp_path):
    """The serve worker writes serving copies (``worker.tasks.serve.quantize_run``, ``make_serving_copy``) for as
    long as it lives: the scoring programs of every model structure it had measured stayed compiled (module-level
    ``nnx.jit`` of perplexity and greedy agreement, the sampler's 16 structures kept), each with memory maps of its
    own, towards vm.max_map_count (bench/RESULTS.md, "The serve worker's compiled programs"). Copies of four
    structures (contexts), one after another, leave no more live programs than the first two."""
    rows = [{"prompt": "Hello world", "completion": " and goodbye"}, {"prompt": "the quick", "completion": " fox"}]
    counts = []
    for context in (128, 144, 160, 176):
        model_dir = factories.build_tiny_model_dir(tmp_path / f"context-{context}", context=context)
        quantize.export_quantized(model_dir, tmp_path / f"int8-{context}", scheme=QuantScheme.named("int8"),
                                  eval_rows=rows, eval_kind="sft", max_new_tokens=4)
        gc.collect()  # a holder of jitted methods and its functions form a cycle
        counts.append(live_programs())
    assert counts[-1] <= counts[1], counts


@pytest.fixture(scope="module")
def int4_copy(tiny_model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("int4-copy") / "copy"
    quantize.quantize_model_dir(tiny_model_dir, out, scheme_name="int4", group_size=32)
    return out


def _retensored(name: str, change):
    def damage(copy: Path) -> None:
        from safetensors.numpy import load_file, save_file

        tensors = load_file(copy / "model.safetensors")
        tensors[name] = change(tensors[name])
        save_file(tensors, copy / "model.safetensors", metadata={"format": quantize.FORMAT_NAME})
    return damage


def _reconfigured(file: str, **fields):
    def damage(copy: Path) -> None:
        import json

        (copy / file).write_text(json.dumps({**json.loads((copy / file).read_text()), **fields}))
    return damage


@pytest.mark.parametrize("damage, problem", [
    (_retensored("model.layers.1.self_attn.q_proj.qweight", lambda codes: codes[:, :64]),
     "{copy}/config.json does not describe the weights: 'model.layers.1.self_attn.q_proj.qweight' in "
     "{copy}/model.safetensors has shape [32, 64] in its header, [32, 128] from config.json and quantization.json "
     "(num_attention_heads × head_dim = 4 × 32); correct the config.json fields named, or make the serving copy "
     "again from the model it was made from"),
    (_retensored("model.layers.1.mlp.down_proj.scales", lambda scales: scales[:2]),
     "{copy}/config.json does not describe the weights: 'model.layers.1.mlp.down_proj.scales' in "
     "{copy}/model.safetensors has shape [2, 64] in its header, [4, 64] from config.json and quantization.json "
     "(intermediate_size = 128 / group_size 32); correct the config.json fields named, or make the serving copy "
     "again from the model it was made from"),
    (_reconfigured("config.json", num_hidden_layers=3),
     "{copy}/config.json: num_hidden_layers is 3, but the weights hold 2 layers (the last, layer 1, in "
     "{copy}/model.safetensors); set num_hidden_layers to 2, or make the serving copy again from the model it was "
     "made from"),
    (_reconfigured("quantization.json", group_size=48),
     "{copy}/quantization.json: group_size 48 (int4) does not divide the input width 64 of "
     "'layers.0.self_attn.q_proj.weight' (hidden_size = 64); make the serving copy again from the model it was "
     "made from"),
    (_reconfigured("quantization.json", bits=3),
     "{copy}/quantization.json: quantize bits: 3 is not one of 8, 4; export the serving copy again"),
], ids=["codes-cut-short", "scales-cut-short", "config-layers", "group-size-edited", "bits-edited"])
def test_a_damaged_serving_copy_is_named_before_its_model_is_built(int4_copy, tmp_path, capsys, damage, problem):
    """Issue: load_quantized read a copy's codes and scales without the loader's header check against config.json:
    a tensor cut short or a config.json edited loaded, to fail as a shape error deep in jax at the first token (or
    to answer wrongly). Now named: file, tensor, both shapes and the fields that size it, by the loader's check."""
    import shutil

    from jaxengine.cli import main

    copy = shutil.copytree(int4_copy, tmp_path / "copy")
    damage(copy)
    expected = problem.format(copy=copy)
    with pytest.raises(quantize.QuantizationError) as caught:
        quantize.load_quantized(copy)
    assert str(caught.value) == expected
    capsys.readouterr()
    for command in (["inspect", "--model", str(copy)],
                    ["generate", "--model", str(copy), "--prompt", "x", "--max-new-tokens", "2"]):
        assert main(command) == 2
        assert capsys.readouterr().err == f"jaxengine {command[0]}: error: {expected}\n"
