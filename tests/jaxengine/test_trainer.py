"""The trainer: schedules by hand, loss goes down, accumulation is exact, resume is exact, NaN stops."""
import json
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxengine.data.pipeline import Example, epoch_order
from jaxengine.models import build_model, preset
from jaxengine.spec import OptimSpec
from jaxengine.tasks import LanguageModelTask
from jaxengine.trainer import (Checkpoints, EvalProgress, Trainer, TrainConfig, learning_rate_schedule,
                              memory_metrics)


def tiny_model(seed=0):
    return build_model(preset("tiny-llama"), rngs=nnx.Rngs(seed))


def patterned_examples(count=32, seed=0):
    """Sequences with a learnable rule (arithmetic progressions), lengths 6..15 (one padded width, one compile)."""
    rng = np.random.default_rng(seed)
    examples = []
    for i in range(count):
        n = int(rng.integers(6, 16))
        ids = (np.arange(n) * (i % 5 + 1) + i) % 60 + 3
        mask = np.arange(n) >= 2
        examples.append(Example(ids=ids.astype(np.int32), loss_mask=mask))
    return examples


def make_trainer(tmp_path, *, total_steps, batch_size=4, grad_accum=1, lr=3e-3, save_every=None, eval_every=None,
                 seed=0, examples=None, task=None, max_grad_norm=1.0):
    config = TrainConfig(total_steps=total_steps, batch_size=batch_size, grad_accum=grad_accum, max_seq_len=32,
                         eval_every=eval_every, save_every=save_every, seed=seed,
                         optim=OptimSpec(learning_rate=lr, warmup_steps=2, schedule="cosine", weight_decay=0.01,
                                         max_grad_norm=max_grad_norm))
    examples = examples or patterned_examples()
    return Trainer(model=tiny_model(), task=task or LanguageModelTask(), config=config, train_examples=examples,
                   eval_examples=examples[:6], pad_id=0, run_dir=tmp_path)


def read_metrics(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("kind", ["constant", "linear", "cosine"])
def test_schedules_by_hand(kind):
    schedule = learning_rate_schedule(OptimSpec(learning_rate=0.1, warmup_steps=4, schedule=kind), total_steps=14)
    warmup = [0.0, 0.025, 0.05, 0.075]
    progress = [(s - 4) / 10 for s in range(4, 15)]
    decayed = {
        "constant": [0.1 for _ in progress],
        "linear": [0.1 * (1 - p) for p in progress],
        "cosine": [0.1 * 0.5 * (1 + math.cos(math.pi * p)) for p in progress],
    }[kind]
    np.testing.assert_allclose([float(schedule(s)) for s in range(15)], warmup + decayed, atol=1e-7)


def test_adamw_clips_first_and_decays_only_matrices_apart_from_the_gradient_by_hand():
    """Two steps of the optimizer against AdamW written out (Loshchilov & Hutter): the gradients clipped to a global
    norm of max_grad_norm first (step 1's norm is 13, step 2's 0.5), Adam's bias-corrected moments, and the weight
    decay added to the update, not to the gradient (decoupled), on matrices only (not norm scales or biases). At 1e-5:
    float32's 1 - 0.999² keeps 4 significant digits."""
    from jaxengine.trainer import make_optimizer

    lr, decay, b1, b2, eps = 0.1, 0.5, 0.9, 0.999, 1e-8
    optim = OptimSpec(learning_rate=lr, schedule="constant", warmup_steps=0, weight_decay=decay, max_grad_norm=1.0)
    params = {"kernel": jnp.array([[1.0, -2.0]]), "scale": jnp.array([3.0])}
    gradients = [{"kernel": [[3.0, 4.0]], "scale": [12.0]}, {"kernel": [[0.3, 0.0]], "scale": [-0.4]}]
    optimizer = make_optimizer(optim, total_steps=10)
    state = optimizer.init(params)

    expected = {"kernel": [1.0, -2.0], "scale": [3.0]}
    moments = {name: [(0.0, 0.0)] * len(values) for name, values in expected.items()}
    for step, raw in enumerate(gradients, start=1):
        flat = {"kernel": raw["kernel"][0], "scale": raw["scale"]}
        norm = math.sqrt(sum(g * g for values in flat.values() for g in values))
        clip = min(1.0, 1.0 / norm)
        for name, values in flat.items():
            for i, g in enumerate(values):
                g *= clip
                m, v = moments[name][i]
                m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
                moments[name][i] = (m, v)
                adam = (m / (1 - b1**step)) / (math.sqrt(v / (1 - b2**step)) + eps)
                weight = expected[name][i]
                expected[name][i] = weight - lr * (adam + (decay * weight if name == "kernel" else 0.0))
        updates, state = optimizer.update({name: jnp.array(value) for name, value in raw.items()}, state, params)
        params = optax.apply_updates(params, updates)
        np.testing.assert_allclose(params["kernel"][0], expected["kernel"], rtol=0, atol=1e-5)
        np.testing.assert_allclose(params["scale"], expected["scale"], rtol=0, atol=1e-5)
        if step == 1:
            # Adam's first update is the gradient's sign: 1 - 0.1 (1 + 0.5 x 1); -2 - 0.1 (1 + 0.5 x -2), its decay
            # cancelling its step; the scale 3 - 0.1, undecayed.
            np.testing.assert_allclose(params["kernel"][0], [0.85, -2.0], rtol=0, atol=1e-5)
            np.testing.assert_allclose(params["scale"], [2.9], rtol=0, atol=1e-5)


def test_a_short_run_lowers_the_loss_and_writes_the_run_directory(tmp_path):
    trainer = make_trainer(tmp_path, total_steps=24, eval_every=12, save_every=12)
    summary = trainer.fit(progress_bar=False)
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    assert summary["status"] == "succeeded" and [m["step"] for m in metrics] == list(range(1, 25))
    assert np.mean([m["loss"] for m in metrics[-4:]]) < 0.7 * np.mean([m["loss"] for m in metrics[:4]])
    assert metrics[23]["eval/loss"] < metrics[11]["eval/loss"]
    for key in ("loss", "learning_rate", "grad_norm", "tokens_per_second"):
        assert math.isfinite(metrics[5][key])
    assert sorted(Checkpoints(tmp_path / "checkpoints", keep_last=3).steps()) == [12, 24]
    # Peak memory every step: the process's, which only grows (and holds at least the model), and on CPU
    # no device figure (the devices' arrays are in the process).
    host_peaks = [m["memory/host_peak_gib"] for m in metrics]
    assert host_peaks == sorted(host_peaks) and host_peaks[0] * 2**30 > sum(leaf.nbytes for leaf in jax.tree.leaves((trainer.params, trainer.frozen)))
    assert "memory/device_peak_gib" not in metrics[0]


def test_a_progress_bar_shows_in_a_terminal_and_not_in_a_pipe(tmp_path, monkeypatch):
    """Unless told, the trainer draws its bar when stderr is a terminal (here a real pseudo-terminal): the steps,
    their count and the latest loss; into a pipe (a worker's log, `2> file`) it writes nothing."""
    import fcntl
    import os
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a window of 24 x 100
    with os.fdopen(follower, "w") as terminal:
        monkeypatch.setattr(sys, "stderr", terminal)
        make_trainer(tmp_path / "terminal", total_steps=3).fit()
        terminal.flush()
        os.set_blocking(leader, False)
        drawn = os.read(leader, 65536).decode()
    os.close(leader)
    assert "3/3" in drawn and "step" in drawn and "loss=" in drawn, drawn
    reader, writer = os.pipe()
    with os.fdopen(writer, "w") as pipe:
        monkeypatch.setattr(sys, "stderr", pipe)
        make_trainer(tmp_path / "pipe", total_steps=3).fit()
    with os.fdopen(reader) as written:
        assert written.read() == ""


def test_epoch_is_the_fraction_of_the_training_rows_read(tmp_path):
    """A run that max_steps ends before its first epoch does logged epoch 0 at every step (the epochs completed), an
    all-zero chart: it is fractional, the rows read over the rows (steps × batch / rows, as W&B users read it)."""
    make_trainer(tmp_path, total_steps=10, batch_size=4, examples=patterned_examples(count=32)).fit(progress_bar=False)
    assert [m["epoch"] for m in read_metrics(tmp_path / "metrics.jsonl")] == pytest.approx(
        [step * 4 / 32 for step in range(1, 11)])


def test_runs_of_other_lengths_share_one_compiled_step(tmp_path):
    """The run's length is an argument of the jitted step, not a constant in it: a run that differs from an earlier
    one only in its length compiles nothing (each of the engine's tests compiled a step of its own), and its
    learning rate still decays to 0 at its own last step."""
    from jaxengine.trainer import train_step

    make_trainer(tmp_path / "short", total_steps=3).fit(progress_bar=False)
    compiled = train_step._cache_size()
    trainer = make_trainer(tmp_path / "long", total_steps=7)
    trainer.fit(progress_bar=False)
    assert train_step._cache_size() == compiled
    schedule = learning_rate_schedule(trainer.config.optim, total_steps=7)
    assert [m["learning_rate"] for m in read_metrics(tmp_path / "long/metrics.jsonl")] == \
        pytest.approx([float(schedule(step)) for step in range(7)], rel=1e-6)


class _Device:
    def __init__(self, stats):
        self.stats = stats

    def memory_stats(self):
        if isinstance(self.stats, Exception):
            raise self.stats
        return self.stats


def test_memory_metrics_report_the_largest_device_peak_where_devices_count_their_memory():
    devices = [_Device({"peak_bytes_in_use": 3 * 2**30, "bytes_in_use": 2**30}), _Device({"peak_bytes_in_use": 5 * 2**29}),
               _Device(None), _Device(NotImplementedError("no statistics")), _Device({"bytes_limit": 2**34})]
    metrics = memory_metrics(devices)
    assert metrics["memory/device_peak_gib"] == 3.0 and metrics["memory/host_peak_gib"] > 0
    assert memory_metrics([_Device(None)]).keys() == {"memory/host_peak_gib"}


def test_gradient_accumulation_matches_one_big_batch(tmp_path):
    examples = patterned_examples(count=4)
    one = make_trainer(tmp_path / "one", total_steps=1, batch_size=4, grad_accum=1, examples=examples)
    two = make_trainer(tmp_path / "two", total_steps=1, batch_size=2, grad_accum=2, examples=examples)
    # Warmup makes step 0's learning rate 0: take the step at full rate instead by skipping warmup.
    for trainer in (one, two):
        trainer.step = 2
        trainer.config = trainer.config.__class__(**{**trainer.config.__dict__, "total_steps": 3})
    one.fit(progress_bar=False)
    two.fit(progress_bar=False)
    m_one, m_two = read_metrics(tmp_path / "one/metrics.jsonl")[0], read_metrics(tmp_path / "two/metrics.jsonl")[0]
    assert abs(m_one["loss"] - m_two["loss"]) < 1e-5 and abs(m_one["grad_norm"] - m_two["grad_norm"]) < 1e-5
    for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(two.params)):
        np.testing.assert_allclose(a, b, atol=1e-6)


class Crash(Exception):
    pass


def test_resume_after_a_crash_reproduces_the_uninterrupted_metrics(tmp_path):
    make_trainer(tmp_path / "straight", total_steps=16, save_every=5).fit(progress_bar=False)
    straight = read_metrics(tmp_path / "straight/metrics.jsonl")

    def crash_at_12(progress):
        if progress.step == 12:
            raise Crash

    with pytest.raises(Crash):
        make_trainer(tmp_path / "crashed", total_steps=16, save_every=5).fit(on_progress=crash_at_12,
                                                                            progress_bar=False)
    assert [m["step"] for m in read_metrics(tmp_path / "crashed/metrics.jsonl")][-1] == 12
    summary = make_trainer(tmp_path / "crashed", total_steps=16, save_every=5).fit(progress_bar=False)
    resumed = read_metrics(tmp_path / "crashed/metrics.jsonl")
    assert summary["resumed_from_step"] == 10
    assert [m["step"] for m in resumed] == list(range(1, 17))  # steps 11-12 of the dead run were dropped
    for before, after in zip(straight[10:], resumed[10:]):
        for key in ("loss", "grad_norm", "learning_rate"):
            assert abs(before[key] - after[key]) <= 1e-5, (before["step"], key)
    # The token count goes on from the checkpoint's, as if the run had never stopped.
    assert [m["tokens"] for m in resumed] == [m["tokens"] for m in straight]
    assert summary["tokens_seen"] == straight[-1]["tokens"]


def test_a_run_killed_mid_line_resumes_and_a_damaged_log_line_is_named(tmp_path):
    """A run killed while appending to metrics.jsonl or samples.jsonl (a kill, a full disk) leaves a last line cut
    short; resuming stopped with json's traceback (JSONDecodeError) before training a step. That line is dropped
    (its step has no checkpoint either); a damaged line before it is named, file and line, instead of a KeyError."""
    from jaxengine.trainer import TrainingError

    make_trainer(tmp_path, total_steps=2, save_every=2).fit(progress_bar=False)
    logged = read_metrics(tmp_path / "metrics.jsonl")
    with (tmp_path / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 3, "loss": 1.')
    (tmp_path / "samples.jsonl").write_text('{"step": 1, "kind": "eval"}\n{"step": 3, "text": "cut sh')
    summary = make_trainer(tmp_path, total_steps=3, save_every=2).fit(progress_bar=False)
    assert summary["resumed_from_step"] == 2 and summary["status"] == "succeeded"
    assert [m["step"] for m in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    assert read_metrics(tmp_path / "metrics.jsonl")[:2] == logged
    assert (tmp_path / "samples.jsonl").read_text() == '{"step": 1, "kind": "eval"}\n'

    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    (tmp_path / "metrics.jsonl").write_text("\n".join([lines[0], '{"loss": 1.0}', *lines[1:]]) + "\n")
    with pytest.raises(TrainingError) as raised:
        make_trainer(tmp_path, total_steps=4, save_every=2).fit(progress_bar=False)
    assert str(raised.value) == (f"{tmp_path / 'metrics.jsonl'}: line 2: it is not a record with a step, so the run "
                                 "cannot resume after it; remove the line (or the file) and run the job again")
    (tmp_path / "metrics.jsonl").write_text("\n".join([lines[0], '{"step": 2, "loss": 1.', *lines[1:]]) + "\n")
    with pytest.raises(TrainingError, match=r"metrics.jsonl: line 2: it is not JSON \(Expecting"):
        make_trainer(tmp_path, total_steps=4, save_every=2).fit(progress_bar=False)


def test_a_checkpoint_without_a_token_count_resumes_from_the_logged_one(tmp_path, monkeypatch):
    """Checkpoints of engines that restarted the count at 0 on resume hold no ``tokens_seen``: the resumed
    attempt goes on from the count metrics.jsonl logged at the checkpoint's step."""
    save = Checkpoints.save
    monkeypatch.setattr(Checkpoints, "save", lambda self, step, leaves, meta, **extra: save(
        self, step, leaves, {key: value for key, value in meta.items() if key != "tokens_seen"}, **extra))
    make_trainer(tmp_path, total_steps=4, save_every=2).fit(progress_bar=False)
    logged = [m["tokens"] for m in read_metrics(tmp_path / "metrics.jsonl")]
    summary = make_trainer(tmp_path, total_steps=6, save_every=2).fit(progress_bar=False)
    resumed = [m["tokens"] for m in read_metrics(tmp_path / "metrics.jsonl")]
    assert summary["resumed_from_step"] == 4 and resumed[:4] == logged
    assert logged[3] < resumed[4] < resumed[5] == summary["tokens_seen"]


def test_cancel_saves_and_stops_between_steps(tmp_path):
    calls = []
    summary = make_trainer(tmp_path, total_steps=10).fit(should_stop=lambda: len(calls) >= 3,
                                                         on_progress=calls.append, progress_bar=False)
    assert summary["status"] == "cancelled" and summary["step"] == 3
    assert Checkpoints(tmp_path / "checkpoints", keep_last=3).steps() == [3]


class PoisonedTask(LanguageModelTask):
    """Language modelling whose loss is NaN on any batch holding token 250."""

    def loss(self, model, batch):
        loss, weight, metrics = super().loss(model, batch)
        poisoned = jnp.where(jnp.any(batch.input_ids == 250), jnp.nan, 0.0)
        return loss + poisoned, weight, {"loss": metrics["loss"] + poisoned}


def test_a_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    examples = patterned_examples()
    # The example that epoch 0 serves ninth lands in step 3 (batch size 4).
    ninth = int(epoch_order(len(examples), seed=0, epoch=0)[8])
    examples[ninth] = Example(ids=np.full((8,), 250, np.int32), loss_mask=np.ones((8,), np.bool_))
    summary = make_trainer(tmp_path, total_steps=10, save_every=1, examples=examples,
                           task=PoisonedTask()).fit(progress_bar=False)
    assert summary["status"] == "failed" and summary["step"] == 3
    assert summary["message"].startswith("loss is nan at step 3; stopped, keeping the last good checkpoint")
    assert Checkpoints(tmp_path / "checkpoints", keep_last=3).steps() == [1, 2]
    assert [m["step"] for m in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]


class PoisonedGradientTask(LanguageModelTask):
    """Language modelling whose loss stays finite but whose gradients are NaN on any batch holding token 250 (the
    gradient of sqrt at 0 times 0: what log1p(-exp(0)) gave ORPO's for an answer the model was sure of)."""

    def loss(self, model, batch):
        loss, weight, metrics = super().loss(model, batch)
        healthy = 1.0 - jnp.any(batch.input_ids == 250).astype(jnp.float32)
        poisoned = jnp.sqrt(jnp.abs(loss - jax.lax.stop_gradient(loss)) + healthy) - jnp.sqrt(healthy)
        return loss + poisoned, weight, metrics


@pytest.mark.parametrize("total_steps", [3, 10])
def test_non_finite_gradients_under_a_finite_loss_stop_the_run_before_their_weights_are_kept(tmp_path, total_steps):
    """A step whose loss was finite but whose gradients were not wrote NaN weights: the run went on (failing one step
    later on a NaN loss, after saving the NaN weights as its "last good" checkpoint), or, at its last step, succeeded
    and exported them."""
    examples = patterned_examples()
    ninth = int(epoch_order(len(examples), seed=0, epoch=0)[8])  # served in step 3 (batch size 4)
    examples[ninth] = Example(ids=np.full((8,), 250, np.int32), loss_mask=np.ones((8,), np.bool_))
    summary = make_trainer(tmp_path, total_steps=total_steps, save_every=1, examples=examples,
                           task=PoisonedGradientTask()).fit(progress_bar=False)
    assert summary["status"] == "failed" and summary["step"] == 3
    assert summary["message"].startswith("grad_norm is nan at step 3 (the loss was finite); stopped, keeping the "
                                         "last good checkpoint")
    assert Checkpoints(tmp_path / "checkpoints", keep_last=3).steps() == [1, 2]
    assert [m["step"] for m in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]


def test_checkpoints_keep_the_last_k_and_the_best(tmp_path):
    checkpoints = Checkpoints(tmp_path, keep_last=2)
    for step, eval_loss in zip(range(1, 6), [5.0, 1.0, 4.0, None, 2.0]):
        checkpoints.save(step, [jnp.full((2,), float(step)), jax.random.key(step)], {"eval_loss": eval_loss})
    assert checkpoints.steps() == [2, 4, 5]
    leaves, meta = checkpoints.restore(2, [jnp.zeros((2,)), jax.random.key(0)])
    np.testing.assert_array_equal(leaves[0], [2.0, 2.0])
    assert jnp.array_equal(jax.random.key_data(leaves[1]), jax.random.key_data(jax.random.key(2)))
    assert meta == {"eval_loss": 1.0}


def test_checkpoints_rank_by_a_score_that_may_be_higher_is_better(tmp_path):
    scores = [0.1, 0.5, 0.2, None, 0.5, 0.3]  # step 5 ties step 2: the earlier stays best
    for higher_is_better, best in ((True, 2), (False, 1)):
        checkpoints = Checkpoints(tmp_path / str(higher_is_better), keep_last=2, higher_is_better=higher_is_better)
        for step, score in enumerate(scores, start=1):
            checkpoints.save(step, [jnp.full((2,), float(step))], {"eval_score": score})
        assert checkpoints.best_step() == best and checkpoints.steps() == sorted({best, 5, 6})


def test_the_best_checkpoint_by_the_chosen_metric_is_saved_kept_and_summarised(tmp_path):
    """Evaluations at steps 2, 4, 6 (no save_every): each new best is saved when it happens and never
    pruned; a guard stop at step 7 still leaves it, with the weights it had then."""
    from jaxengine.trainer import restore_trained_model

    scores = {2: 0.2, 4: 0.6, 6: 0.4}
    weights_at = {}

    def hook(model, step):
        weights_at[step] = np.asarray(jax.tree.leaves(nnx.state(model, nnx.Param))[0]).copy()
        return {"eval/score": scores[step]}

    config = TrainConfig(total_steps=10, batch_size=4, max_seq_len=32, eval_every=2, keep_last=1,
                         best_metric="eval/score", best_higher_is_better=True, optim=OptimSpec(learning_rate=3e-3))
    trainer = Trainer(model=tiny_model(), task=LanguageModelTask(), config=config, train_examples=patterned_examples(),
                      pad_id=0, run_dir=tmp_path, eval_hook=hook,
                      guard=lambda record: "enough" if record["step"] == 7 else None)
    summary = trainer.fit(progress_bar=False)
    assert summary["status"] == "failed" and summary["step"] == 7
    assert summary["best_checkpoint"] == {"metric": "eval/score", "step": 4, "value": 0.6}
    # Saved at 2 and 4 (new bests), not at 6 (worse); keep_last 1 pruned step 2.
    assert Checkpoints(tmp_path / "checkpoints", keep_last=1).steps() == [4]
    restored, meta = restore_trained_model(tiny_model(), trainable=nnx.Param, optim=config.optim,
                                           checkpoint_dir=tmp_path / "checkpoints", step=4)
    assert meta["eval_score"] == 0.6 and meta["eval_metric"] == "eval/score"
    np.testing.assert_array_equal(jax.tree.leaves(nnx.state(restored, nnx.Param))[0], weights_at[4])
    assert not np.array_equal(weights_at[4], weights_at[6])


def test_a_batch_source_feeds_each_step(tmp_path):
    from jaxengine.data.pipeline import make_batch, stack_batches

    examples = patterned_examples()
    asked_at = []

    def source(trainer):
        asked_at.append(trainer.step)
        start = 4 * (trainer.step % 8)
        return stack_batches([make_batch(examples[start:start + 4], max_seq_len=32, pad_id=0)], pad_id=0)

    config = TrainConfig(total_steps=6, batch_size=4, max_seq_len=32, optim=OptimSpec(learning_rate=3e-3))
    trainer = Trainer(model=tiny_model(), task=LanguageModelTask(), config=config, pad_id=0, run_dir=tmp_path,
                      batch_source=source)
    summary = trainer.fit(progress_bar=False)
    assert summary["status"] == "succeeded" and asked_at == [0, 1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="exactly one of train_examples and batch_source"):
        Trainer(model=tiny_model(), task=LanguageModelTask(), config=config, pad_id=0, run_dir=tmp_path)


def test_mixed_precision_keeps_float32_weights_and_trains(tmp_path):
    model = build_model(preset("tiny-llama"), rngs=nnx.Rngs(0), param_dtype=jnp.float32, compute_dtype=jnp.bfloat16)
    config = TrainConfig(total_steps=8, batch_size=4, max_seq_len=32, optim=OptimSpec(learning_rate=3e-3))
    trainer = Trainer(model=model, task=LanguageModelTask(), config=config, train_examples=patterned_examples(),
                      pad_id=0, run_dir=tmp_path)
    summary = trainer.fit(progress_bar=False)
    losses = [m["loss"] for m in read_metrics(tmp_path / "metrics.jsonl")]
    assert summary["status"] == "succeeded" and all(math.isfinite(loss) for loss in losses)
    assert losses[-1] < losses[0]
    assert {leaf.dtype for leaf in jax.tree.leaves(trainer.params)} == {jnp.dtype(jnp.float32)}


def test_resuming_refuses_checkpoints_of_another_job(tmp_path):
    from jaxengine.trainer import TrainingError

    config = TrainConfig(total_steps=2, batch_size=4, max_seq_len=32, save_every=1, identity="job A")
    Trainer(model=tiny_model(), task=LanguageModelTask(), config=config, train_examples=patterned_examples(),
            pad_id=0, run_dir=tmp_path).fit(progress_bar=False)
    other = TrainConfig(total_steps=4, batch_size=4, max_seq_len=32, identity="job B")
    with pytest.raises(TrainingError, match=r"belong to another job \(job A\), not this one \(job B\)"):
        Trainer(model=tiny_model(), task=LanguageModelTask(), config=other, train_examples=patterned_examples(),
                pad_id=0, run_dir=tmp_path).fit(progress_bar=False)


def test_resuming_takes_checkpoints_written_under_an_earlier_identity_of_the_same_job(tmp_path):
    """Checkpoints of an engine that named the job's model as its spec spelled it resume under the
    canonical identity (``TrainConfig.identity_aliases``)."""
    config = TrainConfig(total_steps=2, batch_size=4, max_seq_len=32, save_every=1, identity="as written")
    Trainer(model=tiny_model(), task=LanguageModelTask(), config=config, train_examples=patterned_examples(),
            pad_id=0, run_dir=tmp_path).fit(progress_bar=False)
    later = TrainConfig(total_steps=3, batch_size=4, max_seq_len=32, save_every=1, identity="canonical",
                        identity_aliases=("as written",))
    trainer = Trainer(model=tiny_model(), task=LanguageModelTask(), config=later,
                      train_examples=patterned_examples(), pad_id=0, run_dir=tmp_path)
    trainer.fit(progress_bar=False)
    assert trainer.step == 3


def test_resuming_reports_each_changed_setting_and_refuses_a_changed_training_file(tmp_path):
    """Issue 8, in the trainer, from the checkpoints' own record (``TrainConfig.recorded_settings`` and
    ``data_files``): a changed setting is reported, saved value -> new value, through ``fit(on_log=)``; a training
    file with other contents than the checkpoint's is refused, as the data position saved counts in its rows."""
    from jaxengine.trainer import TrainingError

    def config(total_steps, *, learning_rate, train_sha256):
        return TrainConfig(total_steps=total_steps, batch_size=4, max_seq_len=32, save_every=1,
                           recorded_settings={"optim": {"learning_rate": learning_rate, "warmup_steps": 0}},
                           data_files={"data.train": {"path": "rows.jsonl", "sha256": train_sha256}})

    def trainer(**settings):
        return Trainer(model=tiny_model(), task=LanguageModelTask(), config=config(**settings),
                       train_examples=patterned_examples(), pad_id=0, run_dir=tmp_path)

    trainer(total_steps=2, learning_rate=0.001, train_sha256="a" * 64).fit(progress_bar=False)
    with pytest.raises(TrainingError) as raised:
        trainer(total_steps=3, learning_rate=0.001, train_sha256="b" * 64).fit(progress_bar=False)
    assert str(raised.value) == (
        f"{tmp_path / 'checkpoints'}: data.train: rows.jsonl changed since checkpoint 2 was saved (sha256 aaaaaaaaaaaa "
        "then, bbbbbbbbbbbb now): a resume goes on from the saved position in the training file's shuffled rows, so "
        "over other contents the run would train on other rows than its steps say; put the file back as it was to "
        "resume, or start a new run (another output_dir)")
    lines = []
    summary = trainer(total_steps=3, learning_rate=0.002, train_sha256="a" * 64).fit(progress_bar=False,
                                                                                     on_log=lines.append)
    assert lines == summary["resumed_with_changes"] == [
        "resumed from step 2 with a changed setting: optim.learning_rate 0.001 -> 0.002"]
    assert summary["step"] == 3


def test_resuming_reports_a_setting_only_one_record_has_as_added_or_removed(tmp_path):
    """A setting in only one of the two records went unreported: one an engine upgrade adds (``parallel``, set by
    the new spec and absent from the checkpoint's record) or drops. Each is reported with its value; a new setting
    left at null is unset either way, and says nothing."""
    def trainer(total_steps, recorded):
        config = TrainConfig(total_steps=total_steps, batch_size=4, max_seq_len=32, save_every=1,
                             recorded_settings=recorded)
        return Trainer(model=tiny_model(), task=LanguageModelTask(), config=config,
                       train_examples=patterned_examples(), pad_id=0, run_dir=tmp_path)

    trainer(2, {"optim": {"learning_rate": 0.001, "retired_knob": 2}, "train": {"max_steps": 2}}).fit(
        progress_bar=False)
    lines = []
    summary = trainer(3, {"optim": {"learning_rate": 0.001, "warmup_steps": 5}, "train": {"max_steps": 2},
                          "parallel": {"data": 1, "fsdp": 2}, "unset_knob": None}).fit(progress_bar=False,
                                                                                         on_log=lines.append)
    assert lines == summary["resumed_with_changes"] == [
        "resumed from step 2 with a changed setting: optim.retired_knob removed (was 2)",
        "resumed from step 2 with a changed setting: optim.warmup_steps added: 5",
        'resumed from step 2 with a changed setting: parallel added: {"data": 1, "fsdp": 2}']
    assert summary["step"] == 3


def test_a_failed_restores_late_read_callbacks_stay_off_stderr(monkeypatch, capsys):
    """QA: a resume from a checkpoint whose array files were lost printed its one-line error amid dozens of
    'RuntimeError: Event loop is closed' tracebacks: tensorstore's threads finishing the restore's other reads
    call back into the event loop orbax closed at the first failure, and Python reports each as unraisable.
    Those, and only those, are kept off stderr once a checkpoint has been read."""
    import asyncio

    from jaxengine import trainer as trainer_module

    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)  # put back after the test
    captured = []
    sys.unraisablehook = captured.append

    class RaisesWhenCollected:
        def __del__(self):
            raise RuntimeError("collected")

    RaisesWhenCollected()
    hook_args = type(captured[0])  # sys.UnraisableHookArgs, which Python does not export
    closed = asyncio.new_event_loop()
    closed.close()
    try:
        closed.call_soon_threadsafe(print)
    except RuntimeError as error:
        late_callback = error  # as tensorstore's thread meets it: its traceback starts in call_soon_threadsafe
    other = RuntimeError("Event loop is closed")  # the same words from elsewhere are still reported

    sys.unraisablehook = sys.__unraisablehook__
    trainer_module._quiet_late_read_callbacks()
    trainer_module._quiet_late_read_callbacks()  # once only, however many checkpoints are read
    sys.unraisablehook(hook_args((RuntimeError, late_callback, late_callback.__traceback__.tb_next, None, None)))
    assert capsys.readouterr().err == ""
    sys.unraisablehook(hook_args((RuntimeError, other, None, "late", None)))
    assert capsys.readouterr().err == "late:\nRuntimeError: Event loop is closed\n"
    sys.unraisablehook(hook_args((ValueError, ValueError("x"), None, None, None)))
    assert "ValueError: x" in capsys.readouterr().err


def test_an_evaluation_reports_its_batches_as_it_goes(tmp_path):
    """QA: an evaluation over a large eval set (a minute on DPO) gave no sign of itself: progress came after
    each step's evaluation only. ``on_evaluation`` now hears of each eval batch, and of the eval hook's
    generations, before the step's progress."""
    heard = []
    trainer = make_trainer(tmp_path, total_steps=2, eval_every=2)  # 6 eval examples, 4 a batch: 2 batches
    trainer.eval_hook = lambda model, step: heard.append("hook") or {}
    trainer.fit(on_evaluation=heard.append, on_progress=lambda progress: heard.append(progress.step),
                progress_bar=False)
    assert heard == [1, EvalProgress(step=2, batches_done=0, batches=2), EvalProgress(step=2, batches_done=1, batches=2),
                     EvalProgress(step=2, batches_done=2, batches=2),
                     EvalProgress(step=2, batches_done=2, batches=2, generating=True), "hook", 2]
