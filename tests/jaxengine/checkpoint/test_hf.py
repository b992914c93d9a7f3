"""Hugging Face checkpoints: sharded loading, errors people can act on, and bit-exact round trips."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors.numpy import load_file, save_file

from jaxengine.checkpoint.hf import CheckpointError, load_hf_model, save_hf_model
from jaxengine.models import UnsupportedArchitectureError
from tests import factories


def read_all_tensors(model_dir: Path) -> dict[str, np.ndarray]:
    tensors = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    return tensors


def our_logits(model, ids_bt: np.ndarray) -> np.ndarray:
    positions_bt = np.broadcast_to(np.arange(ids_bt.shape[1], dtype=np.int32), ids_bt.shape)
    logits, _ = model(jnp.asarray(ids_bt, jnp.int32), jnp.asarray(positions_bt))
    return np.asarray(logits)


def reference_logits(model_dir: Path, ids_bt: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return factories.load_hf_reference(model_dir)(torch.tensor(ids_bt)).logits.numpy()


IDS_BT = np.random.RandomState(5).randint(3, 256, size=(2, 10))


def copy_model_dir(source: Path, destination: Path) -> Path:
    shutil.copytree(source, destination)
    return destination


def test_sharded_checkpoint_loads(sharded_tiny_hf_model_dir):
    files = sorted(p.name for p in sharded_tiny_hf_model_dir.glob("*.safetensors"))
    assert (sharded_tiny_hf_model_dir / "model.safetensors.index.json").exists() and len(files) > 1
    model, _ = load_hf_model(sharded_tiny_hf_model_dir)
    difference = our_logits(model, IDS_BT) - reference_logits(sharded_tiny_hf_model_dir, IDS_BT)
    assert np.abs(difference).max() <= 1e-4


@pytest.mark.parametrize("damage", ["cut short", "not safetensors"])
def test_a_corrupt_weights_file_is_named(tiny_hf_model_dir, tmp_path, damage):
    """QA: a model.safetensors cut short (a copy that did not finish) or not one at all said only
    "Error while deserializing header: ..." from generate, eval and train, naming no file."""
    model_dir = copy_model_dir(tiny_hf_model_dir("llama"), tmp_path / "model")
    weights = model_dir / "model.safetensors"
    if damage == "cut short":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    else:
        weights.write_bytes(b"\x00" * 4096)
    with pytest.raises(CheckpointError, match=rf"^{weights}: cut short or not a safetensors file \(Error while "
                                              r"deserializing header: .*\); copy or convert the weights again$"):
        load_hf_model(model_dir)


@pytest.mark.parametrize("index_text", ['{"weight_map": ', '{"metadata": {}}', '["model-1.safetensors"]',
                                        '{"weight_map": {"model.embed_tokens.weight": 3}}'])
def test_an_index_that_is_not_a_weight_map_is_named(sharded_tiny_hf_model_dir, tmp_path, index_text):
    """QA: a model.safetensors.index.json that is not JSON, or has no "weight_map" of file names, was a
    JSONDecodeError / KeyError traceback from generate and train."""
    model_dir = copy_model_dir(sharded_tiny_hf_model_dir, tmp_path / "model")
    index = model_dir / "model.safetensors.index.json"
    index.write_text(index_text)
    with pytest.raises(CheckpointError, match=rf"^{index}: not a safetensors index \(.+\); it must be a JSON object "
                                              r"whose \"weight_map\" maps each tensor name to its file$"):
        load_hf_model(model_dir)


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_a_vocab_size_the_embedding_does_not_have_is_named_with_both_numbers(kind, tiny_hf_model_dir, tmp_path):
    """QA: config.json's vocab_size is the embedding's rows in every family (Llama, Qwen, Gemma pad the
    embedding and state the padded size there); a mismatch was a bare shape mismatch."""
    model_dir = copy_model_dir(tiny_hf_model_dir(kind), tmp_path / "model")
    config = json.loads((model_dir / "config.json").read_text())
    rows = config["vocab_size"]
    config["vocab_size"] = rows + 8
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as error:
        load_hf_model(model_dir)
    assert str(error.value) == (
        f"{model_dir / 'config.json'}: vocab_size is {rows + 8}, but 'model.embed_tokens.weight' in "
        f"{model_dir / 'model.safetensors'} has {rows} rows (one per token id); set vocab_size to {rows}, or use "
        "the weights this config.json was written for")


def test_unsupported_architecture_is_named(tiny_hf_model_dir, tmp_path):
    model_dir = copy_model_dir(tiny_hf_model_dir("llama"), tmp_path / "model")
    config = json.loads((model_dir / "config.json").read_text())
    config.update(architectures=["PhiForCausalLM"], model_type="phi")
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError, match=r"config.json: architectures=\['PhiForCausalLM'\] "
                                                           r"\(model_type='phi'\) is not supported; supported "
                                                           r"architectures: LlamaForCausalLM, "):
        load_hf_model(model_dir)


def test_missing_weights_file_says_what_is_there(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(factories.TINY_HF_CONFIGS["llama"]))
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"no model.safetensors or model.safetensors.index.json found "
                                              r"\(directory holds \['config.json', 'pytorch_model.bin'\]\)"):
        load_hf_model(tmp_path)


@pytest.mark.parametrize("kind", ["llama", "llama-untied", "gemma3"])
def test_save_round_trip_is_bit_exact_and_transformers_loads_it(kind, tiny_hf_model_dir, tmp_path):
    source = copy_model_dir(tiny_hf_model_dir(kind), tmp_path / "source")
    (source / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": [2, 3]}))
    model, config = load_hf_model(source)
    out_dir = save_hf_model(model, config, tmp_path / "saved", source_dir=source)

    original, saved = read_all_tensors(source), read_all_tensors(out_dir)
    assert sorted(saved) == sorted(original)
    for name, array in original.items():
        assert saved[name].dtype == array.dtype and np.array_equal(saved[name], array), name
    assert json.loads((out_dir / "generation_config.json").read_text())["eos_token_id"] == [2, 3]

    reloaded, reloaded_config = load_hf_model(out_dir)
    assert reloaded_config == config
    assert np.abs(reference_logits(out_dir, IDS_BT) - our_logits(model, IDS_BT)).max() <= 1e-4
    assert np.array_equal(our_logits(reloaded, IDS_BT), our_logits(model, IDS_BT))


def test_bfloat16_round_trip_and_sharded_save(tiny_hf_model_dir, tmp_path):
    model, config = load_hf_model(tiny_hf_model_dir("qwen3"), param_dtype=jnp.bfloat16)
    out_dir = save_hf_model(model, config, tmp_path / "saved", max_shard_bytes=20_000)
    index = json.loads((out_dir / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert json.loads((out_dir / "config.json").read_text())["dtype"] == "bfloat16"

    reloaded, _ = load_hf_model(out_dir, param_dtype=jnp.bfloat16)
    for (path, before), (_, after) in zip(nnx.to_flat_state(nnx.state(model, nnx.Param)),
                                          nnx.to_flat_state(nnx.state(reloaded, nnx.Param))):
        assert after[...].dtype == jnp.bfloat16 and np.array_equal(np.asarray(after[...]), np.asarray(before[...])), path
    hf_model = factories.load_hf_reference(out_dir)
    assert sum(p.numel() for p in hf_model.parameters()) == sum(a.size for a in read_all_tensors(out_dir).values())


def test_gemma3_multimodal_checkpoint_loads_its_text_model(tiny_hf_model_dir, tmp_path):
    """A Gemma3ForConditionalGeneration directory: text_config and 'model.language_model.' tensor names."""
    source = tiny_hf_model_dir("gemma3")
    model_dir = tmp_path / "multimodal"
    model_dir.mkdir()
    text_config = json.loads((source / "config.json").read_text())
    config = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
              "text_config": text_config, "vision_config": {"model_type": "siglip_vision_model"}}
    (model_dir / "config.json").write_text(json.dumps(config))
    tensors = {name.replace("model.", "model.language_model.", 1): array
               for name, array in load_file(str(source / "model.safetensors")).items()}
    tensors["model.vision_tower.vision_model.post_layernorm.weight"] = np.ones(8, np.float32)
    save_file(tensors, str(model_dir / "model.safetensors"))

    model, loaded_config = load_hf_model(model_dir)
    assert loaded_config.family == "gemma3" and loaded_config.layer_types == ("sliding_attention", "full_attention")
    assert np.abs(our_logits(model, IDS_BT) - reference_logits(source, IDS_BT)).max() <= 1e-4


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_saved_weights_are_as_readable_as_the_umask_allows(umask, tiny_hf_model_dir, tmp_path):
    # safetensors 0.8 writes its files 0600 whatever the umask: a web server or teammate running as
    # another user could not read an export, unlike the config and tokenizer files beside it.
    import os

    source = tiny_hf_model_dir("llama")
    model, config = load_hf_model(source)
    previous = os.umask(umask)
    try:
        out = save_hf_model(model, config, tmp_path / "out", source_dir=source)
        sharded = save_hf_model(model, config, tmp_path / "sharded", source_dir=source, max_shard_bytes=20_000)
    finally:
        os.umask(previous)
    files = [out / "model.safetensors", *sharded.glob("model-*-of-*.safetensors")]
    assert len(files) > 2
    assert {file.stat().st_mode & 0o777 for file in files} == {0o666 & ~umask}
    assert (out / "config.json").stat().st_mode & 0o777 == 0o666 & ~umask
