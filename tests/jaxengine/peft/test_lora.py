"""LoRA: identity at init, merge == adapter, unmerge restores, peft loads our export with our logits."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxengine.checkpoint.hf import load_hf_model
from jaxengine.models import build_model, preset
from jaxengine.peft import lora
from tests.factories import make_tiny_hf_model

TARGETS = ("q_proj", "v_proj", "o_proj", "gate_proj", "down_proj")


def randomize_adapters(model, seed=1):
    """Give every B a random value so the adapters change the output (at init they are exact zeros)."""
    key = jax.random.key(seed)
    for _, module in nnx.iter_modules(model):
        if isinstance(module, lora.LoraAdapter):
            key, sub = jax.random.split(key)
            module.lora_b[...] = 0.2 * jax.random.normal(sub, module.lora_b[...].shape)


def forward(model, ids):
    positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
    return model(ids, positions)[0]


IDS = jnp.array([[3, 17, 42, 9, 100, 7, 1, 55]], jnp.int32)


def test_a_fresh_adapter_changes_nothing_and_only_targets_get_one():
    model = build_model(preset("tiny-llama"), rngs=nnx.Rngs(0))
    base = forward(model, IDS)
    count = lora.apply_lora(model, targets=TARGETS, rank=4, alpha=8)
    assert count == len(TARGETS) * model.config.num_layers
    np.testing.assert_array_equal(forward(model, IDS), base)
    assert model.layers[0].self_attn.k_proj.lora is None and model.layers[0].mlp.up_proj.lora is None
    adapters = jax.tree.leaves(nnx.state(model, lora.LoraParam))
    assert len(adapters) == 2 * count
    assert not any(isinstance(v, lora.LoraParam) for v in jax.tree.leaves(nnx.state(model, nnx.Param),
                                                                             is_leaf=lambda x: isinstance(x, nnx.Variable)))


def test_merge_equals_the_adapter_and_unmerge_restores_the_base():
    model = build_model(preset("tiny-qwen3"), rngs=nnx.Rngs(0))
    kernel_before = np.asarray(model.layers[1].self_attn.q_proj.kernel[...]).copy()
    lora.apply_lora(model, targets=TARGETS, rank=4, alpha=16)
    randomize_adapters(model)
    with_adapter = forward(model, IDS)
    lora.merge_lora(model)
    assert not np.allclose(model.layers[1].self_attn.q_proj.kernel[...], kernel_before)
    np.testing.assert_allclose(forward(model, IDS), with_adapter, atol=1e-5)
    lora.unmerge_lora(model)
    np.testing.assert_allclose(model.layers[1].self_attn.q_proj.kernel[...], kernel_before, atol=1e-6)
    np.testing.assert_allclose(forward(model, IDS), with_adapter, atol=1e-5)


def test_it_rejects_unknown_targets():
    model = build_model(preset("tiny-llama"), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="are not projections"):
        lora.apply_lora(model, targets=["qkv"], rank=2, alpha=2)


def test_peft_loads_our_adapter_and_gives_our_logits(tmp_path):
    torch = pytest.importorskip("torch")
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base_dir = make_tiny_hf_model("llama", tmp_path / "base")
    model, _ = load_hf_model(base_dir)
    lora.apply_lora(model, targets=lora.PROJECTIONS, rank=4, alpha=8)
    randomize_adapters(model)
    ours = np.asarray(forward(model, IDS))
    lora.save_peft_adapter(model, tmp_path / "adapter", base_model=str(base_dir), rank=4, alpha=8, dropout=0.0,
                           targets=lora.PROJECTIONS)
    reference = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32, attn_implementation="eager")
    reference = PeftModel.from_pretrained(reference, tmp_path / "adapter").eval()
    with torch.no_grad():
        theirs = reference(torch.tensor(np.asarray(IDS), dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(ours, theirs, atol=1e-4)


def test_lora_dropout_trains_reproducibly_and_is_off_in_eval(tmp_path):
    from jaxengine.data.pipeline import Example
    from jaxengine.spec import OptimSpec
    from jaxengine.tasks import LanguageModelTask
    from jaxengine.trainer import Trainer, TrainConfig

    examples = [Example(ids=np.arange(i, i + 12, dtype=np.int32) % 200 + 3, loss_mask=np.ones(12, np.bool_))
                for i in range(16)]

    def run(name, dropout=0.5):
        model = build_model(preset("tiny-llama"), rngs=nnx.Rngs(0))
        lora.apply_lora(model, targets=TARGETS, rank=4, alpha=8, dropout=dropout, seed=3)
        config = TrainConfig(total_steps=3, batch_size=4, max_seq_len=16, optim=OptimSpec(learning_rate=1e-2))
        trainer = Trainer(model=model, task=LanguageModelTask(), config=config, train_examples=examples,
                          pad_id=0, run_dir=tmp_path / name, trainable=lora.LoraParam)
        trainer.fit(progress_bar=False)
        return (tmp_path / name / "metrics.jsonl").read_text(), trainer.current_model()

    def losses_of(text):
        return [json.loads(line)["loss"] for line in text.splitlines()]

    first, trained = run("a")
    second, _ = run("b")
    assert losses_of(first) == losses_of(second)  # the dropout masks come from the seeded RNG state
    without, _ = run("c", dropout=0.0)
    assert losses_of(without)[0] == pytest.approx(losses_of(first)[0], abs=1e-6)  # B = 0: adapters add nothing yet
    assert losses_of(without)[2] != pytest.approx(losses_of(first)[2], abs=1e-6)  # then dropout changes the updates
    np.testing.assert_array_equal(forward(trained, IDS), forward(trained, IDS))  # eval mode: no dropout
