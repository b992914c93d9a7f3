"""Language-model loss on the gathered loss positions only, against the full [B, T] computation (1e-5)."""
import json

import jax
import numpy as np
import pytest
from flax import nnx

from jaxengine.data.pipeline import Example, make_batch, stack_batches
from jaxengine.models import build_model, preset
from jaxengine.peft.lora import LoraParam, apply_lora
from jaxengine.spec import OptimSpec
from jaxengine.tasks import LanguageModelTask, loss_position_bucket
from jaxengine.trainer import Trainer, TrainConfig

TOL = 1e-5


def prompted_examples(count=8, seed=0):
    """Rows of 5..20 tokens whose loss covers only a completion after a 3..8-token prompt."""
    rng = np.random.default_rng(seed)
    made = []
    for _ in range(count):
        length, prompt = int(rng.integers(5, 21)), int(rng.integers(3, 9))
        ids = rng.integers(3, 200, size=length).astype(np.int32)
        made.append(Example(ids=ids, loss_mask=np.arange(length) >= min(prompt, length - 1)))
    return made


class EveryPosition(LanguageModelTask):
    """The same task without the gathering (the trainer's ``for_batches`` leaves it as it is)."""

    def for_batches(self, batches):
        return self


def test_bucket_rounds_up_to_eighths_of_the_positions():
    assert [loss_position_bucket(count, 2048) for count in (0, 1, 256, 257, 1024, 1800, 2048)] == [
        256, 256, 256, 512, 1024, 2048, 2048]
    assert loss_position_bucket(3, 20) == 3 and loss_position_bucket(4, 20) == 6 and loss_position_bucket(19, 20) == 20


def test_for_batches_counts_the_fullest_micro_batch():
    first = make_batch(prompted_examples(4, seed=1), max_seq_len=32, pad_id=0)
    second = make_batch(prompted_examples(4, seed=2), max_seq_len=32, pad_id=0)
    stacked = stack_batches([first, second], pad_id=0)
    most = max(int(np.sum(first.loss_mask)), int(np.sum(second.loss_mask)))
    rows, length = stacked.loss_mask.shape[1:]
    task = LanguageModelTask().for_batches(stacked)
    assert task.loss_positions == loss_position_bucket(most, rows * length) >= most


@pytest.mark.parametrize("unpacked", [False, True])
def test_gathered_loss_and_gradients_equal_the_full_ones(unpacked):
    model = build_model(preset("tiny-llama"), rngs=nnx.Rngs(0))
    apply_lora(model, targets=("q_proj", "v_proj", "up_proj", "down_proj"), rank=4, alpha=8)
    # LoRA B starts at zero, which would make most gradients vanish; give the adapters values.
    for path, variable in nnx.iter_graph(model):
        if isinstance(variable, LoraParam):
            variable[...] = 0.1 * jax.random.normal(jax.random.key(len(path)), variable[...].shape)
    batch = make_batch(prompted_examples(), max_seq_len=32, pad_id=0)
    graphdef, params, rest = nnx.split(model, LoraParam, ...)
    full = EveryPosition(unpacked=unpacked)
    gathered = LanguageModelTask(unpacked=unpacked, logits_memory_budget=0, chunk_size=16).for_batches(batch)
    assert gathered.loss_positions < batch.loss_mask.size

    def loss_of(task):
        def loss(params):
            loss, weight, _ = task.loss(nnx.merge(graphdef, params, rest), batch)
            return loss, weight
        return jax.value_and_grad(loss, has_aux=True)(params)

    (full_loss, full_weight), full_grads = loss_of(full)
    (loss, weight), grads = loss_of(gathered)
    assert float(weight) == float(full_weight) == float(np.sum(batch.loss_mask))
    assert abs(float(loss) - float(full_loss)) <= TOL
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(full_grads)):
        np.testing.assert_allclose(got, want, atol=TOL)
    assert max(float(np.abs(g).max()) for g in jax.tree.leaves(full_grads)) > 1e-3


def test_trainer_steps_and_evaluation_match_the_full_computation(tmp_path):
    """Through Trainer.fit with gradient accumulation: the logged metrics of both tasks agree."""
    def run(task, run_dir):
        config = TrainConfig(total_steps=3, batch_size=4, grad_accum=2, max_seq_len=32, eval_every=3,
                             optim=OptimSpec(learning_rate=3e-3, schedule="constant"))
        trainer = Trainer(model=build_model(preset("tiny-llama"), rngs=nnx.Rngs(0)), task=task, config=config,
                          train_examples=prompted_examples(24), eval_examples=prompted_examples(6, seed=5),
                          pad_id=0, run_dir=run_dir)
        trainer.fit(progress_bar=False)
        return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]

    gathered, full = run(LanguageModelTask(), tmp_path / "gathered"), run(EveryPosition(), tmp_path / "full")
    for mine, theirs in zip(gathered, full):
        for name in ("loss", "grad_norm", "eval/loss"):
            if name in theirs:
                assert abs(mine[name] - theirs[name]) <= TOL, (name, mine[name], theirs[name])
    assert "eval/loss" in gathered[-1]
