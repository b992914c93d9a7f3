"""Serving: batched decoding gives each request the tokens it gets alone (and from the Sampler), per-row
settings, stop and timeout, the batching server's batches, the memory-bounded model cache."""
import threading
from pathlib import Path

import pytest

from jaxengine.checkpoint.hf import load_hf_model
from jaxengine.sampler import PromptError, Sampler, SamplingParams
from jaxengine.serving import BatchDecoder, BatchingServer, LoadedModel, ModelCache, ServeRequest, load_serving_model
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
    greedy = SamplingParams(max_new_tokens=10, temperature=0.0)
    ticks = iter(range(1000))
    requests = [ServeRequest(prompt_ids=tuple(prompts[0]), params=greedy),
                ServeRequest(prompt_ids=tuple(prompts[1]), params=greedy),
                ServeRequest(prompt_ids=tuple(prompts[2]), params=greedy, deadline=5)]  # clock: 0 at start, +1 a step
    streamed = {row: [] for row in range(3)}
    results = BatchDecoder(model, tokenizer).run(
        requests, on_token=lambda row, token_id, delta: streamed[row].append(token_id),
        should_stop=lambda row: row == 1 and len(streamed[1]) == 3, clock=lambda: next(ticks))
    [alone] = BatchDecoder(model, tokenizer).run(requests[:1])
    assert results[0].token_ids == alone.token_ids and results[0].finish_reason == "length"
    assert results[1].finish_reason == "cancelled" and results[1].token_ids == alone_tokens(model, tokenizer, prompts[1])[:3]
    # the start reads tick 0; steps read ticks 1, 2, 3, 4 (tokens kept) and 5 (past the deadline)
    assert results[2].finish_reason == "timeout" and len(results[2].token_ids) == 4
    assert streamed[1] == results[1].token_ids and streamed[2] == results[2].token_ids


def alone_tokens(model, tokenizer, ids):
    return Sampler(model, tokenizer).generate([ids], SamplingParams(max_new_tokens=10, temperature=0.0))[0].token_ids


def test_it_rejects_a_prompt_longer_than_the_context(served):
    model, tokenizer, _ = served
    too_long = ServeRequest(prompt_ids=(5,) * model.config.max_position_embeddings, params=SamplingParams())
    with pytest.raises(PromptError, match="exceeds the model's context length"):
        BatchingServer(BatchDecoder(model, tokenizer)).submit(too_long)


def test_the_server_decodes_requests_pending_together_in_one_batch(served):
    model, tokenizer, prompts = served
    entered, release = threading.Event(), threading.Event()

    class HeldDecoder(BatchDecoder):
        def run(self, requests, **kwargs):
            entered.set()
            release.wait(timeout=30)  # holds the first batch until the others are queued
            return super().run(requests, **kwargs)

    server = BatchingServer(HeldDecoder(model, tokenizer))
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    streamed = []
    submit = lambda ids: server.submit(ServeRequest(prompt_ids=tuple(ids), params=params),
                                       on_token=lambda token_id, delta: streamed.append(token_id))
    futures = [submit(prompts[0])]
    assert entered.wait(timeout=30)
    futures += [submit(ids) for ids in prompts[1:]]
    release.set()
    results = [future.result(timeout=60) for future in futures]
    server.close()
    assert server.batch_sizes == [1, 3]  # the three that queued while the first ran went together
    for ids, result in zip(prompts, results):
        assert result.token_ids == Sampler(model, tokenizer).generate([ids], params)[0].token_ids
    assert len(streamed) == 4 * 6


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


def test_it_loads_a_quantized_copy_and_a_plain_export(served, tmp_path):
    from jaxengine.quantize import QuantScheme, export_quantized

    model, tokenizer, prompts = served
    source = factories.build_tiny_model_dir(tmp_path / "plain")
    export_quantized(source, tmp_path / "int8", scheme=QuantScheme.named("int8"))
    plain, quantized = load_serving_model(source), load_serving_model(tmp_path / "int8")
    assert quantized.nbytes < 0.7 * plain.nbytes
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    [result] = BatchDecoder(quantized.model, quantized.tokenizer).run(requests_for(prompts[:1], [params]))
    assert len(result.token_ids) == 4


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
