"""Reading and writing Hugging Face config.json, presets, and config validation."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from flax import nnx
from transformers import AutoConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from jaxengine.models import (
    ModelConfig,
    RopeScaling,
    UnsupportedArchitectureError,
    build_model,
    param_count,
    preset,
    preset_names,
)
from jaxengine.models.config import PositionLimit, from_hf_config, position_limit, to_hf_config
from jaxengine.models.layers import rope_inverse_frequencies

REAL_PRESETS = ("gemma3-270m", "gemma3-1b", "llama3.2-1b", "qwen3-0.6b", "qwen2.5-0.5b")


def test_required_presets_exist():
    names = preset_names()
    for name in REAL_PRESETS + ("tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3"):
        assert name in names
    with pytest.raises(ValueError, match="unknown model preset 'nope'; known presets: .*gemma3-1b"):
        preset("nope")


@pytest.mark.parametrize("name", REAL_PRESETS + ("llama3.1-8b", "tiny-gemma3", "tiny-llama"))
def test_transformers_reads_our_config_json_as_we_do(name):
    """to_hf_config -> transformers config object -> its saved dict -> from_hf_config gives the preset back."""
    config = preset(name)
    hf_dict = to_hf_config(config)
    model_type = hf_dict.pop("model_type")
    hf_config = AutoConfig.for_model(model_type, **hf_dict)
    assert hf_config.num_hidden_layers == config.num_layers
    assert from_hf_config(hf_config.to_dict()) == config


def test_real_preset_sizes():
    """Parameter counts of the real presets match the published model sizes."""
    def count(config: ModelConfig) -> int:
        attention = config.hidden_size * config.head_dim * (2 * config.num_heads + 2 * config.num_kv_heads)
        mlp = 3 * config.hidden_size * config.intermediate_size
        embeddings = config.vocab_size * config.hidden_size * (1 if config.tie_word_embeddings else 2)
        return config.num_layers * (attention + mlp) + embeddings

    assert round(count(preset("llama3.2-1b")) / 1e9, 2) == 1.24
    assert round(count(preset("qwen3-0.6b")) / 1e9, 2) == 0.60
    assert round(count(preset("gemma3-1b")) / 1e9, 2) == 1.0
    assert round(count(preset("gemma3-270m")) / 1e6) == 268
    # The built model agrees with the formula (plus norm scales), without allocating weights.
    config = preset("qwen3-0.6b")
    abstract = nnx.eval_shape(lambda: build_model(config, rngs=nnx.Rngs(0)))
    norms = config.num_layers * (2 * config.hidden_size + 2 * config.head_dim) + config.hidden_size
    assert param_count(abstract) == count(config) + norms


def test_transformers_4_style_llama_config_reads_like_transformers_5():
    legacy = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
        "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 64, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "tie_word_embeddings": True, "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
        "hidden_act": "silu", "torch_dtype": "bfloat16",
    }
    assert from_hf_config(legacy) == preset("llama3.2-1b")


def test_gemma3_multimodal_config_reads_its_text_config_with_defaults():
    """A sparse Gemma3ForConditionalGeneration config (as gemma-3-4b-it ships) fills defaults like transformers."""
    multimodal = {
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "eos_token_id": [1, 106],
        "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                        "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                        "sliding_window": 1024},
        "vision_config": {"model_type": "siglip_vision_model"},
    }
    ours = from_hf_config(multimodal)
    text_config = AutoConfig.for_model("gemma3", **{k: v for k, v in multimodal.items() if k != "model_type"}).text_config
    theirs = from_hf_config(text_config.to_dict())
    assert ours == dataclasses.replace(theirs, eos_token_ids=(1, 106))
    assert ours.layer_types[:6] == ("sliding_attention",) * 5 + ("full_attention",)
    assert ours.rope_scaling == RopeScaling(rope_type="linear", factor=8.0)
    assert (ours.rope_theta, ours.local_rope_theta, ours.num_kv_heads, ours.head_dim) == (1e6, 1e4, 4, 256)


def test_gemma3_legacy_rope_fields():
    legacy = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 262144,
              "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26, "num_attention_heads": 4,
              "num_key_value_heads": 1, "head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 512,
              "sliding_window_pattern": 6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
              "rope_scaling": None, "max_position_embeddings": 32768, "eos_token_id": [1, 106]}
    assert from_hf_config(legacy) == preset("gemma3-1b")
    del legacy["sliding_window_pattern"]
    legacy["_sliding_window_pattern"] = 2  # the spelling some released configs use
    assert from_hf_config(legacy).layer_types[:4] == ("sliding_attention", "full_attention") * 2


def test_unsupported_architecture_names_found_and_supported():
    with pytest.raises(UnsupportedArchitectureError) as error:
        from_hf_config({"architectures": ["MistralForCausalLM"], "model_type": "mistral"}, source="/m/config.json")
    message = str(error.value)
    assert "/m/config.json" in message and "MistralForCausalLM" in message and "'mistral'" in message
    for supported in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Gemma3ForCausalLM"):
        assert supported in message


@pytest.mark.parametrize("changes, message", [
    (dict(num_kv_heads=3), "num_heads \\(4\\) must be a multiple of num_kv_heads \\(3\\)"),
    (dict(layer_types=("full_attention",)), "layer_types has 1 entries but num_layers=2"),
    (dict(layer_types=("full_attention", "sliding_attention")), "sliding_window must be set"),
    (dict(hidden_act="relu"), "hidden_act='relu' is not supported"),
    (dict(family="mistral"), "family='mistral' is not supported"),
])
def test_config_validation_names_the_field(changes, message):
    with pytest.raises(ValueError, match=message):
        preset("tiny-llama").replace(**changes)


@pytest.mark.parametrize("rope_parameters", [
    {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
    {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0},
])
def test_rope_frequencies_match_transformers(rope_parameters):
    hf_config = AutoConfig.for_model("llama", hidden_size=2048, num_attention_heads=16, head_dim=128,
                                     rope_parameters=dict(rope_parameters), max_position_embeddings=131072)
    expected, _ = ROPE_INIT_FUNCTIONS[rope_parameters["rope_type"]](hf_config, torch.device("cpu"))
    config = from_hf_config(dict(hf_config.to_dict(), architectures=["LlamaForCausalLM"]))
    ours = rope_inverse_frequencies(config.head_dim, config.rope_theta, config.rope_scaling)
    np.testing.assert_allclose(ours, expected.numpy(), rtol=1e-6)
    # The scaling really changes the low frequencies.
    assert not np.allclose(ours, rope_inverse_frequencies(128, config.rope_theta, None))


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3"])
def test_the_required_fields_the_web_checks_at_registration_are_the_ones_each_family_needs(name):
    """The web app refuses a config.json without REQUIRED_CONFIG_FIELDS at registration (jax-free); this
    holds that list to what each family's reader really cannot do without: each field left out fails it,
    and with all of them the rest is optional (Gemma 3 fills every field from its defaults)."""
    from jaxengine.models.config import REQUIRED_CONFIG_FIELDS

    config = preset(name)
    hf = to_hf_config(config)
    required = REQUIRED_CONFIG_FIELDS[config.family]
    for field in required:
        with pytest.raises((ValueError, KeyError, TypeError)):
            from_hf_config({key: value for key, value in hf.items() if key != field})
    minimal = {key: hf[key] for key in ("architectures", *required)}
    assert from_hf_config(minimal).family == config.family


LLAMA_31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 8192}


@pytest.mark.parametrize("config, positions, source", [
    ({"max_position_embeddings": 2048}, 2048, "max_position_embeddings 2048"),
    # Llama 3.1: the scaling's original is below max_position_embeddings, which is the extended range already.
    ({"max_position_embeddings": 131072, "rope_scaling": LLAMA_31_ROPE}, 131072, "max_position_embeddings 131072"),
    ({"max_position_embeddings": 131072, "rope_parameters": {**LLAMA_31_ROPE, "rope_theta": 5e5}}, 131072,
     "max_position_embeddings 131072"),
    # Qwen 2.5's YaRN: the original is max_position_embeddings, extended by the factor.
    ({"max_position_embeddings": 32768, "rope_scaling": {"type": "yarn", "factor": 4.0,
                                                         "original_max_position_embeddings": 32768}},
     131072, "max_position_embeddings 32768 × rope_scaling factor 4 (yarn)"),
    # Linear scaling naming no original stretches max_position_embeddings by its factor.
    ({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}, 8192,
     "max_position_embeddings 4096 × rope_scaling factor 2 (linear)"),
    ({"text_config": {"max_position_embeddings": 256, "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}}, 512,
     "max_position_embeddings 256 × rope_parameters.full_attention factor 2 (linear)"),
    # A factor of 1 or below, or a default rope, extends nothing.
    ({"max_position_embeddings": 2048, "rope_scaling": {"rope_type": "linear", "factor": 1.0}}, 2048,
     "max_position_embeddings 2048"),
    ({"max_position_embeddings": 2048, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, 2048,
     "max_position_embeddings 2048"),
])
def test_the_position_limit_is_max_position_embeddings_or_the_range_rope_scaling_extends_it_to(config, positions,
                                                                                                source):
    assert position_limit(config) == PositionLimit(positions=positions, source=source)


@pytest.mark.parametrize("config", [{}, {"max_position_embeddings": "2048"}, {"max_position_embeddings": True}])
def test_a_config_stating_no_whole_number_of_positions_has_no_limit(config):
    assert position_limit(config) is None
