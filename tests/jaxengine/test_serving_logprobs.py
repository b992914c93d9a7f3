"""Serving log probabilities: each generated token's and its top alternatives' log probabilities are the model's
raw distribution (log_softmax of a full forward pass, before sampling settings, penalties and bias), streamed as
they are returned; a request that asks for none gets none, and costs a call nothing. A prompt's tokens' (an echo's,
``BatchDecoder.prompt_logprobs``) are transformers' own, from a program per prompt length bucket."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxengine.checkpoint.hf import load_hf_model
from jaxengine import serving
from jaxengine.sampler import ContextLengthError, PromptError, Sampler, SamplingParams
from jaxengine.serving import LOGPROBS_MAX, BatchDecoder, ContinuousBatch, ServeRequest
from jaxengine.tokenizer import load_tokenizer
from tests import factories


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model_dir = factories.build_tiny_model_dir(tmp_path_factory.mktemp("tiny-logprobs"))
    model, _ = load_hf_model(model_dir)  # float32
    tokenizer = load_tokenizer(model_dir)
    return model, tokenizer, [tokenizer.encode(text) for text in ("Hello world", "numbers 1 2 3", "a")]


def forward_logprobs(model, prompt_ids, answer_ids):
    """[answer, V]: log_softmax of one full forward pass over prompt and answer, at each answer token's position."""
    ids_t = jnp.asarray([*prompt_ids, *answer_ids], jnp.int32)
    logits_1tv, _ = nnx.jit(lambda model, ids_1t: model(ids_1t, jnp.arange(ids_1t.shape[1])[None]))(model, ids_t[None])
    logprobs_tv = jax.nn.log_softmax(logits_1tv[0].astype(jnp.float32), axis=-1)
    return np.asarray(logprobs_tv[len(prompt_ids) - 1:len(ids_t) - 1])


def assert_matches_references(model, tokenizer, request, result, alternatives):
    """The chosen tokens' log probabilities within 2e-5 of the ``Sampler``'s (its own program over the same cached
    decode, raw logits too), and every value within 1e-4 of a full forward pass's log_softmax (the bound the
    Sampler's log probabilities are held to against transformers): the cached decode and the full pass sum in
    other orders, which under the suite's --xla_backend_optimization_level=0 moves this model's log probabilities
    (logits up to +-10) by up to 3.5e-5 (3e-6 at XLA's default level). The serving batch and the Sampler are other
    programs too (a row decoded beside others, or joining a running batch, against one alone: other shapes, other
    summation orders): 2.0e-6 to 7.6e-6 apart on these tests on an Intel Xeon, 1.06e-5 for a row joining a running
    batch (the bound was 1e-5, measured on AMD EPYC machines, and that test failed on the Xeon at every commit)."""
    [generation] = Sampler(model, tokenizer).generate([list(request.prompt_ids)], request.params)
    assert result.token_ids == generation.token_ids
    assert [entry.token_id for entry in result.logprobs] == result.token_ids
    np.testing.assert_allclose([entry.logprob for entry in result.logprobs], generation.logprobs, atol=2e-5, rtol=0)
    reference_tv = forward_logprobs(model, request.prompt_ids, result.token_ids)
    for step, entry in enumerate(result.logprobs):
        assert entry.logprob == pytest.approx(reference_tv[step, entry.token_id], abs=1e-4)
        assert len(entry.top) == alternatives
        expected_ids = np.argsort(-reference_tv[step], kind="stable")[:alternatives]
        assert [token_id for token_id, _ in entry.top] == expected_ids.tolist()
        assert [value for _, value in entry.top] == pytest.approx(reference_tv[step, expected_ids].tolist(), abs=1e-4)
        # The chosen token among the alternatives carries the same value (one log_softmax for both).
        assert all(value == entry.logprob for token_id, value in entry.top if token_id == entry.token_id)


def test_a_greedy_answers_logprobs_are_log_softmax_of_a_full_forward_pass(served):
    model, tokenizer, prompts = served
    request = ServeRequest(prompt_ids=tuple(prompts[0]), logprobs=5,
                           params=SamplingParams(max_new_tokens=20, temperature=0.0))
    [result] = BatchDecoder(model, tokenizer).run([request])
    assert len(result.token_ids) == 20  # the prefill's token and more than two decode calls
    assert_matches_references(model, tokenizer, request, result, 5)
    for entry in result.logprobs:  # greedy: the token taken is the most likely one
        assert entry.top[0] == (entry.token_id, entry.logprob)


def test_logprobs_are_the_raw_distribution_before_temperature_penalties_and_bias(served):
    model, tokenizer, prompts = served
    params = SamplingParams(max_new_tokens=12, temperature=1.7, top_k=20, seed=4, presence_penalty=1.5,
                            frequency_penalty=0.5, logit_bias={5: 10.0, 9: -100.0})
    request = ServeRequest(prompt_ids=tuple(prompts[1]), params=params, logprobs=LOGPROBS_MAX)
    [result] = BatchDecoder(model, tokenizer).run([request])
    assert_matches_references(model, tokenizer, request, result, LOGPROBS_MAX)


def test_rows_of_one_batch_get_their_own_logprobs_streamed_and_in_the_result(served):
    model, tokenizer, prompts = served
    greedy = SamplingParams(max_new_tokens=11, temperature=0.0)
    requests = [ServeRequest(prompt_ids=tuple(prompts[0]), params=greedy, logprobs=0),
                ServeRequest(prompt_ids=tuple(prompts[1]), params=greedy),
                ServeRequest(prompt_ids=tuple(prompts[2]), params=SamplingParams(max_new_tokens=9, temperature=0.8,
                                                                                  seed=3), logprobs=3)]
    streamed = {row: [] for row in range(3)}

    def on_tokens(row, token_ids, delta, logprobs=None):
        streamed[row].append(logprobs)

    decoder = BatchDecoder(model, tokenizer)
    results = decoder.run(requests, on_tokens=on_tokens)
    assert results[1].logprobs is None and set(streamed[1]) == {None}
    for row, alternatives in ((0, 0), (2, 3)):
        assert_matches_references(model, tokenizer, requests[row], results[row], alternatives)
        assert [entry for read in streamed[row] for entry in read] == results[row].logprobs
    # Asking changes no token: the rows decode as they do without.
    plain = decoder.run([ServeRequest(prompt_ids=request.prompt_ids, params=request.params) for request in requests])
    assert [result.token_ids for result in plain] == [result.token_ids for result in results]


def test_a_row_asking_for_logprobs_that_joins_a_running_batch_gets_them_from_its_first_token(served):
    """It joins between the calls of a row that asked for none (its prefill on its own, the cache laid out anew,
    the calls chained on each other after it); the other row decodes as it does alone."""
    model, tokenizer, prompts = served
    greedy = SamplingParams(max_new_tokens=30, temperature=0.0)
    plain = ServeRequest(prompt_ids=tuple(prompts[1]), params=greedy)
    asking = ServeRequest(prompt_ids=tuple(prompts[0]), params=SamplingParams(max_new_tokens=17, temperature=0.0),
                          logprobs=4)
    decoder = BatchDecoder(model, tokenizer)
    batch, results = ContinuousBatch(decoder), {}
    batch.add(plain, on_finish=lambda result: results.update(plain=result))
    batch.step()
    batch.step()
    batch.add(asking, on_finish=lambda result: results.update(asking=result))
    while batch.busy:
        batch.step()
    assert results["plain"].logprobs is None
    assert results["plain"].token_ids == decoder.run([plain])[0].token_ids
    assert_matches_references(model, tokenizer, asking, results["asking"], 4)


def test_logprobs_programs_compile_on_first_use_and_leave_the_others_as_they_were(served):
    """The warm-up compiles no logprobs programs (few conversations ask): a call computes them only where a row
    asked, in programs of their own, so a batch without them runs the programs it ran before."""
    model, tokenizer, prompts = served
    decoder = BatchDecoder(model, tokenizer, min_bucket=4)  # its own shapes: nothing compiled by other tests
    plain = ServeRequest(prompt_ids=tuple(prompts[0]), params=SamplingParams(max_new_tokens=9, temperature=0.0))
    decoder.run([plain])
    without = decoder.compiled.trace_count
    decoder.run([plain])
    assert decoder.compiled.trace_count == without
    asking = ServeRequest(prompt_ids=plain.prompt_ids, params=plain.params, logprobs=2)
    decoder.run([asking])
    assert decoder.compiled.trace_count == without + 2  # its prefill and its decode call
    decoder.run([plain])  # without them again: the programs it ran before, nothing compiled
    assert decoder.compiled.trace_count == without + 2


@pytest.mark.parametrize("logprobs", [-1, LOGPROBS_MAX + 1])
def test_it_rejects_a_number_of_alternatives_out_of_range(logprobs):
    with pytest.raises(ValueError, match=f"ServeRequest.logprobs must be from 0 to {LOGPROBS_MAX}"):
        ServeRequest(prompt_ids=(1,), params=SamplingParams(), logprobs=logprobs)


def transformers_logprobs(model_dir, prompt_ids):
    """[T, V]: transformers' log_softmax over the prompt's logits, each position's distribution of the next token."""
    import torch

    with torch.no_grad():
        return factories.load_hf_reference(model_dir)(torch.tensor([prompt_ids])).logits[0].log_softmax(-1).numpy()


@pytest.mark.parametrize("kind", ["qwen3", "gemma3"])  # gemma3: a sliding layer whose window the prompts pass
@pytest.mark.parametrize("length,chunk", [(2, 256), (23, 256), (100, 16)], ids=["two", "one-chunk", "eight-chunks"])
def test_a_prompts_logprobs_are_transformers_log_softmax_at_each_position(kind, length, chunk, tiny_hf_model_dir,
                                                                          served, monkeypatch):
    """Each prompt token but the first gets its log probability after the tokens before it and its alternatives',
    as transformers' full forward pass gives them, within the bound generated tokens' are held to (1e-4); the
    logits made ``SCORE_CHUNK`` positions at a time change nothing."""
    monkeypatch.setattr(serving, "SCORE_CHUNK", chunk)
    model_dir = tiny_hf_model_dir(kind)
    model, config = load_hf_model(model_dir)
    prompt_ids = np.random.default_rng(length).integers(3, config.vocab_size, size=length).tolist()
    scored = BatchDecoder(model, served[1]).prompt_logprobs(prompt_ids, alternatives=LOGPROBS_MAX)
    reference_tv = transformers_logprobs(model_dir, prompt_ids)
    assert [entry.token_id for entry in scored] == prompt_ids[1:]
    np.testing.assert_allclose([entry.logprob for entry in scored],
                               reference_tv[np.arange(length - 1), prompt_ids[1:]], atol=1e-4, rtol=0)
    for position, entry in enumerate(scored):
        expected_ids = np.argsort(-reference_tv[position], kind="stable")[:LOGPROBS_MAX]
        assert [token_id for token_id, _ in entry.top] == expected_ids.tolist()
        np.testing.assert_allclose([value for _, value in entry.top], reference_tv[position, expected_ids],
                                   atol=1e-4, rtol=0)


def test_a_prompts_logprobs_keep_the_alternatives_asked_for_and_a_lone_token_has_none(served):
    model, tokenizer, prompts = served
    decoder = BatchDecoder(model, tokenizer)
    full = decoder.prompt_logprobs(prompts[1], alternatives=LOGPROBS_MAX)
    for alternatives in (0, 3):
        kept = decoder.prompt_logprobs(prompts[1], alternatives=alternatives)
        assert [(entry.token_id, entry.logprob) for entry in kept] == [(entry.token_id, entry.logprob)
                                                                        for entry in full]
        assert [entry.top for entry in kept] == [entry.top[:alternatives] for entry in full]
    assert decoder.prompt_logprobs(prompts[1][:1], alternatives=2) == []


def test_a_prompt_is_scored_by_one_program_per_length_bucket_beside_the_generation_programs(served):
    """Scoring compiles a program per prompt length bucket, once: prompts of other lengths in a bucket reuse it. A
    request without it runs the programs it ran before, none compiled anew, as before any prompt was scored."""
    model, tokenizer, _ = served
    # Its own buckets, 4 and 8 (the other tests score at 16 and past it): nothing compiled by them.
    decoder = BatchDecoder(model, tokenizer, min_bucket=4)
    plain = ServeRequest(prompt_ids=(5, 6, 7), params=SamplingParams(max_new_tokens=9, temperature=0.0))
    decoder.run([plain])
    before = decoder.compiled.trace_count
    for length in (5, 8, 6):  # bucket 8
        decoder.prompt_logprobs(list(range(3, 3 + length)), alternatives=2)
    assert decoder.compiled.trace_count == before + 1
    decoder.prompt_logprobs([3, 4, 5], alternatives=5)  # bucket 4
    decoder.prompt_logprobs(list(range(3, 10)), alternatives=0)
    assert decoder.compiled.trace_count == before + 2
    decoder.run([plain])
    assert decoder.compiled.trace_count == before + 2


def test_a_prompt_the_model_cannot_take_is_refused_before_it_is_scored(served):
    model, tokenizer, _ = served
    decoder = BatchDecoder(model, tokenizer)
    context = model.config.max_position_embeddings
    with pytest.raises(ContextLengthError, match=rf"the prompt \({context + 1} tokens\) exceeds the model's context "
                                                 rf"length \({context}\); shorten the prompt"):
        decoder.prompt_logprobs([5] * (context + 1), alternatives=1)
    assert len(decoder.prompt_logprobs([5] * context, alternatives=1)) == context - 1  # the whole context: taken
    with pytest.raises(PromptError, match="the prompt is empty"):
        decoder.prompt_logprobs([], alternatives=1)
    with pytest.raises(ValueError, match=f"alternatives must be from 0 to {LOGPROBS_MAX}, got 21"):
        decoder.prompt_logprobs([5, 6], alternatives=LOGPROBS_MAX + 1)
