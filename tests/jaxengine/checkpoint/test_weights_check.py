"""config.json against its weights, from the safetensors headers, before any model is built
(``jaxengine.checkpoint.weights_check``): what the loader, ``jaxengine inspect`` and registration refuse."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from jaxengine.checkpoint.hf import CheckpointError, hf_weight_name, load_hf_model, read_hf_config
from jaxengine.checkpoint.weights_check import check_weights_match_config, expected_tensors
from jaxengine.models import build_model, family_module, preset
from tests import factories


def copy_model_dir(source: Path, destination: Path) -> Path:
    shutil.copytree(source, destination)
    return destination


def edit_config(model_dir: Path, **fields) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    config.update(fields)
    (model_dir / "config.json").write_text(json.dumps(config))


def edit_tensors(model_dir: Path, edit) -> None:
    tensors = load_file(str(model_dir / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(model_dir / "model.safetensors"))


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3", "llama3.2-1b",
                                  "qwen2.5-0.5b", "gemma3-270m"])
def test_the_tensors_a_config_implies_are_those_the_model_is_built_with(name):
    config = preset(name)
    built = nnx.eval_shape(lambda: build_model(config, rngs=nnx.Rngs(0)))
    from_model = {}
    for path, variable in nnx.to_flat_state(nnx.state(built, nnx.Param)):
        hf_name, transposed = hf_weight_name(path)
        from_model[hf_name] = tuple(reversed(variable.shape)) if transposed else tuple(variable.shape)
    prefix = family_module(config.family).WEIGHT_PREFIXES[0]
    listed = {(prefix if tensor.prefixed else "") + tensor.name: tensor.shape for tensor in expected_tensors(config)}
    assert listed == from_model


@pytest.mark.parametrize("kind", factories.TINY_KINDS)
def test_transformers_checkpoints_of_every_family_pass(kind, tiny_hf_model_dir):
    model_dir = tiny_hf_model_dir(kind)
    hf_config, config = read_hf_config(model_dir)
    check_weights_match_config(model_dir, hf_config, config)


def test_a_sharded_checkpoint_passes(sharded_tiny_hf_model_dir):
    hf_config, config = read_hf_config(sharded_tiny_hf_model_dir)
    check_weights_match_config(sharded_tiny_hf_model_dir, hf_config, config)


def test_a_million_layers_is_refused_before_anything_is_built(tiny_hf_model_dir, tmp_path):
    """QA: ``num_hidden_layers: 1000000`` had the loader build the model; the process was killed for memory."""
    model_dir = copy_model_dir(tiny_hf_model_dir("llama"), tmp_path / "model")
    edit_config(model_dir, num_hidden_layers=1_000_000)
    started = time.monotonic()
    with pytest.raises(CheckpointError) as error:
        load_hf_model(model_dir)
    assert time.monotonic() - started < 5
    assert str(error.value) == (
        f"{model_dir / 'config.json'}: num_hidden_layers is 1000000, but the weights hold 2 layers (the last, layer 1, "
        f"in {model_dir / 'model.safetensors'}); set num_hidden_layers to 2, or use the weights this config.json was "
        "written for")


def test_layers_beyond_num_hidden_layers_are_named(tiny_hf_model_dir, tmp_path):
    model_dir = copy_model_dir(tiny_hf_model_dir("qwen3"), tmp_path / "model")
    edit_config(model_dir, num_hidden_layers=1)
    with pytest.raises(CheckpointError) as error:
        load_hf_model(model_dir)
    assert str(error.value).startswith(
        f"{model_dir / 'config.json'}: num_hidden_layers is 1, but 'model.layers.1.")
    assert str(error.value).endswith(
        f" in {model_dir / 'model.safetensors'} is layer 1: the weights hold 2 layers; set num_hidden_layers to 2, "
        "or use the weights this config.json was written for")


def test_an_extra_layers_tensors_are_named_too(tiny_hf_model_dir, tmp_path):
    """A layer's worth of tensors beyond the config's count (here only one of them) is not silently left out."""
    model_dir = copy_model_dir(tiny_hf_model_dir("llama"), tmp_path / "model")
    edit_tensors(model_dir, lambda tensors: tensors.update(
        {"model.layers.7.mlp.up_proj.weight": tensors["model.layers.0.mlp.up_proj.weight"]}))
    with pytest.raises(CheckpointError, match=r"num_hidden_layers is 2, but 'model.layers.7.mlp.up_proj.weight' in "
                                              r".*model.safetensors is layer 7: the weights hold 8 layers"):
        load_hf_model(model_dir)


def test_a_hidden_size_off_the_weights_names_the_first_tensors_shapes_and_the_field(tiny_hf_model_dir, tmp_path):
    model_dir = copy_model_dir(tiny_hf_model_dir("llama"), tmp_path / "model")
    hidden = json.loads((model_dir / "config.json").read_text())["hidden_size"]
    edit_config(model_dir, hidden_size=hidden * 1000, head_dim=hidden // 4)
    with pytest.raises(CheckpointError) as error:
        load_hf_model(model_dir)
    weights = model_dir / "model.safetensors"
    message = str(error.value)
    assert message.startswith(
        f"{model_dir / 'config.json'} does not describe the weights: 'model.embed_tokens.weight' in {weights} has "
        f"shape [256, {hidden}] in its header, [256, {hidden * 1000}] from config.json (hidden_size = {hidden * 1000}); "
        f"'model.layers.0.input_layernorm.weight' in {weights} has shape [{hidden}] in its header, [{hidden * 1000}] "
        f"from config.json (hidden_size = {hidden * 1000}); ")
    assert message.endswith(" more; correct the config.json fields named, or use the weights this config.json was "
                            "written for")


def test_an_intermediate_size_off_the_weights_is_named(tiny_hf_model_dir, tmp_path):
    model_dir = copy_model_dir(tiny_hf_model_dir("qwen2"), tmp_path / "model")
    edit_config(model_dir, intermediate_size=96)
    with pytest.raises(CheckpointError, match=r"'model.layers.0.mlp.gate_proj.weight' in .*model.safetensors has "
                                              r"shape \[128, 64\] in its header, \[96, 64\] from config.json "
                                              r"\(intermediate_size = 96\)"):
        load_hf_model(model_dir)


def test_a_missing_layer_tensor_is_named(tiny_hf_model_dir, tmp_path):
    model_dir = copy_model_dir(tiny_hf_model_dir("llama"), tmp_path / "model")
    edit_tensors(model_dir, lambda tensors: tensors.pop("model.layers.1.mlp.down_proj.weight"))
    with pytest.raises(CheckpointError) as error:
        load_hf_model(model_dir)
    assert str(error.value) == (
        f"{model_dir / 'config.json'} does not describe the weights: 'model.layers.1.mlp.down_proj.weight' of shape "
        f"[64, 128] is missing from {model_dir / 'model.safetensors'}; correct the config.json fields named, or use "
        "the weights this config.json was written for")


def test_an_untied_head_the_weights_lack_names_tie_word_embeddings(tiny_hf_model_dir, tmp_path):
    model_dir = copy_model_dir(tiny_hf_model_dir("llama"), tmp_path / "model")
    edit_config(model_dir, tie_word_embeddings=False)
    with pytest.raises(CheckpointError, match=r"'lm_head.weight' of shape \[256, 64\] is missing from "
                                              r".*model.safetensors \(tie_word_embeddings is false\)"):
        load_hf_model(model_dir)


def test_a_sharded_checkpoints_mismatch_names_the_shard(sharded_tiny_hf_model_dir, tmp_path):
    model_dir = copy_model_dir(sharded_tiny_hf_model_dir, tmp_path / "model")
    edit_config(model_dir, num_attention_heads=8)  # head_dim unset: hidden_size / heads, 8 where the weights have 16
    with pytest.raises(CheckpointError, match=r"does not describe the weights: 'model.layers.0.self_attn.k_proj.weight' "
                                              r"in .*/model-\d+-of-\d+.safetensors has shape \[32, 64\] in its header, "
                                              r"\[16, 64\] from config.json \(num_key_value_heads × head_dim = 2 × 8\)"):
        load_hf_model(model_dir)
