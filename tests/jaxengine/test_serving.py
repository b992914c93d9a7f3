"""Serving: batched decoding gives each request the tokens it gets alone (and from the Sampler), per-row
settings, stop and timeout, the batching server's batches, the memory-bounded model cache."""
import contextlib
import dataclasses
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxengine.checkpoint.hf import load_hf_model
from jaxengine.programs import PROGRAMS
from jaxengine.sampler import PromptError, Sampler, SamplingParams
from jaxengine.serving import (BatchDecoder, BatchingServer, ContinuousBatch, LoadedModel, ModelCache, ServeRequest,
                               _insert_on_host, _on, _relayout_on_host, gumbel_noise, load_serving_model,
                               serving_devices)
from jaxengine.tokenizer import load_tokenizer
from tests import factories

TEXTS = ["Hello world", "the quick brown fox jumps over the lazy dog and", "a", "numbers 1 2 3"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model_dir = factories.build_tiny_model_dir(tmp_path_factory.mktemp("tiny-serve"))
    model, _ = load_hf_model(model_dir)
    tokenizer = load_tokenizer(model_dir)
    return model, tokenizer, [tokenizer.encode(text) for text in TEXTS]


def requests_for(prompts, params_list):
    return [ServeRequest(prompt_ids=tuple(ids), params=params) for ids, params in zip(prompts, params_list)]


def test_batched_greedy_decoding_gives_the_tokens_of_one_at_a_time_decoding(served):
    model, tokenizer, prompts = served
    # Different budgets: a row that ends early must not disturb the others.
    params = [SamplingParams(max_new_tokens=n, temperature=0.0) for n in (12, 9, 12, 5)]
    decoder = BatchDecoder(model, tokenizer)
    batched = decoder.run(requests_for(prompts, params))
    for ids, param, result in zip(prompts, params, batched):
        [alone] = decoder.run(requests_for([ids], [param]))
        [reference] = Sampler(model, tokenizer).generate([ids], param)
        assert result.token_ids == alone.token_ids == reference.token_ids
        assert result.text == reference.text and result.finish_reason == reference.finish_reason
    assert [len(result.token_ids) for result in batched] == [12, 9, 12, 5]  # the tiny model has no EOS in reach


def test_each_row_samples_with_its_own_settings_as_the_sampler_does_alone(served):
    model, tokenizer, prompts = served
    params = [SamplingParams(max_new_tokens=10, temperature=0.9, top_k=20, seed=3),
              SamplingParams(max_new_tokens=10, temperature=0.0),
              SamplingParams(max_new_tokens=10, temperature=1.3, top_p=0.8, seed=11),
              SamplingParams(max_new_tokens=10, temperature=0.7, seed=5)]
    batched = BatchDecoder(model, tokenizer).run(requests_for(prompts, params))
    for ids, param, result in zip(prompts, params, batched):
        [reference] = Sampler(model, tokenizer).generate([ids], param)
        assert result.token_ids == reference.token_ids


def test_stop_and_timeout_end_one_row_and_leave_the_others(served):
    model, tokenizer, prompts = served
    greedy = SamplingParams(max_new_tokens=20, temperature=0.0)
    streamed = {row: [] for row in range(3)}
    requests = [ServeRequest(prompt_ids=tuple(prompts[0]), params=greedy),
                ServeRequest(prompt_ids=tuple(prompts[1]), params=greedy),
                ServeRequest(prompt_ids=tuple(prompts[2]), params=greedy, deadline=10)]
    # Stops and deadlines are looked at between decode calls of 8 steps: after the prefill a row has 1
    # token, then 9, 17, ... The clock reads row 2's streamed tokens, so its deadline has passed at 17.
    results = BatchDecoder(model, tokenizer).run(
        requests, on_tokens=lambda row, token_ids, delta: streamed[row].extend(token_ids),
        should_stop=lambda row: row == 1 and len(streamed[1]) >= 3, clock=lambda: len(streamed[2]))
    assert results[0].token_ids == alone_tokens(model, tokenizer, prompts[0], 20)
    assert results[0].finish_reason == "length"
    assert results[1].finish_reason == "cancelled"
    assert results[1].token_ids == alone_tokens(model, tokenizer, prompts[1], 20)[:9]
    assert results[2].finish_reason == "timeout"
    assert results[2].token_ids == alone_tokens(model, tokenizer, prompts[2], 20)[:17]
    assert streamed[1] == results[1].token_ids and streamed[2] == results[2].token_ids


def alone_tokens(model, tokenizer, ids, max_new_tokens=10):
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    return Sampler(model, tokenizer).generate([ids], params)[0].token_ids


def test_it_rejects_a_prompt_longer_than_the_context(served):
    model, tokenizer, _ = served
    too_long = ServeRequest(prompt_ids=(5,) * model.config.max_position_embeddings, params=SamplingParams())
    with contextlib.closing(BatchingServer(BatchDecoder(model, tokenizer))) as server, \
            pytest.raises(PromptError, match="exceeds the model's context length"):
        server.submit(too_long)


class Collected:
    """What a ContinuousBatch gives back: results by name, and the step at which each name's first token came."""

    def __init__(self):
        self.results, self.first_token_step, self.step = {}, {}, 0

    def add(self, batch, name, ids, params):
        batch.add(ServeRequest(prompt_ids=tuple(ids), params=params), on_finish=lambda r: self.results.update({name: r}),
                  on_tokens=lambda token_ids, delta: self.first_token_step.setdefault(name, self.step))

    def steps(self, batch, count):
        for _ in range(count):
            batch.step()
            self.step += 1


def test_requests_joining_a_running_batch_get_their_solo_tokens(served):
    model, tokenizer, prompts = served
    params = {"a": SamplingParams(max_new_tokens=30, temperature=0.0),
              "b": SamplingParams(max_new_tokens=12, temperature=0.0),
              "c": SamplingParams(max_new_tokens=20, temperature=0.8, seed=7),
              "d": SamplingParams(max_new_tokens=9, temperature=1.1, top_k=5, seed=2)}
    batch, seen = ContinuousBatch(BatchDecoder(model, tokenizer)), Collected()
    seen.add(batch, "a", prompts[1], params["a"])
    seen.steps(batch, 2)  # a has 1 + 8 + 8 tokens when b arrives
    seen.add(batch, "b", prompts[0], params["b"])
    seen.steps(batch, 1)
    seen.add(batch, "c", prompts[2], params["c"])
    seen.add(batch, "d", prompts[3], params["d"])
    while batch.busy:
        seen.steps(batch, 1)
    for name, ids in zip("bacd", prompts):
        [alone] = Sampler(model, tokenizer).generate([ids], params[name])
        assert seen.results[name].token_ids == alone.token_ids, name
        assert seen.results[name].text == alone.text and seen.results[name].finish_reason == "length"
    # b, c and d each came in while a was decoding and got their first token at once.
    assert seen.first_token_step == {"a": 0, "b": 2, "c": 3, "d": 3}
    assert batch.batch_sizes[:4] == [1, 1, 2, 4] and max(batch.batch_sizes) == 4


@pytest.mark.parametrize("device_count", [2, 4])
def test_rows_split_over_devices_get_their_solo_tokens_as_rows_come_and_go(served, device_count):
    # The tests' 8 host devices (tests/conftest.py) stand for a CPU's cores. Requests arrive one call apart
    # and end at different budgets, so the cache grows from 1 row (one device) to 8 (split over them all)
    # and shrinks again, moving between meshes; every request decodes what it decodes alone.
    model, tokenizer, prompts = served
    decoder = BatchDecoder(model, tokenizer, devices=jax.devices()[:device_count])
    batch, seen, params = ContinuousBatch(decoder), Collected(), {}
    split_rows = set()  # (cache rows, devices holding the cache) after each step

    def step():
        seen.steps(batch, 1)
        if batch._cache is not None:
            split_rows.add((batch._cache.positions.shape[0], len(batch._cache.keys[0].sharding.device_set)))

    for name in range(7):  # later requests decode longer: 5 of them at once, then fewer and fewer
        params[name] = SamplingParams(max_new_tokens=20 + 8 * name, temperature=0.0 if name % 2 else 0.9,
                                      top_k=5 if name == 4 else 0, seed=name,
                                      frequency_penalty=1.5 if name % 3 == 0 else 0.0,  # counts split over devices
                                      logit_bias={11: 4.0} if name == 5 else {})
        seen.add(batch, name, prompts[name % len(prompts)], params[name])
        step()
    while batch.busy:
        step()
    for name, param in params.items():
        [alone] = Sampler(model, tokenizer).generate([prompts[name % len(prompts)]], param)
        assert seen.results[name].token_ids == alone.token_ids, name
    # Each cache was on as many devices as leave each one a row: 1 row on one, 8 rows on all of them.
    assert {rows: devices for rows, devices in split_rows} == {rows: min(rows, device_count)
                                                               for rows, _ in split_rows}
    assert {rows for rows, _ in split_rows} == {1, 2, 4, 8}


def test_each_device_holds_only_its_rows_of_the_cache(served):
    model, tokenizer, prompts = served
    decoder = BatchDecoder(model, tokenizer, devices=jax.devices()[:2])
    batch = ContinuousBatch(decoder)
    for ids in prompts:
        batch.add(ServeRequest(prompt_ids=tuple(ids), params=SamplingParams(max_new_tokens=20, temperature=0.0)),
                  on_finish=lambda result: None)
    batch.step()
    rows, kv_heads = 4, model.config.num_kv_heads
    for buffer in (batch._cache.keys[0], batch._cache.values[0], batch._cache.positions):
        shards = buffer.addressable_shards
        assert sorted(shard.device.id for shard in shards) == [0, 1]
        assert all(shard.data.shape[0] == buffer.shape[0] // 2 for shard in shards)
    assert batch._cache.keys[0].shape[0] == rows * kv_heads


def test_a_serving_process_gets_one_host_device_per_core_unless_told():
    # JAX is asked for the host devices before its backend starts, in a fresh process as in a serve worker.
    env = {key: value for key, value in os.environ.items() if key != "XLA_FLAGS"}
    code = ("from jaxengine.serving import serving_devices; import os; "
            "print(len(serving_devices(3)), len(os.sched_getaffinity(0)))")
    told, cores = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                 check=True).stdout.split()
    assert told == "3"
    code = "from jaxengine.serving import serving_devices; print(len(serving_devices()))"
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == cores
    # Once the backend has started (this process: 8 host devices), the devices it has, at most as many as asked.
    assert serving_devices(3) == jax.devices()[:3] and serving_devices(1) == jax.devices()[:1]


def test_a_stopped_or_timed_out_request_frees_its_slot_for_a_waiting_one(served):
    model, tokenizer, prompts = served
    greedy = SamplingParams(max_new_tokens=40, temperature=0.0)
    now = [0.0]
    stopped = set()
    batch = ContinuousBatch(BatchDecoder(model, tokenizer), max_slots=2, clock=lambda: now[0])
    seen = Collected()
    for name, ids in zip("ab", prompts):
        batch.add(ServeRequest(prompt_ids=tuple(ids), params=greedy, deadline=2.0 if name == "b" else None),
                  on_finish=lambda r, name=name: seen.results.update({name: r}),
                  should_stop=lambda name=name: name in stopped)
    seen.add(batch, "c", prompts[2], greedy)
    seen.add(batch, "d", prompts[3], greedy)
    # Step 0 prefills a and b (1 token each) and dispatches their first call; step 1 dispatches the
    # second and reads the first back (9 tokens each): with both rows taken, c waiting changes nothing.
    seen.steps(batch, 2)
    assert batch.batch_sizes == [2, 2] and "c" not in seen.first_token_step  # both slots taken: c waits
    stopped.add("a")
    seen.steps(batch, 1)  # a's slot goes to c in the same step
    # a ends with the tokens it streamed; what the call in flight decoded for it is dropped.
    assert seen.results["a"].finish_reason == "cancelled" and len(seen.results["a"].token_ids) == 9
    assert seen.first_token_step == {"c": 2} and batch.batch_sizes[-1] == 2
    now[0] = 2.0
    seen.steps(batch, 1)  # past b's deadline: its slot goes to d
    assert seen.results["b"].finish_reason == "timeout" and len(seen.results["b"].token_ids) == 17
    assert seen.first_token_step == {"c": 2, "d": 3}
    while batch.busy:
        seen.steps(batch, 1)
    for name, ids in zip("abcd", prompts):
        assert seen.results[name].token_ids == alone_tokens(model, tokenizer, ids, 40)[:len(seen.results[name].token_ids)]
    assert len(seen.results["c"].token_ids) == len(seen.results["d"].token_ids) == 40


def test_the_server_lets_a_request_join_a_batch_that_is_decoding(served):
    model, tokenizer, prompts = served
    server = BatchingServer(BatchDecoder(model, tokenizer))
    long, short = SamplingParams(max_new_tokens=60, temperature=0.0), SamplingParams(max_new_tokens=6, temperature=0.0)
    a_tokens, a_tokens_at_b_start, b_submitted = [], [], threading.Event()

    def on_a_tokens(token_ids, delta):
        a_tokens.extend(token_ids)
        if len(a_tokens) == 9:  # the prefill's token and the first decode call's 8
            assert b_submitted.wait(timeout=30)  # holds the server's loop while b is submitted

    a = server.submit(ServeRequest(prompt_ids=tuple(prompts[1]), params=long), on_tokens=on_a_tokens)
    while len(a_tokens) < 9:
        time.sleep(0.01)
    b = server.submit(ServeRequest(prompt_ids=tuple(prompts[0]), params=short),
                      on_tokens=lambda token_ids, delta: a_tokens_at_b_start.append(len(a_tokens)))
    b_submitted.set()
    b_result, a_result = b.result(timeout=60), a.result(timeout=60)
    server.close()
    # b was submitted while a's first decode call was being read back, with the second already dispatched
    # (ContinuousBatch overlaps the two): it started once that call ended, not after a's sixtieth token.
    assert a_tokens_at_b_start[0] == 17
    assert b_result.token_ids == alone_tokens(model, tokenizer, prompts[0], 6)
    assert a_result.token_ids == alone_tokens(model, tokenizer, prompts[1], 60)
    assert max(server.batch_sizes) == 2 and server.batch_sizes[-1] == 1


def test_a_submitted_group_decodes_as_rows_of_the_same_calls_each_as_alone(served):
    """``submit_group`` (a /v1 request's n answers): one item of the server's queue, so every decode call from the
    first holds all its rows (the server's rows per call), each with its own seed getting its solo tokens and its
    own callbacks; a request the model cannot take refuses the group before any is queued; the group's stop ends
    every row."""
    model, tokenizer, prompts = served
    server = BatchingServer(BatchDecoder(model, tokenizer))
    ids = tuple(prompts[0])
    group = [ServeRequest(prompt_ids=ids, params=SamplingParams(max_new_tokens=12, temperature=0.9, seed=seed))
             for seed in (1, 2, 3)]
    too_long = ServeRequest(prompt_ids=ids, params=SamplingParams(max_new_tokens=10**6))
    with pytest.raises(PromptError):
        server.submit_group([group[0], too_long])
    streamed = {0: [], 1: [], 2: []}
    futures = server.submit_group(group, on_tokens=lambda index, token_ids, delta: streamed[index].extend(token_ids))
    results = [future.result(timeout=60) for future in futures]
    assert server.batch_sizes == [3, 3]  # the prefill's token, then 8 and 3 of the 12 in two calls of three rows
    for index, (request, result) in enumerate(zip(group, results)):
        [alone] = Sampler(model, tokenizer).generate([list(ids)], request.params)
        assert result.token_ids == alone.token_ids == streamed[index]
    stop = threading.Event()
    stopped = server.submit_group(group[:2], on_tokens=lambda index, token_ids, delta: stop.set(),
                                  should_stop=stop.is_set)
    assert [future.result(timeout=60).finish_reason for future in stopped] == ["cancelled", "cancelled"]
    server.close()


def test_a_failing_batch_fails_its_requests_and_the_server_keeps_serving(served):
    model, tokenizer, prompts = served
    server = BatchingServer(BatchDecoder(model, tokenizer))
    params = SamplingParams(max_new_tokens=6, temperature=0.0)

    def broken_stop_check():
        raise RuntimeError("the stop flag could not be read")

    failed = server.submit(ServeRequest(prompt_ids=tuple(prompts[0]), params=params), should_stop=broken_stop_check)
    with pytest.raises(RuntimeError, match="stop flag"):
        failed.result(timeout=60)
    served_after = server.submit(ServeRequest(prompt_ids=tuple(prompts[0]), params=params)).result(timeout=60)
    server.close()
    assert served_after.token_ids == alone_tokens(model, tokenizer, prompts[0], 6)


def test_the_next_decode_call_is_dispatched_before_the_last_one_is_read_back(served):
    # While the host streams one call's tokens, the device already decodes the next (chained on the
    # first call's last tokens, which never leave the device for it); the tokens are those of decoding alone.
    model, tokenizer, prompts = served
    batch = ContinuousBatch(BatchDecoder(model, tokenizer))
    calls_dispatched_at_read = []  # (tokens streamed in one callback, decode calls dispatched by then)
    greedy = SamplingParams(max_new_tokens=30, temperature=0.0)
    results = []

    def on_tokens(token_ids, delta):
        calls_dispatched_at_read.append((len(token_ids), len(batch.batch_sizes)))

    batch.add(ServeRequest(prompt_ids=tuple(prompts[1]), params=greedy), on_finish=results.append, on_tokens=on_tokens)
    while batch.busy:
        batch.step()
    # Token 1 comes from the prefill, before any decode call; tokens 2-9 from call 1, read back once call 2
    # was dispatched; ... tokens 26-30 from call 4, read back with no call after it (the budget ends in it).
    # Each read streams in one callback.
    assert calls_dispatched_at_read == [(1, 0), (8, 2), (8, 3), (8, 4), (5, 4)]
    assert results[0].token_ids == alone_tokens(model, tokenizer, prompts[1], 30)


def test_a_row_ending_at_a_stop_token_gets_nothing_from_the_call_decoded_after_it(served):
    model, tokenizer, prompts = served
    [alone] = BatchDecoder(model, tokenizer).run(requests_for([prompts[0]], [SamplingParams(max_new_tokens=30,
                                                                                           temperature=0.0)]))
    stop_id = alone.token_ids[4]  # a token the answer reaches in its first decode call
    params = SamplingParams(max_new_tokens=30, temperature=0.0, stop_token_ids=(stop_id,))
    decoder = BatchDecoder(model, tokenizer)
    batch, streamed, results = ContinuousBatch(decoder), [], []
    batch.add(ServeRequest(prompt_ids=tuple(prompts[0]), params=params), on_finish=results.append,
              on_tokens=lambda token_ids, delta: streamed.extend(token_ids))
    while batch.busy:
        batch.step()
    first_stop = alone.token_ids.index(stop_id)
    assert results[0].token_ids == streamed == alone.token_ids[:first_stop + 1]
    assert results[0].finish_reason == "stop"
    assert len(batch.batch_sizes) == 2  # the call dispatched before the stop was seen, decoded in vain


def test_rows_with_their_own_penalties_and_bias_decode_together_as_the_sampler_decodes_them_alone(served):
    """Penalties and bias are data: requests with different ones share decode calls (chained ones, and calls
    after rows joined and the cache was laid out anew), each gets what the Sampler gives it alone, and other
    values compile nothing."""
    model, tokenizer, prompts = served
    params = {"a": SamplingParams(max_new_tokens=30, temperature=0.0, frequency_penalty=2.0),
              "b": SamplingParams(max_new_tokens=20, temperature=0.0, presence_penalty=1.5, logit_bias={5: 100}),
              "c": SamplingParams(max_new_tokens=20, temperature=0.8, seed=7, frequency_penalty=-0.5,
                                  logit_bias={7: -100, 9: 3.5}),
              "d": SamplingParams(max_new_tokens=25, temperature=0.0)}

    def wave(params):
        batch, seen = ContinuousBatch(BatchDecoder(model, tokenizer)), Collected()
        seen.add(batch, "a", prompts[1], params["a"])
        seen.add(batch, "d", prompts[3], params["d"])
        seen.steps(batch, 3)  # a and d decode chained calls before b and c join
        seen.add(batch, "b", prompts[0], params["b"])
        seen.add(batch, "c", prompts[2], params["c"])
        while batch.busy:
            seen.steps(batch, 1)
        return batch, seen

    batch, seen = wave(params)
    assert max(batch.batch_sizes) >= 3  # rows of three settings or more in one call (a row may end at EOS first)
    for name, ids in zip("abcd", (prompts[1], prompts[0], prompts[2], prompts[3])):
        [alone] = Sampler(model, tokenizer).generate([ids], params[name])
        assert seen.results[name].token_ids == alone.token_ids, name
    assert seen.results["b"].token_ids == [5] * 20
    assert 7 not in seen.results["c"].token_ids
    traces = batch.trace_count
    other = {name: dataclasses.replace(value, presence_penalty=-value.presence_penalty / 2,
                                       frequency_penalty=value.frequency_penalty / 4,
                                       logit_bias={token_id: -bias for token_id, bias in value.logit_bias})
             for name, value in params.items()}
    assert wave(other)[0].trace_count == traces


def test_it_rejects_a_logit_bias_outside_the_vocabulary(served):
    model, tokenizer, prompts = served
    vocab_size = model.config.vocab_size
    request = ServeRequest(prompt_ids=tuple(prompts[0]), params=SamplingParams(max_new_tokens=4,
                                                                                 logit_bias={vocab_size: -1}))
    with pytest.raises(PromptError, match=f"logit_bias: token id {vocab_size} is outside the model's vocabulary"):
        BatchDecoder(model, tokenizer).check(request)


def test_a_serving_loop_compiles_once_per_shape_not_per_request(served):
    model, tokenizer, _ = served
    decoder = BatchDecoder(model, tokenizer)

    def wave(schedule_seed, content_seed, *, check_tokens=False):
        # 12 staggered arrivals: prompts of 2 to 15 tokens (one prompt bucket), budgets of 3 to 20 tokens.
        schedule, content = np.random.default_rng(schedule_seed), np.random.default_rng(content_seed)
        batch, seen, requests = ContinuousBatch(decoder, max_slots=8), Collected(), {}
        for name in range(12):
            ids = [int(i) for i in content.integers(0, model.config.vocab_size, size=int(schedule.integers(2, 16)))]
            requests[name] = ids, SamplingParams(max_new_tokens=int(schedule.integers(3, 21)), temperature=0.0)
            seen.add(batch, name, *requests[name])
            seen.steps(batch, int(schedule.integers(0, 3)))
        while batch.busy:
            seen.steps(batch, 1)
        assert len(seen.results) == 12
        if check_tokens:  # rows gathered, shifted, grown and shrunk under them still decode as alone
            for name, (ids, params) in requests.items():
                assert seen.results[name].token_ids == Sampler(model, tokenizer).generate([ids], params)[0].token_ids
        return batch.trace_count

    before = ContinuousBatch(decoder).trace_count  # compiled code is shared by every model of this structure
    first = wave(0, 0, check_tokens=True)
    assert wave(0, 1) == first  # the same shapes with other tokens: nothing compiled
    # Other schedules meet other shapes, but only from a fixed set: prefills of 1, 2, 4 or 8 new requests
    # x 16 prompt slots, decodes of 1, 2, 4 or 8 rows x 16, 32 or 64 cache slots (span 15 + 20 + 8 at most).
    assert wave(1, 2) - before <= 4 + 12


def test_gumbel_noise_gives_the_draws_of_jax_random_categorical():
    logits_bv = jax.random.normal(jax.random.key(1), (3, 50)) * 3
    seed_b, first_step_b = jnp.array([0, 7, 2**32 - 1], jnp.uint32), jnp.array([0, 5, 11], jnp.int32)
    noise_kbv = gumbel_noise(seed_b, first_step_b, 4, 50)
    for offset in range(4):
        for row in range(3):
            key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed_b[row]), 0), first_step_b[row] + offset)
            expected = jax.random.categorical(key, logits_bv[row])
            assert int(jnp.argmax(noise_kbv[offset, row] + logits_bv[row])) == int(expected)
    assert len({int(jnp.argmax(noise_kbv[offset, 0])) for offset in range(4)}) > 1  # each step draws anew


def test_gumbel_noise_is_jax_random_gumbel_bit_for_bit():
    # The written-out threefry hash and uniform-to-Gumbel transform against jax's own, for seeds at both
    # ends of uint32 and a vocabulary of odd size.
    seed_b, first_step_b = jnp.array([0, 1, 2**32 - 1, 123456], jnp.uint32), jnp.array([0, 5, 11, 1000], jnp.int32)
    noise_kbv = np.asarray(gumbel_noise(seed_b, first_step_b, 3, 1001))
    for offset in range(3):
        for row in range(4):
            key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed_b[row]), 0), first_step_b[row] + offset)
            np.testing.assert_array_equal(noise_kbv[offset, row], np.asarray(jax.random.gumbel(key, (1001,))))


def test_model_cache_evicts_the_least_recently_used_beyond_its_budget():
    loads = []

    def loader(path: Path) -> LoadedModel:
        loads.append(path.name)
        return LoadedModel(model=None, tokenizer=None, nbytes=int(path.name[1:]), path=path)

    cache = ModelCache(budget_bytes=100, loader=loader)
    cache.get("a", "m40")
    cache.get("b", "m50")
    cache.get("a", "m40")  # a is now the most recent
    cache.get("c", "m30")  # 40 + 50 + 30 > 100: b goes
    assert cache.keys == ["a", "c"] and cache.nbytes == 70
    cache.get("d", "m200")  # larger than the budget: served alone
    assert cache.keys == ["d"] and loads == ["m40", "m50", "m30", "m200"]


def test_model_cache_loads_again_a_directory_replaced_under_the_same_key(tmp_path):
    # A resumed run's export and a serving copy made again are new directories renamed into the old one's
    # place (hf.replace_directory), under the same key: the chat served the weights first loaded.
    from jaxengine.checkpoint.hf import replace_directory

    loads = []

    def loader(path: Path) -> LoadedModel:
        loads.append((path / "weights").read_text())
        return LoadedModel(model=None, tokenizer=None, nbytes=40, path=path)

    def write_export(text: str) -> None:
        staging = tmp_path / f".export.writing-{text}"
        staging.mkdir()
        (staging / "weights").write_text(text)
        replace_directory(staging, tmp_path / "export")

    cache = ModelCache(budget_bytes=100, loader=loader)
    write_export("step 6")
    cache.get("run_a", tmp_path / "export")
    cache.get("run_a", tmp_path / "export")
    write_export("step 250")
    assert cache.get("run_a", tmp_path / "export") is not None
    assert loads == ["step 6", "step 250"]
    assert cache.keys == ["run_a"] and cache.nbytes == 40  # the old weights' memory is given back


def test_it_loads_a_quantized_copy_and_a_plain_export(served, tmp_path):
    from jaxengine.quantize import QuantScheme, export_quantized, load_quantized

    model, tokenizer, prompts = served
    source = factories.build_tiny_model_dir(tmp_path / "plain")
    export_quantized(source, tmp_path / "int8", scheme=QuantScheme.named("int8"))
    plain, quantized = load_serving_model(source), load_serving_model(tmp_path / "int8")
    # On CPU (these tests) the copy's codes are expanded once at load (expand_serving_kernels): the plain
    # model's memory, and the quantized model's answers, those its codes give decoding as they are.
    assert jax.default_backend() == "cpu" and quantized.nbytes == plain.nbytes
    codes, _, _ = load_quantized(tmp_path / "int8", compute_dtype=jnp.float32)
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    [result] = BatchDecoder(quantized.model, quantized.tokenizer).run(requests_for(prompts[:1], [params]))
    [from_codes] = BatchDecoder(codes, quantized.tokenizer).run(requests_for(prompts[:1], [params]))
    assert len(result.token_ids) == 8 and result.token_ids == from_codes.token_ids


class WithEos:
    """The tokenizer with other EOS ids."""

    def __init__(self, tokenizer, eos_ids):
        self._tokenizer = tokenizer
        self.eos_ids = eos_ids

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


def test_a_row_ends_at_eos_unless_it_ignores_it(served):
    model, tokenizer, prompts = served
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    [free] = BatchDecoder(model, tokenizer).run(requests_for(prompts[:1], [greedy]))
    decoder = BatchDecoder(model, WithEos(tokenizer, [free.token_ids[2]]))  # the third greedy token is EOS
    [stopped] = decoder.run(requests_for(prompts[:1], [greedy]))
    assert stopped.token_ids == free.token_ids[:3] and stopped.finish_reason == "stop"
    [ignoring] = decoder.run([ServeRequest(prompt_ids=tuple(prompts[0]), params=greedy, ignore_eos=True)])
    assert ignoring.token_ids == free.token_ids and ignoring.finish_reason == "length"


def test_a_stop_string_ends_its_row_as_the_sampler_ends_it_and_is_never_streamed(served):
    model, tokenizer, prompts = served
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
    decoder = BatchDecoder(model, tokenizer)
    free = decoder.run(requests_for(prompts[:2], [greedy, greedy]))
    stop = free[0].text[4:7]  # three characters from the middle of row 0's greedy text
    assert len(stop) == 3 and free[0].text.find(stop) == 4
    with_stop = SamplingParams(max_new_tokens=12, temperature=0.0, stop_strings=(stop, "\x00never"))
    streamed: dict[int, str] = {0: "", 1: ""}

    def on_tokens(index, token_ids, delta):
        streamed[index] += delta
        assert stop not in streamed[index]

    results = decoder.run(requests_for(prompts[:2], [with_stop, with_stop]), on_tokens=on_tokens)
    references = Sampler(model, tokenizer).generate(prompts[:2], with_stop)
    assert results[0].text == free[0].text[:4] == references[0].text and results[0].finish_reason == "stop"
    assert len(results[0].token_ids) < 12
    for result, reference in zip(results, references):
        assert result.token_ids == reference.token_ids and result.text == reference.text
        assert result.finish_reason == reference.finish_reason
    assert streamed == {0: results[0].text, 1: results[1].text}


def test_warmup_requests_cover_each_prompt_bucket_with_each_temperature(served):
    model, tokenizer, _ = served
    requests = BatchDecoder(model, tokenizer).warmup_requests(longest_prompt=64, max_new_tokens=48)
    # Buckets 16, 32, 64 (the decoder's min_bucket is 16); each bucket's shortest prompt, answered until
    # the slot its longest prompt reaches with 48 new tokens.
    # Then the buckets again at the chat's temperature with penalties and a logit bias: their own programs.
    assert [(len(r.prompt_ids), r.params.max_new_tokens, r.params.temperature) for r in requests] == [
        (9, 55, 0.7), (17, 63, 0.7), (33, 79, 0.7), (9, 55, 0.0), (17, 63, 0.0), (33, 79, 0.0),
        (9, 55, 0.7), (17, 63, 0.7), (33, 79, 0.7)]
    assert all(r.ignore_eos and r.params.top_k == 0 and r.params.top_p == 1.0 for r in requests)
    assert [r.params.penalized and r.params.biased for r in requests] == [False] * 6 + [True] * 3
    assert not any(r.params.penalized or r.params.biased for r in BatchDecoder(model, tokenizer).warmup_requests(
        longest_prompt=64, max_new_tokens=48, adjusted_temperatures=()))
    # Within the tiny model's 256-token context.
    long = BatchDecoder(model, tokenizer).warmup_requests(longest_prompt=1000, max_new_tokens=1000,
                                                          temperatures=(0.0,), adjusted_temperatures=())
    assert [len(r.prompt_ids) for r in long] == [9, 17, 33, 65, 129]
    assert all(len(r.prompt_ids) + r.params.max_new_tokens == 256 for r in long)


def test_a_fast_forwarded_warmup_row_meets_every_layout_of_a_decoded_one_in_fewer_calls(served):
    model, tokenizer, _ = served
    decoder = BatchDecoder(model, tokenizer, min_bucket=8)
    request = ServeRequest(prompt_ids=(1,) * 9, ignore_eos=True, params=SamplingParams(max_new_tokens=150))
    layouts, results = {}, {}
    for fast_forward in (False, True):
        batch = ContinuousBatch(decoder, max_slots=1)
        batch.add(request, on_finish=lambda result, key=fast_forward: results.__setitem__(key, result),
                  fast_forward=fast_forward)
        while batch.busy:
            batch.step()
        layouts[fast_forward] = batch.layouts
    # The same cache layouts in the same order (so the same decode and re-layout programs), each met
    # once or twice instead of once per call; the row still ends at its budget.
    met = {key: [layout for index, layout in enumerate(calls) if index == 0 or calls[index - 1] != layout]
           for key, calls in layouts.items()}
    assert met[True] == met[False] and [rows for rows, _ in met[False]] == [1] * len(met[False])
    assert [slots for _, slots in met[False]] == [32, 64, 128, 256]  # the prompt bucket 16 + a call of 8, ...
    assert len(layouts[True]) <= 2 * len(met[True]) < len(layouts[False]), (len(layouts[True]), len(layouts[False]))
    assert len(results[True].token_ids) == len(results[False].token_ids) == 150


@contextlib.contextmanager
def xla_compiles(counted=lambda: True):
    """The seconds of every XLA compile, of any program, while the block runs and ``counted()`` holds."""
    compiles = []

    def on_event(event, seconds, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration" and counted():
            compiles.append(seconds)

    jax.monitoring.register_event_duration_secs_listener(on_event)
    try:
        yield compiles
    finally:
        jax.monitoring.unregister_event_duration_listener(on_event)


def test_a_warmed_server_compiles_nothing_for_a_lone_conversation(served):
    model, tokenizer, _ = served
    decoder = BatchDecoder(model, tokenizer, min_bucket=8)  # its own shapes: nothing compiled by other tests
    server = BatchingServer(decoder)
    server.warm(decoder.warmup_requests(longest_prompt=64, max_new_tokens=48))
    assert server.warmed.wait(timeout=300)
    warmed = decoder.compiled.trace_count
    with xla_compiles() as compiles, contextlib.closing(server):
        rng = np.random.default_rng(0)
        for length in (1, 7, 8, 9, 16, 20, 33, 50, 64):
            for temperature in (0.7, 0.0):
                ids = tuple(int(i) for i in rng.integers(0, model.config.vocab_size, size=length))
                request = ServeRequest(prompt_ids=ids, ignore_eos=True,  # every answer runs its whole budget
                                       params=SamplingParams(max_new_tokens=48, temperature=temperature, seed=length))
                assert len(server.submit(request).result(timeout=60).token_ids) == 48
        assert decoder.compiled.trace_count == warmed
        assert compiles == []
        # The listener hears compiles: top-k is not warmed, so its programs compile now.
        top_k = SamplingParams(max_new_tokens=4, temperature=0.7, top_k=5)
        server.submit(ServeRequest(prompt_ids=(1, 2, 3), params=top_k)).result(timeout=60)
    assert decoder.compiled.trace_count > warmed and compiles


def test_a_warmed_server_compiles_nothing_for_a_penalized_or_biased_conversation(served):
    """QA: a chat's first request with presence/frequency penalties or logit_bias compiled new decode programs
    on the serve worker (seconds on CPU) at each cache size it met: the warm-up compiled only those without.
    Then greedy decoding with a penalty or a bias, and a logit_bias of more than 8 tokens, still did: the warm-up
    decodes with them at the chat's default temperature and a bias of one token."""
    model, tokenizer, _ = served
    decoder = BatchDecoder(model, tokenizer, min_bucket=32)  # its own shapes: nothing compiled by other tests
    server = BatchingServer(decoder)
    server.warm(decoder.warmup_requests(longest_prompt=64, max_new_tokens=48))
    assert server.warmed.wait(timeout=300)
    warmed = decoder.compiled.trace_count
    with xla_compiles() as compiles, contextlib.closing(server):
        rng = np.random.default_rng(1)
        many = {int(token): float(bias) for token, bias in zip(rng.permutation(model.config.vocab_size)[:300],
                                                                rng.uniform(-5, 5, size=300))}
        for length in (1, 20, 33, 64):
            for temperature, adjustment in (
                    (0.7, {"presence_penalty": 0.8}), (0.7, {"frequency_penalty": -0.5}),
                    (0.7, {"logit_bias": {7: 2.5}}),
                    (0.7, {"presence_penalty": 1.0, "frequency_penalty": 0.5, "logit_bias": {3: -100, 9: 4.0}}),
                    (0.0, {"presence_penalty": 0.8}), (0.0, {"logit_bias": {7: 2.5}}),
                    (0.7, {"logit_bias": dict(list(many.items())[:9])}), (0.0, {"logit_bias": many})):
                ids = tuple(int(i) for i in rng.integers(0, model.config.vocab_size, size=length))
                request = ServeRequest(prompt_ids=ids, ignore_eos=True,  # every answer runs its whole budget
                                       params=SamplingParams(max_new_tokens=48, temperature=temperature, seed=length,
                                                             **adjustment))
                assert len(server.submit(request).result(timeout=60).token_ids) == 48
        assert decoder.compiled.trace_count == warmed
        assert compiles == []


def test_a_warmed_server_compiles_nothing_to_score_a_prompt_of_its_warmed_buckets(tmp_path):
    """QA: an echo with logprobs (how lm-evaluation-harness scores text) compiled its prompt bucket's scoring program
    on the request, the warm-up compiling none: the first such request per bucket waited a compile. The warm-up's
    scores (``warmup_scores``) compile the buckets its answers' prompts meet, one program each; a longer prompt's
    bucket still compiles on first use."""
    # A context of its own: a model structure of its own, whose programs no other test compiled.
    model_dir = factories.build_tiny_model_dir(tmp_path / "scored", context=112)
    model, _ = load_hf_model(model_dir)
    decoder = BatchDecoder(model, load_tokenizer(model_dir), min_bucket=8)
    server = BatchingServer(decoder)
    scores = decoder.warmup_scores(longest_prompt=32)
    assert [len(score.prompt_ids) for score in scores] == [5, 9, 17]  # the shortest prompt of buckets 8, 16 and 32
    # The default 256 tokens are past the context: the buckets up to 128, whose shortest prompt (65) fits it.
    assert [len(score.prompt_ids) for score in decoder.warmup_scores()] == [5, 9, 17, 33, 65]
    server.warm(scores)
    assert server.warmed.wait(timeout=300)
    warmed = decoder.compiled.trace_count
    assert warmed == 3
    with xla_compiles() as compiles, contextlib.closing(server):
        for length in (1, 2, 8, 9, 16, 17, 31, 32):
            assert len(decoder.prompt_logprobs(list(range(3, 3 + length)), alternatives=2)) == length - 1
        assert decoder.compiled.trace_count == warmed
        assert compiles == []
        decoder.prompt_logprobs(list(range(3, 36)), alternatives=1)  # bucket 64: not warmed
    assert decoder.compiled.trace_count == warmed + 1 and compiles


def test_the_worker_and_the_staggered_bench_warm_with_one_list_scorings_included(tmp_path):
    """bench/serve_staggered.py warmed its server with a copy of the serve worker's warm-up list made before the
    prompt scorings (``warmup_scores``) were added to it, so it measured a server the worker never runs. Both now
    warm with ``BatchDecoder.warmup``."""
    model_dir = factories.build_tiny_model_dir(tmp_path / "whole", context=112)
    model, _ = load_hf_model(model_dir)
    decoder = BatchDecoder(model, load_tokenizer(model_dir), min_bucket=8)
    whole = decoder.warmup()
    assert whole == [*decoder.warmup_requests(), *decoder.warmup_groups(), *decoder.warmup_scores()]
    assert whole[-len(decoder.warmup_scores()):] == decoder.warmup_scores() and decoder.warmup_scores()
    root = Path(__file__).resolve().parents[2]
    for user in ("bench/serve_staggered.py", "worker/tasks/serve.py"):
        assert ".warm(decoder.warmup())" in (root / user).read_text(), user


def test_warmup_groups_hold_each_row_count_of_the_smallest_buckets_request(served):
    model, tokenizer, _ = served
    decoder = BatchDecoder(model, tokenizer, max_slots=8)
    groups = decoder.warmup_groups(row_counts=(1, 2, 4, 16), max_new_tokens=48)
    [lone] = decoder.warmup_requests(longest_prompt=9, max_new_tokens=48, temperatures=(0.7,),
                                     adjusted_temperatures=())
    assert [len(group) for group in groups] == [2, 4, 8]  # 1 is the lone warm-up's; 16 is capped at max_slots
    assert all(request == lone for group in groups for request in group)


def test_a_warmed_server_compiles_no_decode_call_for_concurrent_conversations_on_two_devices(served):
    """QA: 16 chats arriving within 150 ms through the API waited about a second for their first tokens:
    the first time a row count met a cache size, its decode program compiled while every row waited, and
    a call chained on the last one's tokens (split over the devices) was another program than a call
    from tokens on the host, which is all a warm-up makes."""
    model, tokenizer, _ = served
    decoder = BatchDecoder(model, tokenizer, min_bucket=8, devices=jax.devices()[:2])  # shapes of its own
    server = BatchingServer(decoder)
    server.warm([*decoder.warmup_requests(longest_prompt=8, max_new_tokens=40, temperatures=(0.7,),
                                          adjusted_temperatures=()),
                 *decoder.warmup_groups(row_counts=(2, 4), max_new_tokens=40)])
    assert server.warmed.wait(timeout=300)
    warmed = decoder.compiled.trace_count
    try:
        for round_ in range(3):  # 1 to 4 rows at a time, as the server's loop happens to take them
            futures = []
            for index in range(4):
                request = ServeRequest(prompt_ids=(1 + index, 2, 3), ignore_eos=True,
                                       params=SamplingParams(max_new_tokens=40, temperature=0.7, seed=index))
                futures.append(server.submit(request))
                time.sleep(0.002 * round_ * index)
            assert [len(future.result(timeout=60).token_ids) for future in futures] == [40] * 4
        assert max(server.batch_sizes) > 1  # concurrent rows were decoded together
        assert decoder.compiled.trace_count == warmed
    finally:
        server.close()


def test_a_request_submitted_during_the_warmup_is_served_first_and_as_alone(served):
    model, tokenizer, prompts = served
    decoder = BatchDecoder(model, tokenizer, min_bucket=4)  # its own shapes: the warm-up compiles
    server = BatchingServer(decoder)
    server.warm(decoder.warmup_requests(longest_prompt=128, max_new_tokens=64))
    request = ServeRequest(prompt_ids=tuple(prompts[1]), params=SamplingParams(max_new_tokens=20, temperature=0.0))
    result = server.submit(request).result(timeout=120)
    assert not server.warmed.is_set()  # answered while warm-up requests were left
    assert result.token_ids == alone_tokens(model, tokenizer, prompts[1], 20)
    assert server.warmed.wait(timeout=300)
    assert server.batch_sizes and max(server.batch_sizes) == 1  # no warm-up row in a served decode call
    server.close()


def random_cache(model, rng, *, rows, length, index):
    cache = model.init_cache(batch_size=rows, max_length=length)
    return cache.replace(keys=tuple(rng.standard_normal(keys.shape).astype(keys.dtype) for keys in cache.keys),
                         values=tuple(rng.standard_normal(values.shape).astype(values.dtype) for values in cache.values),
                         positions=rng.integers(0, 99, (rows, length)).astype(np.int32), index=np.int32(index))


def assert_same_cache(actual, expected):
    for got, want in zip(jax.tree.leaves(jax.device_get(actual)), jax.tree.leaves(jax.device_get(expected)), strict=True):
        assert np.shape(got) == np.shape(want)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("device_count", [1, 2])
def test_a_relayout_or_insert_in_numpy_lays_the_cache_out_as_its_program_does(served, device_count):
    """On host devices a re-layout or insert whose program is not compiled yet runs in numpy instead
    (``ContinuousBatch._on_host``): rows gathered (a source past the old rows gives zeros), slots shifted
    either way with zeros where nothing maps, a prefilled group's padding row dropped."""
    model, tokenizer, _ = served
    decoder = BatchDecoder(model, tokenizer, devices=jax.devices()[:device_count])
    compiled, kv_heads, rng = decoder.compiled, model.config.num_kv_heads, np.random.default_rng(0)
    cache = random_cache(model, rng, rows=4, length=32, index=20)
    for source_rows_n, shift, rows, length in [([2, 0, 4, 4, 4, 4, 4, 4], -8, 8, 64),  # grow; slots move right
                                               ([3, 1], 12, 2, 16),  # shrink; the oldest slots dropped
                                               ([0, 1, 2, 3], 5, 4, 32)]:
        source_rows_n, mesh = np.array(source_rows_n, np.int32), decoder.mesh_for(rows)
        with _on(mesh):
            expected = compiled.relayout(cache if mesh is None else decoder.place(cache, mesh, whole=True),
                                         source_rows_n, np.int32(shift), rows=rows, length=length)
        moved = _relayout_on_host(cache, source_rows_n, shift, rows=rows, length=length, kv_heads=kv_heads)
        assert_same_cache(decoder.upload(moved, mesh), expected)
        assert int(moved.index) == 20 - shift
    group = random_cache(model, rng, rows=4, length=8, index=8)
    rows_g = np.array([2, 0, 4, 4], np.int32)  # two requests and two padding rows
    mesh = decoder.mesh_for(4)
    placed = cache if mesh is None else decoder.place(cache, mesh)
    expected = jax.device_get(compiled.insert(decoder.upload(jax.device_get(placed), mesh),
                                              decoder.upload(group, mesh), rows_g, np.int32(24)))
    with _on(mesh):
        inserted = _insert_on_host(placed, group, rows_g, 24, kv_heads=kv_heads)
    assert_same_cache(inserted, expected)
    assert np.array_equal(inserted.positions[[1, 3]], cache.positions[[1, 3]])  # rows without a request kept
    assert np.array_equal(inserted.positions[2, 16:24], group.positions[0])


@pytest.mark.parametrize("case", ["move", "prefill"])
def test_requests_joining_a_batch_compile_nothing_while_rows_decode_and_what_they_missed_compiles_when_idle(
        served, case):
    """QA: a burst of chats met 2-4 compiles on the serving loop every round, each stalling every row
    0.1-0.3 s: a re-layout of each pair of cache layouts and an insert of each group into each layout
    ("move"), and a prefill per group size and prompt bucket ("prefill": real prompts fall in every
    bucket). On host devices a move not compiled yet runs in numpy; a group whose prefill is not compiled
    is prefilled one request at a time; either program compiles once the server is idle, and the next
    burst like it runs it."""
    model, tokenizer, _ = served
    # Devices of its own: the record of compiled programs (like jit's) is shared by every model of this structure.
    devices = jax.devices()[2:4] if case == "move" else jax.devices()[4:6]
    decoder = BatchDecoder(model, tokenizer, min_bucket=8, devices=devices)
    server = BatchingServer(decoder)
    server.warm([*decoder.warmup_requests(longest_prompt=16, max_new_tokens=40, temperatures=(0.0,),
                                          adjusted_temperatures=()),
                 *decoder.warmup_groups(row_counts=(2, 4), max_new_tokens=40, temperature=0.0)])
    assert server.warmed.wait(timeout=300) and not decoder.compiled.missed
    # A lone answer to a prompt of bucket 8, then three joining it at once, of bucket 8 or 16.
    lone, joining = (1, 2, 3), [tuple(range(10 + index, 16 + index + (6 if case == "prefill" else 0)))
                                for index in range(3)]
    placement = tuple(device.id for device in devices)
    expected = {"move": ("relayout", (1, 16), None, 4, 32, placement),  # 1 row x 16 slots on one device -> 4 x 32
                "prefill": ("prefill", 4, 16, False, False, False, False, placement),  # the warm-up's groups: bucket 8
                }[case]
    futures = []

    def unanswered_on_the_loop() -> bool:  # a compile on the serving loop while a request is unanswered
        return threading.current_thread().name == "batching-server" and not all(future.done() for future in futures)

    def burst():
        params, first_token, joined = SamplingParams(max_new_tokens=40, temperature=0.0), threading.Event(), threading.Event()

        def on_tokens(token_ids, delta):  # holds the loop at the lone answer's first token until the others came
            first_token.set()
            joined.wait(timeout=60)

        futures[:] = [server.submit(ServeRequest(prompt_ids=lone, params=params), on_tokens=on_tokens)]
        assert first_token.wait(timeout=60)
        futures.extend(server.submit(ServeRequest(prompt_ids=ids, params=params)) for ids in joining)
        joined.set()
        return [future.result(timeout=60).token_ids for future in futures]

    with xla_compiles(unanswered_on_the_loop) as stalls, contextlib.closing(server):
        server.batch_sizes.clear()
        first = burst()
        missed = set(decoder.compiled.missed)
        assert expected in missed, missed
        deadline = time.monotonic() + 120
        while not missed <= decoder.compiled.compiled_keys and time.monotonic() < deadline:  # by the idle server
            time.sleep(0.05)
        assert not decoder.compiled.missed and missed <= decoder.compiled.compiled_keys
        server.batch_sizes.clear()
        second = burst()
        # What the first burst missed ran as programs this time (a group prefilled whole may meet a new insert).
        assert not missed & set(decoder.compiled.missed)
    assert max(server.batch_sizes) == 4  # the three joined the lone answer
    assert stalls == []
    assert first == second == [alone_tokens(model, tokenizer, ids, 40) for ids in [lone, *joining]]


def test_an_accelerators_way_of_moving_and_making_caches_decodes_what_the_host_way_does(served):
    """Off host devices (``BatchDecoder.on_host`` False) moves run as programs where met and a first cache
    is zeros made on the device; requests joining a batch must decode the same either way, and alone."""
    model, tokenizer, prompts = served
    params = [SamplingParams(max_new_tokens=n, temperature=t, seed=n) for n, t in ((30, 0.0), (12, 0.8), (20, 0.0))]
    results = {}
    for on_host in (True, False):
        decoder = BatchDecoder(model, tokenizer, min_bucket=4, devices=jax.devices()[6:8])  # shapes of its own
        decoder.on_host = on_host
        batch, seen = ContinuousBatch(decoder), Collected()
        seen.add(batch, 0, prompts[1], params[0])
        seen.steps(batch, 2)
        seen.add(batch, 1, prompts[0], params[1])
        seen.add(batch, 2, prompts[3], params[2])
        while batch.busy:
            seen.steps(batch, 1)
        results[on_host] = [seen.results[name].token_ids for name in range(3)]
        assert {rows for rows, _ in batch.layouts} == {1, 4}  # grew from one row to four (over two devices)
    alone = [Sampler(model, tokenizer).generate([ids], param)[0].token_ids
             for ids, param in zip([prompts[1], prompts[0], prompts[3]], params)]
    assert results[True] == results[False] == alone


def decoder_with_programs_of_its_own(model, tokenizer, *, on_host: bool) -> BatchDecoder:
    """A decoder on host devices or not, whose compiled programs no earlier test shares: a model's programs are
    shared by its decoders, so what an earlier test's batch missed (or compiled) would otherwise change what
    compiles when (a test's own missed program waiting behind leftovers, or one compiled already)."""
    PROGRAMS.clear()
    decoder = BatchDecoder(model, tokenizer, min_bucket=8)
    decoder.on_host = on_host
    return decoder


@pytest.mark.parametrize("on_host", [True, False])
def test_what_a_busy_batch_missed_compiles_at_once_off_host_devices_and_when_idle_on_them(served, on_host):
    """On host devices the compile thread starts only while the server is idle (it would take a core from
    the decoding rows); on an accelerator it need not wait for an idle moment, which steady load may never
    give: a group's prefill missed mid-answer compiles while the first answer still decodes."""
    model, tokenizer, _ = served
    decoder = decoder_with_programs_of_its_own(model, tokenizer, on_host=on_host)
    server = BatchingServer(decoder)
    greedy, top_k = SamplingParams(max_new_tokens=8, temperature=0.0), SamplingParams(max_new_tokens=8, temperature=0.5, top_k=5)
    prompts = [tuple(range(10 + i, 50 + i)) for i in range(3)]  # 40 tokens: bucket 64
    # The three together, one of them sampled with top-k; no bias, no logprobs.
    key = ("prefill", 4, 64, True, True, False, False, None)
    for sampling in (greedy, top_k):  # each one's lone prefill is compiled
        server.submit(ServeRequest(prompt_ids=prompts[0], params=sampling)).result(timeout=60)
    assert key not in decoder.compiled.compiled_keys
    joined, calls, compiled_while_busy = threading.Event(), [], []

    def on_tokens(token_ids, delta):  # the lone answer's reads: the first holds the loop until the others came
        calls.append(len(token_ids))
        if len(calls) == 1:
            joined.wait(timeout=60)
        elif len(calls) == 3:  # two decode calls after the group joined
            deadline = time.monotonic() + (0.5 if on_host else 30)
            while key not in decoder.compiled.compiled_keys and time.monotonic() < deadline:
                time.sleep(0.01)
            compiled_while_busy.append(key in decoder.compiled.compiled_keys)

    try:
        first = server.submit(ServeRequest(prompt_ids=(1, 2, 3), params=SamplingParams(max_new_tokens=60, temperature=0.0)),
                              on_tokens=on_tokens)
        while not calls:
            time.sleep(0.001)
        group = [server.submit(ServeRequest(prompt_ids=ids, params=top_k if index == 0 else greedy))
                 for index, ids in enumerate(prompts)]
        joined.set()
        for future in [first, *group]:
            future.result(timeout=60)
    finally:
        server.close()
    assert compiled_while_busy == [not on_host]


# "Within it" is an hour: the lone answer keeps the loop busy for its 80 tokens, which on a machine at load 14 took
# longer than the 30 s this case once used, so the server rightly compiled (a suite run on a shared machine).
@pytest.mark.parametrize("busy_compile_after_s, compiles_while_busy", [(0.0, True), (3600.0, False)],
                         ids=["busy past the limit", "busy within it"])
def test_a_server_on_host_devices_busy_past_the_limit_compiles_what_it_missed(served, busy_compile_after_s,
                                                                          compiles_while_busy):
    """On host devices what a batch missed compiled only while the server was idle, so under load that never
    let up it never compiled (every join went on moving its cache in numpy, every group prefilled one request at
    a time). Busy for ``busy_compile_after_s`` without a break, the server starts the compile anyway."""
    model, tokenizer, _ = served
    decoder = decoder_with_programs_of_its_own(model, tokenizer, on_host=True)
    server = BatchingServer(decoder, busy_compile_after_s=busy_compile_after_s)
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    prompts = [tuple(range(100 + i, 124 + i)) for i in range(3)]  # 24 tokens: bucket 32, as three at once
    joined, compiling = threading.Event(), []

    def on_tokens(token_ids, delta):  # the lone answer's reads, on the server's loop between its decode calls
        if not joined.is_set():
            joined.wait(timeout=60)
        else:
            time.sleep(0.05)  # the loop stays busy a while, each call a chance to start a compile
            compiling.append(server._compiles_running > 0)

    try:
        first = server.submit(ServeRequest(prompt_ids=(5, 6, 7), params=SamplingParams(max_new_tokens=80,
                                                                                          temperature=0.0)),
                              on_tokens=on_tokens)
        time.sleep(0.2)
        group = [server.submit(ServeRequest(prompt_ids=ids, params=greedy)) for ids in prompts]
        joined.set()
        for future in [first, *group]:
            future.result(timeout=60)
    finally:
        server.close()
    assert compiling and any(compiling) is compiles_while_busy


def test_a_time_limit_counts_from_the_first_token_not_from_the_compile_before_it(served):
    """A chat's 30 s ran from its submission: on a loaded machine a fresh serve worker's compile took most of it and the
    first answer timed out. ``time_limit`` counts from its first decode call's dispatch, after its first token (both
    programs compiled: tests/integration/test_serve.py times a real one); ``deadline`` still bounds the whole wait."""
    model, tokenizer, prompts = served
    greedy = SamplingParams(max_new_tokens=40, temperature=0.0)
    now = [0.0]
    batch = ContinuousBatch(BatchDecoder(model, tokenizer), max_slots=2, clock=lambda: now[0])
    seen = Collected()
    batch.add(ServeRequest(prompt_ids=tuple(prompts[0]), params=greedy, time_limit=5.0),
              on_finish=lambda r: seen.results.update({"limited": r}))
    batch.add(ServeRequest(prompt_ids=tuple(prompts[1]), params=greedy, time_limit=5.0, deadline=50.0),
              on_finish=lambda r: seen.results.update({"bounded": r}))
    now[0] = 60.0  # the programs compiled for a minute before the first token: past the bound, not the time limit
    seen.steps(batch, 1)
    assert seen.results["bounded"].finish_reason == "timeout" and seen.results["bounded"].token_ids == []
    assert "limited" not in seen.results
    now[0] = 64.0
    seen.steps(batch, 2)
    assert "limited" not in seen.results  # 4 s after its first decode call
    now[0] = 65.0
    seen.steps(batch, 1)
    assert seen.results["limited"].finish_reason == "timeout" and seen.results["limited"].first_token_seconds == 60.0
    assert 0 < len(seen.results["limited"].token_ids) < 40
