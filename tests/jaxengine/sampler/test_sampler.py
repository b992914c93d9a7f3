"""Sampler: cached decoding against full forward passes, transformers' greedy generate, sampling
filters by hand, stopping, streaming, seeds and the compile count."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from jaxengine.checkpoint.hf import load_hf_model
from jaxengine.models import build_model, preset
from jaxengine.sampler import (PromptError, Sampler, SamplingParams, apply_logit_bias, apply_penalties, bucket_length,
                               count_tokens, decode, filter_logits, first_max_index, logit_bias_arrays,
                               prefill)
from jaxengine.tokenizer import load_tokenizer
from tests import factories

PROMPTS = ["Hello world", "the quick brown fox jumps over the lazy dog and", "你好 🙂"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return load_tokenizer(factories.build_bpe_tokenizer_dir(tmp_path_factory.mktemp("qwen-tokenizer")))


@pytest.fixture(scope="module")
def sampler(tokenizer):
    config = preset("tiny-qwen3").replace(vocab_size=tokenizer.vocab_size)
    model = build_model(config, rngs=nnx.Rngs(0))
    # Scaled-up weights give peaked, varied greedy output instead of one token repeated.
    nnx.update(model, jax.tree.map(lambda value: value * 4, nnx.state(model, nnx.Param)))
    return Sampler(model, tokenizer)


def test_bucket_length():
    assert [bucket_length(n, minimum=16) for n in (1, 16, 17, 32, 33, 100)] == [16, 16, 32, 32, 64, 128]
    assert [bucket_length(n, minimum=1) for n in (1, 2, 3, 5)] == [1, 2, 4, 8]


def test_filter_logits_by_hand():
    # probabilities 0.5, 0.25, 0.125, 0.125 (logits are their logs), in shuffled order
    logits = jnp.log(jnp.array([[0.125, 0.5, 0.125, 0.25]]))
    kept = lambda top_k, top_p: np.isfinite(np.asarray(filter_logits(logits, jnp.int32(top_k), jnp.float32(top_p))))
    assert kept(0, 1.0).tolist() == [[True, True, True, True]]
    assert kept(1, 1.0).tolist() == [[False, True, False, False]]
    assert kept(2, 1.0).tolist() == [[False, True, False, True]]
    assert kept(0, 0.5).tolist() == [[False, True, False, False]]  # 0.5 alone reaches p
    assert kept(0, 0.6).tolist() == [[False, True, False, True]]  # needs 0.5 + 0.25
    assert kept(0, 0.8).tolist() == [[True, True, True, True]]  # 0.75 < 0.8; the two 0.125 ties are both kept
    # top-p applies to the top-k renormalised distribution: top-2 gives 2/3, 1/3, so p=0.6 keeps one
    assert kept(2, 0.6).tolist() == [[False, True, False, False]]
    kept_values = filter_logits(logits, jnp.int32(2), jnp.float32(1.0))
    np.testing.assert_array_equal(np.asarray(kept_values)[0, [1, 3]], np.asarray(logits)[0, [1, 3]])


def test_first_max_index_is_argmax_with_its_ties_and_nans():
    rng = np.random.default_rng(0)
    values = rng.standard_normal((6, 1000)).astype(np.float32)
    values[1, [10, 500, 900]] = 9.0  # ties: the first wins
    values[2] = -np.inf  # nothing finite: index 0
    values[3, [7, 70]] = np.nan  # a NaN wins over any number, the first NaN
    values[4, -1] = np.inf
    values[5] = np.round(values[5])  # many ties at the largest integer
    expected = np.asarray(jnp.argmax(jnp.asarray(values), axis=-1))
    got = np.asarray(jax.jit(first_max_index)(jnp.asarray(values)))
    assert got.dtype == np.int32
    assert got.tolist() == expected.tolist()
    assert got[1:5].tolist() == [10, 0, 7, 999]


@pytest.mark.parametrize("vocab", [4096, 1600])  # blocks of 128, and of 64
def test_first_max_index_by_blocks_is_argmax_and_in_range_with_nans(vocab):
    # A vocabulary that splits into blocks takes the one-pass path: the first block holding the largest
    # value is searched. Ties across blocks and at a block boundary decide which block that is.
    rng = np.random.default_rng(1)
    values = rng.standard_normal((8, vocab)).astype(np.float32)
    values[0, [1500, 100, 1400]] = 9.0  # ties in three blocks: the first index wins
    values[1] = -np.inf  # nothing finite: index 0
    values[2, -1] = np.inf  # the largest in the last block's last slot
    values[3] = np.round(values[3])  # many ties at the largest integer
    values[4, 127:129] = 9.0  # a tie across a block boundary
    values[5, 0] = 9.0
    got = np.asarray(jax.jit(first_max_index)(jnp.asarray(values)))
    assert got.dtype == np.int32
    assert got[:6].tolist() == np.argmax(values[:6], axis=-1).tolist()
    assert got[[0, 1, 2, 4, 5]].tolist() == [100, 0, vocab - 1, 127, 0]
    # A NaN (a diverged model): the index of a NaN or of the row's largest value, never out of range.
    values[6, [5, 1300]] = [50.0, np.nan]
    values[7] = np.nan
    got = np.asarray(jax.jit(first_max_index)(jnp.asarray(values)))
    assert got[6] in (5, 1300)
    assert 0 <= got[7] < vocab


def test_generated_logprobs_are_the_log_softmax_of_the_models_logits(sampler):
    # The sampler reads each token's log-probability as logit minus logsumexp; it must be what
    # log_softmax gives for the same logits (the first token's, from a full forward pass).
    prompt_ids = [sampler.tokenizer.encode(prompt) for prompt in PROMPTS]
    generations = sampler.generate(prompt_ids, SamplingParams(max_new_tokens=1, temperature=0.8, seed=3))
    for ids, generation in zip(prompt_ids, generations):
        logits_v = sampler.model(jnp.asarray([ids]), jnp.arange(len(ids))[None])[0][0, -1]
        expected = jax.nn.log_softmax(logits_v.astype(jnp.float32))[generation.token_ids[0]]
        assert abs(generation.logprobs[0] - float(expected)) <= 1e-5


def test_sampling_draws_what_jax_random_categorical_draws(sampler):
    # The sampler's Gumbel-max draw with its own argmax must be categorical's draw for the documented key
    # fold_in(fold_in(key(seed), row), step): the first token of each row from the prefill's logits.
    tokenizer = sampler.tokenizer
    params = SamplingParams(max_new_tokens=1, temperature=0.7, seed=11)
    generations = sampler.generate(PROMPTS, params)
    prompt_ids = [tokenizer.encode(prompt) for prompt in PROMPTS]
    for row, (ids, generation) in enumerate(zip(prompt_ids, generations)):
        logits_v = sampler.model(jnp.asarray([ids]), jnp.arange(len(ids))[None])[0][0, -1]
        key = jax.random.fold_in(jax.random.fold_in(jax.random.key(params.seed), row), 0)
        assert generation.token_ids == [int(jax.random.categorical(key, logits_v / params.temperature))]
    assert len({generation.token_ids[0] for generation in generations}) > 1


@pytest.mark.parametrize("kind", ["tiny-gemma3"])  # sliding and global layers: both mask paths
def test_cached_decode_logits_equal_full_forward_with_left_padding(kind):
    config = preset(kind)  # tiny-gemma3 has a sliding window shorter than these sequences
    model = build_model(config, rngs=nnx.Rngs(1))
    rng = np.random.default_rng(0)
    rows = [rng.integers(3, config.vocab_size, size=length).tolist() for length in (9, 4)]
    continuation = rng.integers(3, config.vocab_size, size=(2, 5))
    prompt_length = 12
    input_ids_bt = np.zeros((2, prompt_length), np.int32)
    pad_counts_b = np.array([prompt_length - len(row) for row in rows], np.int32)
    for row, ids in enumerate(rows):
        input_ids_bt[row, pad_counts_b[row]:] = ids
    jit_prefill = nnx.jit(prefill, static_argnames=("total_length",))
    jit_decode = nnx.jit(decode)
    logits_bv, cache = jit_prefill(model, jnp.asarray(input_ids_bt), jnp.asarray(pad_counts_b), total_length=32)
    cached = [logits_bv]
    for step in range(continuation.shape[1]):
        positions_b = jnp.asarray([len(row) + step for row in rows])
        logits_bv, cache = jit_decode(model, jnp.asarray(continuation[:, step]), positions_b,
                                      jnp.asarray(pad_counts_b), cache)
        cached.append(logits_bv)
    cached_bnv = np.stack([np.asarray(logits) for logits in cached], axis=1)
    for row, ids in enumerate(rows):
        full_ids = ids + continuation[row].tolist()
        full_logits, _ = nnx.jit(lambda model, ids_bt: model(ids_bt, jnp.arange(ids_bt.shape[1])[None]))(
            model, jnp.asarray([full_ids]))
        expected = np.asarray(full_logits)[0, len(ids) - 1:]
        np.testing.assert_allclose(cached_bnv[row], expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["gemma3"])  # per-family greedy parity is in tests/jaxengine/models
def test_greedy_batch_matches_transformers_generate(kind, tiny_hf_model_dir, tokenizer):
    model_dir = tiny_hf_model_dir(kind)
    model, config = load_hf_model(model_dir)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, config.vocab_size, size=length).tolist() for length in (7, 3, 12)]
    sampler = Sampler(model, tokenizer)  # this tokenizer's stop ids lie outside the tiny vocabulary
    generations = sampler.generate(prompts, SamplingParams(max_new_tokens=32, temperature=0))
    reference = factories.load_hf_reference(model_dir)
    reference.generation_config.eos_token_id = None
    for prompt, generation in zip(prompts, generations):
        with torch.no_grad():
            expected = reference.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False,
                                          attention_mask=torch.ones(1, len(prompt), dtype=torch.long), pad_token_id=0)
        assert generation.token_ids == expected[0, len(prompt):].tolist()
        assert generation.prompt_token_ids == prompt
        assert generation.finish_reason == "length"
        # logprobs are the model's own: compare with transformers' log-softmax over the full sequence
        with torch.no_grad():
            logits = reference(expected).logits[0, len(prompt) - 1:-1].log_softmax(-1)
        expected_logprobs = logits[torch.arange(32), expected[0, len(prompt):]].numpy()
        np.testing.assert_allclose(generation.logprobs, expected_logprobs, atol=1e-4, rtol=0)


def test_second_call_in_same_buckets_does_not_compile(sampler):
    params = SamplingParams(max_new_tokens=10, temperature=0)
    first = sampler.generate(PROMPTS, params)
    traces, cache_size = sampler.trace_count, sampler._compiled.function._cache_size()
    # Different prompt lengths and count (3 -> 4 rows either way), fewer new tokens: same buckets.
    second = sampler.generate(["Hi", "a b c d e f g h i j", "x y", "model"], SamplingParams(max_new_tokens=7, temperature=0))
    assert (sampler.trace_count, sampler._compiled.function._cache_size()) == (traces, cache_size)
    assert [len(generation.token_ids) for generation in second] == [7, 7, 7, 7]
    assert [len(generation.token_ids) for generation in first] == [10, 10, 10]
    # A prompt past the 16-token bucket does compile a new shape.
    sampler.generate([" ".join(["word"] * 20)], params)
    assert sampler.trace_count == traces + 1


def test_rows_are_independent_of_their_batch(tokenizer):
    # A row's result must not depend on the other rows: the same greedy tokens, and logprobs equal up
    # to float32 rounding. XLA CPU is not bit-identical across batch sizes (other matmul blockings),
    # so the logprobs differ by rounding noise that grows with activation size: with the x4-scaled
    # weights of the shared fixture it reaches 7e-5 for some init seeds (1e-5 held for seed 0 only
    # by luck). Unscaled weights (the models' own init) keep that noise at 5e-7 for init seeds 0-4
    # (measured), so 1e-5 here is 20x above the noise: the bound is tight enough to catch a row
    # seeing anything of another row's keys or padding, yet not at the mercy of blocking order.
    config = preset("tiny-qwen3").replace(vocab_size=tokenizer.vocab_size)
    sampler = Sampler(build_model(config, rngs=nnx.Rngs(1)), tokenizer)
    params = SamplingParams(max_new_tokens=8, temperature=0)
    together = sampler.generate(PROMPTS, params)
    assert len({tuple(generation.token_ids) for generation in together}) > 1  # rows that differ, else vacuous
    for prompt, generation in zip(PROMPTS, together):
        alone = sampler.generate([prompt], params)[0]
        assert alone.token_ids == generation.token_ids
        np.testing.assert_allclose(alone.logprobs, generation.logprobs, atol=1e-5, rtol=0)


def test_seeds_make_sampling_reproducible(sampler):
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=7)
    first, again = sampler.generate(PROMPTS, params), sampler.generate(PROMPTS, params)
    other = sampler.generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=1.0, seed=8))
    assert [g.token_ids for g in first] == [g.token_ids for g in again]
    assert [g.token_ids for g in first] != [g.token_ids for g in other]
    greedy = sampler.generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=0))
    assert [g.token_ids for g in first] != [g.token_ids for g in greedy]


def test_top_k_one_is_greedy(sampler):
    greedy = sampler.generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=0))
    top1 = sampler.generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=2.0, top_k=1, seed=3))
    assert [g.token_ids for g in top1] == [g.token_ids for g in greedy]
    tiny_nucleus = sampler.generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=2.0, top_p=1e-6, seed=4))
    assert [g.token_ids for g in tiny_nucleus] == [g.token_ids for g in greedy]


def test_stop_token_ids_end_a_row(sampler):
    full = sampler.generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=0))
    stop_id = full[1].token_ids[4]
    stopped = sampler.generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=0, stop_token_ids=(stop_id,)))
    cut = full[1].token_ids.index(stop_id) + 1
    assert stopped[1].token_ids == full[1].token_ids[:cut]  # the stop token is kept
    assert stopped[1].finish_reason == "stop"
    assert len(stopped[1].logprobs) == cut
    for before, after in zip(full, stopped):
        if stop_id not in before.token_ids:
            assert after.token_ids == before.token_ids and after.finish_reason == "length"


def test_stop_strings_and_streaming(sampler, tokenizer):
    full = sampler.generate(PROMPTS, SamplingParams(max_new_tokens=16, temperature=0))
    text = full[0].text
    # The first ASCII letter or digit that first appears after two characters.
    stop = next(char for index, char in enumerate(text) if index >= 2 and char.isascii() and char.isalnum()
                and text.index(char) == index)
    streamed: list[tuple[int, int, str]] = []
    params = SamplingParams(max_new_tokens=16, temperature=0, stop_strings=(stop,))
    stopped = sampler.generate(PROMPTS, params, on_token=lambda row, token_id, delta: streamed.append((row, token_id, delta)))
    assert stopped[0].text == text[:text.index(stop)]
    assert stopped[0].finish_reason == "stop"
    assert stop in tokenizer.decode(stopped[0].token_ids) and stop not in tokenizer.decode(stopped[0].token_ids[:-1])
    assert stopped[0].token_ids == full[0].token_ids[:len(stopped[0].token_ids)]
    for row, generation in enumerate(stopped):
        row_events = [(token_id, delta) for event_row, token_id, delta in streamed if event_row == row]
        assert [token_id for token_id, _ in row_events] == generation.token_ids
        assert "".join(delta for _, delta in row_events) == generation.text


def test_streaming_without_stop_strings_matches_plain_generation(sampler):
    params = SamplingParams(max_new_tokens=9, temperature=0.8, top_p=0.9, seed=1)
    plain = sampler.generate(PROMPTS[:2], params)
    deltas = {0: [], 1: []}
    streamed = sampler.generate(PROMPTS[:2], params, on_token=lambda row, token_id, delta: deltas[row].append(delta))
    assert [g.token_ids for g in streamed] == [g.token_ids for g in plain]
    assert ["".join(deltas[row]) for row in (0, 1)] == [g.text for g in plain]


def test_it_rejects_bad_input(sampler):
    with pytest.raises(ValueError, match="max_new_tokens must be at least 1"):
        SamplingParams(max_new_tokens=0)
    with pytest.raises(ValueError, match="top_p must be in"):
        SamplingParams(top_p=0)
    # Past an int32, it failed the whole batch it joined (its row's array), not itself.
    with pytest.raises(ValueError, match="top_k must be from 0 .off. to 2147483647, got 1099511627776"):
        SamplingParams(top_k=2**40)
    assert SamplingParams(top_k=2**31 - 1).top_k == 2**31 - 1
    with pytest.raises(ValueError, match="exceeds the model's context length"):
        sampler.generate(["hi"], SamplingParams(max_new_tokens=10_000))
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        sampler.generate([[1, 10_000]], SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        sampler.generate([""], SamplingParams(max_new_tokens=2))


def test_updated_weights_and_new_samplers_do_not_recompile(tokenizer):
    config = preset("tiny-qwen3").replace(vocab_size=tokenizer.vocab_size)
    model = build_model(config, rngs=nnx.Rngs(5))
    sampler = Sampler(model, tokenizer)
    params = SamplingParams(max_new_tokens=6, temperature=0)
    before = sampler.generate(PROMPTS, params)
    traces = sampler.trace_count
    nnx.update(model, jax.tree.map(lambda value: value * 4, nnx.state(model, nnx.Param)))  # as a train step would
    after = sampler.generate(PROMPTS, params)
    assert sampler.trace_count == traces
    assert [g.token_ids for g in after] != [g.token_ids for g in before]
    fresh = Sampler(model, tokenizer)  # as an evaluation hook would make one each time
    assert [g.token_ids for g in after] == [g.token_ids for g in fresh.generate(PROMPTS, params)]
    assert fresh.trace_count == sampler.trace_count == traces  # compiled code is shared by model structure


def test_penalties_logit_bias_and_counts_by_hand():
    logits_bv = jnp.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    counts_bv = jnp.array([[0, 1, 3], [2, 0, 0]], jnp.int32)
    penalized = apply_penalties(logits_bv, counts_bv, jnp.array([0.5, 1.0]), jnp.array([0.25, -1.0]))
    # row 0: 2 - 0.5 - 0.25, 3 - 0.5 - 3 * 0.25; row 1: 0 - 1 + 2 * 1
    np.testing.assert_allclose(penalized, [[1.0, 1.25, 1.75], [1.0, 0.0, 0.0]], atol=1e-5)
    ids_bn, values_bn = logit_bias_arrays([((2, -100.0),), ((0, 1.5), (1, -0.5))], 3, 3)
    assert ids_bn.shape == (3, 8) and ids_bn[0, 1] == 3 and ids_bn[2].tolist() == [3] * 8  # padding: past V
    np.testing.assert_allclose(apply_logit_bias(jnp.concatenate([logits_bv, logits_bv[:1]]), ids_bn, values_bn),
                               [[1.0, 2.0, -97.0], [1.5, -0.5, 0.0], [1.0, 2.0, 3.0]], atol=1e-5)
    counted = count_tokens(jnp.zeros((2, 3), jnp.int32), jnp.array([2, 0]), jnp.array([True, False]))
    assert counted.tolist() == [[0, 0, 1], [0, 0, 0]]


@pytest.fixture(scope="module")
def repeating_sampler(tokenizer):
    # Unscaled weights: the tiny model's greedy answer is one token repeated.
    model = build_model(preset("tiny-qwen3").replace(vocab_size=tokenizer.vocab_size), rngs=nnx.Rngs(0))
    return Sampler(model, tokenizer)


def test_a_frequency_penalty_stops_the_repetition_greedy_decoding_makes(repeating_sampler):
    plain = SamplingParams(max_new_tokens=24, temperature=0)
    [repeated] = repeating_sampler.generate(["Hello world"], plain)
    assert len(set(repeated.token_ids)) == 1, repeated.token_ids  # what the model does unpenalized
    traces = repeating_sampler.trace_count
    for params in (dataclasses.replace(plain, frequency_penalty=2.0), dataclasses.replace(plain, presence_penalty=2.0)):
        [varied] = repeating_sampler.generate(["Hello world"], params)
        assert varied.token_ids[0] == repeated.token_ids[0]  # nothing generated yet: nothing penalized
        assert len(set(varied.token_ids)) == len(varied.token_ids) == 24, varied.token_ids
        # The logprobs stay the model's own (before penalties), as for temperature and filters.
        assert varied.logprobs[0] == pytest.approx(repeated.logprobs[0], abs=1e-5)
    # Another penalty is data: the penalized program compiled once.
    repeating_sampler.generate(["Hello world"], dataclasses.replace(plain, frequency_penalty=0.5))
    assert repeating_sampler.trace_count == traces + 1


def test_logit_bias_forbids_and_forces_tokens(repeating_sampler):
    plain = SamplingParams(max_new_tokens=12, temperature=0)
    [repeated] = repeating_sampler.generate(["Hello world"], plain)
    banned = repeated.token_ids[0]
    [without] = repeating_sampler.generate(["Hello world"], dataclasses.replace(plain, logit_bias={banned: -100}))
    assert banned not in without.token_ids
    forced = (banned + 7) % repeating_sampler.config.vocab_size
    sampled = dataclasses.replace(plain, temperature=1.0, seed=3, logit_bias={forced: 100})
    for generation in repeating_sampler.generate(["Hello world", "x y"], sampled):
        assert generation.token_ids == [forced] * 12


def test_a_token_biased_under_two_spellings_of_its_id_is_biased_once():
    assert SamplingParams(logit_bias={5: 1, "5": 2, 3: -1}).logit_bias == ((3, -1.0), (5, 2.0))


def test_it_rejects_bad_penalties_and_bias(repeating_sampler):
    with pytest.raises(ValueError, match="frequency_penalty must be from -2.0 to 2.0, got 2.5"):
        SamplingParams(frequency_penalty=2.5)
    with pytest.raises(ValueError, match="logit_bias of token 5 must be from -100.0 to 100.0, got 101"):
        SamplingParams(logit_bias={5: 101})
    vocab_size = repeating_sampler.config.vocab_size
    with pytest.raises(PromptError, match=f"logit_bias: token id {vocab_size} is outside the model's vocabulary"):
        repeating_sampler.generate(["Hi"], SamplingParams(max_new_tokens=4, logit_bias={vocab_size: 1}))
