"""The serve task over a real Redis (in this process): events in order, the answer the sampler gives,
concurrent generations joining one batch, stop mid-answer, timeout, bad requests."""
import gc
import logging
import threading
import time

import numpy as np
import pytest

from jaxengine.data.pipeline import encode_prompt
from jaxengine.sampler import Sampler, SamplingParams
from jaxengine import serving
from jaxengine.programs import PROGRAMS
from jaxengine.serving import load_serving_model
from tests import factories
from tests.live import wait_for
from webapp.chat import channels
from webapp.core.bidi import isolated
from worker.tasks import serve

CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return factories.build_tiny_model_dir(tmp_path_factory.mktemp("tiny-serve-task"))


def request(model_dir, generation_id, **fields):
    return {"id": generation_id, "model_key": "tiny", "model_path": str(model_dir), "project_slug": "alpha",
            "messages": CONVERSATION,
            "max_new_tokens": 12, "temperature": 0.0, **fields}


def test_it_streams_the_answer_the_sampler_gives(redis_db, model_dir):
    done = serve.generate(request(model_dir, "g1"))
    events = channels.stored_events(redis_db, "g1")
    assert [event["seq"] for event in events] == list(range(len(events)))
    types = [event["type"] for event in events]
    # The model's first answer in this process waits for it to load and for its programs to compile, and says so.
    loading = types.count("status")
    # One event for the prefill's token, then one for each decode call's (8 a call; the budget ends the second).
    assert types == ["status"] * loading + ["token"] * 3 + ["done"] and loading <= 2
    assert [event["tokens"] for event in events[loading:-1]] == [1, 8, 3]
    assert "".join(event["text"] for event in events[loading:-1]) == done["text"] == events[-1]["text"]
    loaded = load_serving_model(model_dir)
    [expected] = Sampler(loaded.model, loaded.tokenizer).generate(
        [encode_prompt(loaded.tokenizer, CONVERSATION)], SamplingParams(max_new_tokens=12, temperature=0.0))
    assert done["text"] == expected.text and done["finish_reason"] == "length"
    assert done["prompt_tokens"] == len(expected.prompt_token_ids) and done["completion_tokens"] == 12


def test_penalties_and_logit_bias_reach_the_engine(redis_db, model_dir):
    """They were dropped on the way: an answer asked not to repeat itself, or never to say a token, was the
    unpenalized one. The ids come as JSON's string keys, as the web sends them."""
    fields = {"frequency_penalty": 2.0, "presence_penalty": 0.5, "logit_bias": {"5": 100}}
    done = serve.generate(request(model_dir, "g-penal", **fields))
    loaded = load_serving_model(model_dir)
    [expected] = Sampler(loaded.model, loaded.tokenizer).generate(
        [encode_prompt(loaded.tokenizer, CONVERSATION)],
        SamplingParams(max_new_tokens=12, temperature=0.0, frequency_penalty=2.0, presence_penalty=0.5,
                       logit_bias={5: 100}))
    assert expected.token_ids == [5] * 12
    assert done["text"] == expected.text and done["completion_tokens"] == 12


def test_logprobs_asked_for_are_in_the_token_events_and_the_done_event(redis_db, model_dir):
    """Each token's log probability and its alternatives', named as OpenAI's chat ``logprobs.content`` names them
    (text, UTF-8 bytes, log probability), the sampler's own (the model's raw log probabilities of its tokens)."""
    done = serve.generate(request(model_dir, "g-logprobs", logprobs=3))
    events = channels.stored_events(redis_db, "g-logprobs")
    tokens = [event for event in events if event["type"] == "token"]
    streamed = [entry for event in tokens for entry in event["logprobs"]]
    assert [len(event["logprobs"]) for event in tokens] == [event["tokens"] for event in tokens]
    assert streamed == done["logprobs"] == events[-1]["logprobs"] and len(streamed) == 12
    loaded = load_serving_model(model_dir)
    [expected] = Sampler(loaded.model, loaded.tokenizer).generate(
        [encode_prompt(loaded.tokenizer, CONVERSATION)], SamplingParams(max_new_tokens=12, temperature=0.0))
    for entry, token_id, logprob in zip(streamed, expected.token_ids, expected.logprobs):
        raw = loaded.tokenizer.token_bytes(token_id)
        assert entry["bytes"] == list(raw)
        assert entry["token"].encode() == raw or entry["token"] == "bytes:" + "".join(f"\\x{byte:02x}" for byte in raw)
        assert entry["logprob"] == pytest.approx(logprob, abs=1e-5)
        assert len(entry["top_logprobs"]) == 3 and entry["top_logprobs"][0]["logprob"] == entry["logprob"]
    # Asked for none, an answer's events carry none.
    plain = serve.generate(request(model_dir, "g-plain"))
    assert "logprobs" not in plain
    assert all("logprobs" not in event for event in channels.stored_events(redis_db, "g-plain"))


def test_a_request_asking_for_too_many_alternatives_is_refused(redis_db, model_dir):
    done = serve.generate(request(model_dir, "g-too-many", logprobs=21))
    assert "logprobs" in done["error"] and "less than or equal to 20" in done["error"]


def slow_down_decoding(monkeypatch, seconds_per_call):
    step = serving.ContinuousBatch.step
    monkeypatch.setattr(serving.ContinuousBatch, "step", lambda batch: (time.sleep(seconds_per_call), step(batch)))


def test_tokens_reach_redis_from_the_tasks_thread_not_the_servers(redis_db, model_dir, monkeypatch):
    emitting_threads = set()
    emit = channels.emit
    monkeypatch.setattr(channels, "emit", lambda *args, **kwargs: (
        emitting_threads.add(threading.current_thread().name), emit(*args, **kwargs))[1])
    serve.generate(request(model_dir, "threads"))
    assert emitting_threads == {threading.current_thread().name}  # not "batching-server"


def test_generations_share_the_processs_redis_connections(redis_db, model_dir):
    """A client per generation connected and handshook anew for each (6 % of a busy serve worker's time)."""
    serve.generate(request(model_dir, "first"))
    # The deleted-models watcher, started with the first model, holds its own two connections (subscription and
    # reads), never the generations' pool: once they are open, nothing of this process connects again. (It read
    # from the shared pool before, which connected anew when a generation held the pool's connection: CI failure.)
    deadline = time.monotonic() + 30
    while sum(c["name"] == serve.WATCHER_CLIENT_NAME for c in redis_db.client_list()) < 2:
        assert time.monotonic() < deadline, redis_db.client_list()
        time.sleep(0.05)
    connections = redis_db.info("stats")["total_connections_received"]
    for index in range(3):
        done = serve.generate(request(model_dir, f"next{index}"))
        assert channels.stored_events(redis_db, f"next{index}")[-1]["text"] == done["text"]
    assert redis_db.info("stats")["total_connections_received"] == connections


def test_concurrent_generations_join_one_running_batch(redis_db, model_dir, monkeypatch):
    serve.generate(request(model_dir, "warm"))  # loads the model and its server
    server, _ = serve.server_for("tiny", str(model_dir))
    before = len(server.batch_sizes)
    slow_down_decoding(monkeypatch, 0.05)  # 8 tokens a call: each answer takes ~0.25 s
    results = {}
    threads = [threading.Thread(target=lambda i=i: results.update({i: serve.generate(request(
        model_dir, f"c{i}", seed=i, temperature=0.8, max_new_tokens=40))})) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    # the later three joined the first one's batch while it was decoding
    assert max(server.batch_sizes[before:]) == 4
    loaded = load_serving_model(model_dir)
    for i in range(4):
        [alone] = Sampler(loaded.model, loaded.tokenizer).generate(
            [encode_prompt(loaded.tokenizer, CONVERSATION)], SamplingParams(max_new_tokens=40, temperature=0.8, seed=i))
        assert results[i]["text"] == alone.text == channels.stored_events(redis_db, f"c{i}")[-1]["text"]


def test_n_answers_decode_as_rows_of_the_same_calls_each_with_its_seed(redis_db, model_dir):
    """A request for n answers (a /v1 request's n) is one task whose answers are submitted as one group: the first
    decode call after it decodes all three rows together (the server's count of rows per call), not one answer
    after another; answer i is the one the sampler gives alone with its seed (choice_seed: the request's own for
    the first), and streams as a generation of its own."""
    serve.generate(request(model_dir, "warm-n"))  # loads the model and its server
    server, _ = serve.server_for("tiny", str(model_dir))
    before = len(server.batch_sizes)
    done = serve.generate(request(model_dir, "n3", n=3, seed=11, temperature=0.9, max_new_tokens=20))
    assert server.batch_sizes[before] == 3
    loaded = load_serving_model(model_dir)
    texts = []
    for index, choice in enumerate(done["choices"]):
        [alone] = Sampler(loaded.model, loaded.tokenizer).generate(
            [encode_prompt(loaded.tokenizer, CONVERSATION)],
            SamplingParams(max_new_tokens=20, temperature=0.9, seed=serve.choice_seed(11, index)))
        events = channels.stored_events(redis_db, channels.choice_id("n3", index))
        assert [event["seq"] for event in events] == list(range(len(events)))
        assert events[-1] == {"seq": len(events) - 1, "type": "done", **choice} and choice["choice"] == index
        assert choice["text"] == alone.text == "".join(event["text"] for event in events if event["type"] == "token")
        assert choice["prompt_tokens"] == len(alone.prompt_token_ids)
        texts.append(choice["text"])
    assert len(set(texts)) == 3 and serve.choice_seed(11, 0) == 11
    assert not channels.stored_events(redis_db, "n3")  # nothing under the request's own id: the web follows its answers
    again = serve.generate(request(model_dir, "n3-again", n=3, seed=11, temperature=0.9, max_new_tokens=20))
    assert [choice["text"] for choice in again["choices"]] == texts


def test_each_of_n_answers_carries_its_own_log_probabilities(redis_db, model_dir):
    """n and logprobs together (merged the same day from two branches): the group's callback was called with
    ``logprobs=``, which the n answers' relay did not take, so a request for both failed in the serving loop. Each
    answer's token events and done carry its own tokens' log probabilities, the sampler's alone with its seed."""
    done = serve.generate(request(model_dir, "n-lp", n=2, seed=3, temperature=1.0, max_new_tokens=10, logprobs=2))
    loaded = load_serving_model(model_dir)
    for index, choice in enumerate(done["choices"]):
        [alone] = Sampler(loaded.model, loaded.tokenizer).generate(
            [encode_prompt(loaded.tokenizer, CONVERSATION)],
            SamplingParams(max_new_tokens=10, temperature=1.0, seed=serve.choice_seed(3, index)))
        events = channels.stored_events(redis_db, channels.choice_id("n-lp", index))
        streamed = [entry for event in events if event["type"] == "token" for entry in event["logprobs"]]
        assert choice["text"] == alone.text and streamed == choice["logprobs"] == events[-1]["logprobs"]
        assert [entry["logprob"] for entry in streamed] == pytest.approx(alone.logprobs, abs=1e-5)
        assert all(len(entry["top_logprobs"]) == 2 for entry in streamed)


PROMPT = "Once upon a time, numbers 1 2 3"


def echo_request(model_dir, generation_id, **fields):
    """An echo of ``PROMPT`` as /v1/completions sends it (a raw prompt, greedy)."""
    return {**request(model_dir, generation_id), "messages": None, "prompt": PROMPT, "echo": True, **fields}


def scored_prompt(model_dir, alternatives):
    """``PROMPT``'s tokens and the engine's log probabilities of them (``BatchDecoder.prompt_logprobs``), as a
    prompt event's entries (the first's null), and its tokens."""
    from jaxengine.prompts import with_bos

    loaded = load_serving_model(model_dir)
    ids = with_bos(loaded.tokenizer, loaded.tokenizer.encode(PROMPT))
    scored = serving.BatchDecoder(loaded.model, loaded.tokenizer).prompt_logprobs(ids, alternatives=alternatives)
    return serve.prompt_logprobs_json(loaded.tokenizer, ids, scored), ids


def assert_same_entries(entries, expected):
    """Entries of the same tokens (text, bytes, alternatives in order) whose log probabilities agree within 1e-6."""
    def values(entries):
        return [[entry["logprob"], *(top["logprob"] for top in entry["top_logprobs"] or [])] for entry in entries]

    def names(entries):
        return [(entry["token"], entry["bytes"], [(top["token"], top["bytes"]) for top in entry["top_logprobs"] or []])
                for entry in entries]

    assert names(entries) == names(expected)
    assert values(entries)[0] == values(expected)[0] == [None]
    np.testing.assert_allclose(values(entries)[1:], values(expected)[1:], atol=1e-6, rtol=0)


def test_an_echo_sends_the_prompt_and_its_logprobs_before_the_answers_tokens(redis_db, model_dir):
    """The prompt event comes before the first token, with the prompt's text and its tokens' entries (the first's
    log probability null: nothing predicts it; the others' the engine's, named as the answer's are); the done event
    holds them again (an answer read whole), and the answer is the one asked without echo."""
    done = serve.generate(echo_request(model_dir, "echo", max_new_tokens=5, logprobs=2))
    events = channels.stored_events(redis_db, "echo")
    types = [event["type"] for event in events if event["type"] != "status"]
    assert types[0] == "prompt" and set(types[1:-1]) == {"token"} and types[-1] == "done"
    [prompt] = [event for event in events if event["type"] == "prompt"]
    expected, ids = scored_prompt(model_dir, 2)
    assert prompt["text"] == PROMPT and prompt["tokens"] == len(ids) == done["prompt_tokens"]
    first, *rest = prompt["logprobs"]
    assert first["logprob"] is None and first["top_logprobs"] is None
    assert first["bytes"] == list(load_serving_model(model_dir).tokenizer.token_bytes(ids[0]))
    assert len(rest) == len(ids) - 1 and all(len(entry["top_logprobs"]) == 2 for entry in rest)
    assert_same_entries(prompt["logprobs"], expected)
    assert done["prompt_logprobs"] == prompt["logprobs"] and len(done["logprobs"]) == done["completion_tokens"] == 5
    plain = serve.generate({**echo_request(model_dir, "no-echo", max_new_tokens=5, logprobs=2), "echo": False})
    assert plain["text"] == done["text"] and plain["logprobs"] == done["logprobs"] and "prompt_logprobs" not in plain
    assert "prompt" not in [event["type"] for event in channels.stored_events(redis_db, "no-echo")]


def test_an_echo_without_logprobs_sends_the_prompt_alone(redis_db, model_dir):
    done = serve.generate(echo_request(model_dir, "echo-text", max_new_tokens=3))
    [prompt] = [event for event in channels.stored_events(redis_db, "echo-text") if event["type"] == "prompt"]
    assert prompt == {"seq": prompt["seq"], "type": "prompt", "text": PROMPT, "tokens": done["prompt_tokens"]}
    assert "prompt_logprobs" not in done and "logprobs" not in done and done["completion_tokens"] == 3


@pytest.mark.parametrize("n", [1, 2])
def test_an_echo_of_no_new_tokens_scores_the_prompt_and_generates_nothing(redis_db, model_dir, n):
    """max_new_tokens 0 (an echo's max_tokens 0, how text is scored): the prompt event, then a done of no tokens
    ended by its length, for each of n answers (the prompt scored once for all of them)."""
    done = serve.generate(echo_request(model_dir, f"score-{n}", max_new_tokens=0, logprobs=1, n=n))
    expected, ids = scored_prompt(model_dir, 1)
    answers = [done] if n == 1 else done["choices"]
    generation_ids = [f"score-{n}"] if n == 1 else [channels.choice_id(f"score-{n}", index) for index in range(n)]
    assert len(answers) == n
    for index, (answer, generation_id) in enumerate(zip(answers, generation_ids)):
        events = [event for event in channels.stored_events(redis_db, generation_id) if event["type"] != "status"]
        assert [event["type"] for event in events] == ["prompt", "done"]
        assert {key: answer[key] for key in ("text", "finish_reason", "prompt_tokens", "completion_tokens", "logprobs")
                } == {"text": "", "finish_reason": "length", "prompt_tokens": len(ids), "completion_tokens": 0,
                      "logprobs": []}
        assert answer["prompt_logprobs"] == events[0]["logprobs"]
        assert_same_entries(answer["prompt_logprobs"], expected)
        assert answer.get("choice") == (None if n == 1 else index)


def test_a_prompt_of_token_ids_is_those_tokens_exactly_echoed_as_their_text(redis_db, model_dir):
    """/v1/completions' prompt as token ids (lm-evaluation-harness's default) was refused. The ids are the prompt's
    tokens as they are, never detokenized and tokenized again: the text's own ids answer, scored and echoed, as the
    text does; the echo's text is the ids' text, special tokens included, as their entries name them."""
    from jaxengine.prompts import with_bos

    tokenizer = load_serving_model(model_dir).tokenizer
    ids = with_bos(tokenizer, tokenizer.encode(PROMPT))
    as_text = serve.generate(echo_request(model_dir, "ids-text", max_new_tokens=5, logprobs=2))
    as_ids = serve.generate(echo_request(model_dir, "ids", prompt=None, prompt_token_ids=ids, max_new_tokens=5,
                                         logprobs=2))
    [prompt] = [event for event in channels.stored_events(redis_db, "ids") if event["type"] == "prompt"]
    assert prompt["text"] == as_ids["prompt_text"] == as_text["prompt_text"] == PROMPT
    assert {key: value for key, value in as_ids.items() if key != "first_token_seconds"} == {
        key: value for key, value in as_text.items() if key != "first_token_seconds"}
    assert as_ids["prompt_tokens"] == len(ids) == len(as_ids["prompt_logprobs"])
    # A special token (this tokenizer's first) is a prompt token as any other: in the text, and one token.
    special = min(tokenizer.special_ids)
    marked = serve.generate(echo_request(model_dir, "ids-special", prompt=None, prompt_token_ids=[special, *ids],
                                         max_new_tokens=0, logprobs=0))
    special_text = tokenizer.decode([special], skip_special_tokens=False)
    assert special_text and marked["prompt_text"] == special_text + PROMPT
    assert marked["prompt_tokens"] == len(ids) + 1
    assert "".join(entry["token"] for entry in marked["prompt_logprobs"]) == marked["prompt_text"]


@pytest.mark.parametrize("echo", [False, True])
def test_a_token_id_past_the_models_vocabulary_is_refused_naming_its_index_and_the_range(redis_db, model_dir, echo):
    vocab_size = load_serving_model(model_dir).model.config.vocab_size
    refused = serve.generate({**request(model_dir, f"ids-past-{echo}"), "messages": None, "echo": echo,
                              "prompt_token_ids": [5, 6, vocab_size, 7], "logprobs": 1})
    assert refused["error"] == (f"prompt: the token id at index 2, {vocab_size}, is outside the model's vocabulary; "
                                f"give token ids from 0 to {vocab_size - 1} (its vocab_size is {vocab_size})")
    assert channels.stored_events(redis_db, f"ids-past-{echo}")[-1]["type"] == "error"


def test_no_new_tokens_without_echo_is_refused(redis_db, model_dir):
    refused = serve.generate({**request(model_dir, "nothing"), "max_new_tokens": 0})
    assert "max_new_tokens: 0 generates nothing; send it only with echo" in refused["error"]
    over = serve.generate(echo_request(model_dir, "echo-over", prompt="words " * 400, max_new_tokens=0, logprobs=1))
    assert "exceeds the model's context length (256); shorten the prompt" in over["error"]
    assert channels.stored_events(redis_db, "echo-over")[-1]["code"] == "context_length_exceeded"


@pytest.mark.parametrize("fields", [
    {"presence_penalty": 1.5, "frequency_penalty": 1.5},
    {"logit_bias": {"7": 4.0, "9": -100.0}},
    {"stop": ["e", "o "]},
], ids=["penalties", "logit_bias", "stop"])
def test_each_of_n_answers_is_sampled_with_the_requests_fields_as_alone(redis_db, model_dir, fields):
    """QA of issue 4: every row of a group, not just its first, gets the request's penalties (counted over its own
    tokens), logit_bias and stop sequences: answer i is the sampler's alone with choice_seed(seed, i) and them."""
    done = serve.generate(request(model_dir, "nf", n=3, seed=5, temperature=1.0, max_new_tokens=16, **fields))
    loaded = load_serving_model(model_dir)
    params = {"presence_penalty": fields.get("presence_penalty", 0.0),
              "frequency_penalty": fields.get("frequency_penalty", 0.0),
              "logit_bias": {int(token): bias for token, bias in fields.get("logit_bias", {}).items()},
              "stop_strings": tuple(fields.get("stop", ()))}
    for index, choice in enumerate(done["choices"]):
        [alone] = Sampler(loaded.model, loaded.tokenizer).generate(
            [encode_prompt(loaded.tokenizer, CONVERSATION)],
            SamplingParams(max_new_tokens=16, temperature=1.0, seed=serve.choice_seed(5, index), **params))
        assert (choice["text"], choice["finish_reason"]) == (alone.text, alone.finish_reason), index
    if "stop" in fields:  # the stop sequences were met, and cut each answer before them
        assert any(choice["finish_reason"] == "stop" for choice in done["choices"])
        assert not any(stop in choice["text"] for stop in fields["stop"] for choice in done["choices"])


def test_a_stop_of_a_request_for_n_answers_ends_them_all_and_its_error_reaches_each(redis_db, model_dir, monkeypatch):
    monkeypatch.setattr(serve, "STOP_POLL_SECONDS", 0.0)
    slow_down_decoding(monkeypatch, 0.1)

    def stop_the_second_answer_after_its_first_tokens():
        while len(channels.stored_events(redis_db, "sn-1")) < 3:
            time.sleep(0.01)
        channels.request_stop(redis_db, "sn-1")

    stopper = threading.Thread(target=stop_the_second_answer_after_its_first_tokens)
    stopper.start()
    done = serve.generate(request(model_dir, "sn", n=2, temperature=0.8, max_new_tokens=200))
    stopper.join(timeout=10)
    assert [choice["finish_reason"] for choice in done["choices"]] == ["cancelled", "cancelled"]
    assert all(choice["completion_tokens"] < 100 for choice in done["choices"])
    refused = serve.generate(request(model_dir, "over-n", n=2, max_new_tokens=4000))
    for index in range(2):
        last = channels.stored_events(redis_db, channels.choice_id("over-n", index))[-1]
        assert (last["type"], last["message"], last["code"]) == ("error", refused["error"], "context_length_exceeded")


def test_stop_ends_the_answer_mid_way(redis_db, model_dir, monkeypatch):
    monkeypatch.setattr(serve, "STOP_POLL_SECONDS", 0.0)
    slow_down_decoding(monkeypatch, 0.1)  # ~80 tokens a second

    def stop_after_three_tokens():
        while len(channels.stored_events(redis_db, "s1")) < 3:
            time.sleep(0.01)
        channels.request_stop(redis_db, "s1")

    stopper = threading.Thread(target=stop_after_three_tokens)
    stopper.start()
    done = serve.generate(request(model_dir, "s1", max_new_tokens=200))
    stopper.join(timeout=10)
    assert done["finish_reason"] == "cancelled"
    assert 3 <= done["completion_tokens"] < 50
    assert channels.stored_events(redis_db, "s1")[-1]["type"] == "done"


def test_a_generation_past_its_timeout_ends_as_timeout(redis_db, model_dir):
    done = serve.generate(request(model_dir, "t1", timeout_seconds=1e-6))
    # The time limit counts from the first decode call's dispatch: the prefill's token is in.
    assert done["finish_reason"] == "timeout" and done["completion_tokens"] == 1


@pytest.mark.parametrize("fields,message", [
    ({"temperature": -1}, "temperature"),
    ({"messages": None}, "exactly one of messages"),
    ({"prompt_token_ids": [1, 2]}, "exactly one of messages"),
    ({"messages": None, "prompt_token_ids": []}, "prompt_token_ids\n  List should have at least 1 item"),
    ({"messages": None, "prompt_token_ids": [1, -2]}, "Input should be greater than or equal to 0"),
    ({"model_path": "/nonexistent/model"}, "config.json"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"logit_bias": {"99999": 1}}, "logit_bias: token id 99999 is outside the model's vocabulary"),
    ({"n": 9}, "Input should be less than or equal to 8"),
])
def test_it_reports_a_bad_request_as_an_error_event(redis_db, model_dir, fields, message):
    result = serve.generate({**request(model_dir, "bad"), "model_key": str(fields), **fields})
    assert message in result["error"]
    events = channels.stored_events(redis_db, "bad")
    # A request that parses says it loads its model first (here a model that is not there, or one whose
    # vocabulary has no such token).
    parses = "model_path" in fields or "logit_bias" in fields
    assert [event["type"] for event in events] == (["status", "error"] if parses else ["error"])
    assert message in events[-1]["message"]


def test_prepare_loads_the_model_and_a_first_answer_then_compiles_nothing(redis_db, tmp_path, settings):
    # The worker's own warm-up compiles every prompt bucket and cache size up to the model's context: a context
    # of 64 tokens holds the conversation and its answer, with a part of the programs of the tiny model's 256.
    model_dir = factories.build_tiny_model_dir(tmp_path / "short-context", context=64)
    settings.TEMPER_SERVE_WARMUP = True
    assert serve.prepare("tiny-prepared", str(model_dir), "alpha") == {"loaded": "tiny-prepared"}
    server = serve._servers["tiny-prepared"]
    assert server.decoder.model.config.max_position_embeddings == 64
    assert server.warmed.wait(timeout=300)
    compiled = server.decoder.compiled.trace_count
    done = serve.generate(request(model_dir, "after-prepare", model_key="tiny-prepared", temperature=0.7, seed=3))
    assert done["completion_tokens"] > 0 and "error" not in done
    assert server.decoder.compiled.trace_count == compiled
    # An echo scoring its prompt (lm-evaluation-harness's loglikelihood) compiled its bucket's program on the request.
    scored = serve.generate(echo_request(model_dir, "scored-after-prepare", model_key="tiny-prepared", max_new_tokens=0,
                                         logprobs=1))
    assert len(scored["prompt_logprobs"]) == scored["prompt_tokens"] > 1
    assert server.decoder.compiled.trace_count == compiled


def test_a_model_that_cannot_load_is_not_prepared_and_nothing_raises(redis_db, tmp_path, settings):
    settings.TEMPER_SERVE_WARMUP = True
    outcome = serve.prepare("missing", str(tmp_path / "no-such-model"), "alpha")
    assert "no-such-model" in outcome["error"] and "missing" not in serve._servers


def test_a_succeeded_runs_serving_copy_is_written_with_its_figures(db, model_dir, tmp_path, settings):
    import json
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(model_dir, run_dir / "export")
    rows = [{"prompt": "Hello there", "completion": " general"}, {"prompt": "a b c", "completion": " d e"}]
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (run_dir / "spec.yaml").write_text(
        f"task: sft\nmodel: {model_dir}\noutput_dir: {run_dir}\n"
        f"data: {{train: {tmp_path / 'eval.jsonl'}, eval: {tmp_path / 'eval.jsonl'}}}\ntrain: {{max_steps: 1}}\n")
    settings.TEMPER_SERVE_QUANTIZE = "int4"
    description = serve.quantize_run(str(run_dir))
    assert description["scheme"] == "int4" and description["eval_sequences"] == 2 and description["eval_prompts"] == 2
    assert 0 <= description["greedy_agreement"] <= 1 and description["ratio_to_bfloat16"] < 0.6
    written = json.loads((run_dir / "export" / "quantized" / "quantization.json").read_text())
    assert written["perplexity_quantized"] == description["perplexity_quantized"]
    assert not (run_dir / "serving-copy-error.txt").exists()
    # A copy that fails says why in the run directory (the run page shows it); one written later clears it.
    missing = tmp_path / "missing"
    missing.mkdir()
    failure = serve.quantize_run(str(missing))
    assert "error" in failure and (missing / "serving-copy-error.txt").read_text() == failure["error"]
    assert "spec.yaml" in failure["error"]
    (run_dir / "serving-copy-error.txt").write_text("an earlier failure")
    serve.quantize_run(str(run_dir))
    assert not (run_dir / "serving-copy-error.txt").exists()
    # Acknowledged when done, so the message of a worker lost while writing is handed to another, which
    # writes the copy again over the one a previous delivery may have finished: nothing is left aside.
    assert serve.quantize_run.acks_late
    exported = sorted(path.name for path in (run_dir / "export").iterdir())
    again = serve.quantize_run(str(run_dir))
    assert again["perplexity_quantized"] == description["perplexity_quantized"]
    assert sorted(path.name for path in (run_dir / "export").iterdir()) == exported


def test_a_small_models_rows_are_split_over_the_cores_and_a_large_ones_are_not(redis_db, model_dir, monkeypatch):
    import os

    import jax

    cores = min(len(os.sched_getaffinity(0)), len(jax.devices()))  # this process: the tests' 8 host devices
    serve.generate(request(model_dir, "split"))
    small, _ = serve.server_for("tiny", str(model_dir))
    assert small.decoder.devices == tuple(jax.devices()[:cores])
    monkeypatch.setattr(serving, "SPLIT_MAX_WEIGHT_BYTES", small.decoder.leaves[0].nbytes)  # now "too large"
    large, _ = serve.server_for("tiny-as-large", str(model_dir))
    assert large.decoder.devices == tuple(jax.devices()[:1])
    done = serve.generate(request(model_dir, "unsplit", model_key="tiny-as-large"))
    assert done["completion_tokens"] == 12 and "error" not in done


def test_a_model_written_again_at_its_path_is_served_as_written_now(redis_db, model_dir, tmp_path):
    # A resumed run exports again (and its serving copy is made again) at the same path, under the same
    # key: its chats went on being answered by the weights the worker had loaded before.
    import shutil

    from jaxengine.checkpoint.hf import replace_directory

    def export(attempt: int) -> str:
        staging = tmp_path / f".export.writing-{attempt}"
        shutil.copytree(model_dir, staging)
        replace_directory(staging, tmp_path / "export")
        return str(tmp_path / "export")

    before, _ = serve.server_for("run_resumed", export(1))
    after, _ = serve.server_for("run_resumed", export(2))
    assert after is not before and after.decoder.model is not before.decoder.model
    assert serve.server_for("run_resumed", str(tmp_path / "export"))[0] is after
    done = serve.generate(request(tmp_path / "export", "resumed", model_key="run_resumed"))
    assert done["completion_tokens"] == 12 and "error" not in done


# A worker process as Celery starts it with ``-Q <queues>`` (the app module, then celeryd_init), then a
# serving copy's first JAX work; prints the host devices JAX has.
WORKER_START = (
    "import sys, worker.celery; from celery.signals import celeryd_init;"
    "celeryd_init.send(sender='w@host', instance=None, conf=None, options={'queues': sys.argv[1]});"
    "import jax, jax.numpy as jnp; jnp.ones(3).block_until_ready(); print(len(jax.devices()))"
)


@pytest.mark.parametrize("queues, devices", [("serve", "3"), ("default,serve", "3"), ("train", "1")])
def test_a_serve_worker_asks_for_its_devices_as_it_starts(tmp_path, queues, devices):
    import os
    import subprocess
    import sys
    from pathlib import Path

    environ = {key: value for key, value in os.environ.items() if key != "XLA_FLAGS"}
    environ.update(DJANGO_SETTINGS_MODULE="webapp.settings", TEMPER_DATA=str(tmp_path / "data"), TEMPER_JAX_CACHE="",
                   TEMPER_SERVE_CPU_DEVICES="3", JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, "-c", WORKER_START, queues], cwd=Path(__file__).resolve().parents[2],
                            env=environ, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == devices


def test_a_chat_too_long_for_the_context_leaves_out_its_oldest_turns(model_dir):
    """The chat panel took Max tokens 2000 for a 2048-token model: each later turn failed ('the prompt plus
    max_new_tokens exceeds the model's context length') and the conversation could not go on."""
    tokenizer = load_serving_model(model_dir).tokenizer
    long_turns = [{"role": role, "content": f"turn {number} " + "many words here " * 12}
                  for number in range(6) for role in ("user", "assistant")]
    messages = [CONVERSATION[0], *long_turns, {"role": "user", "content": "And now?"}]
    fitted = serve.GenerateRequest.model_validate(request(model_dir, "f", messages=messages, max_new_tokens=100,
                                                         fit_context=True))
    ids, max_new_tokens = serve.fit_to_context(fitted, tokenizer, 256)
    assert len(serve.prompt_ids(fitted, tokenizer)) + 100 > 256  # it did not fit as it was
    # The system prompt, then the newest turns that fit, starting with a user turn.
    for start in range(1, len(messages)):
        if messages[start]["role"] != "user":
            continue
        candidate = tuple(encode_prompt(tokenizer, [messages[0], *messages[start:]]))
        if len(candidate) + 100 <= 256:
            break
    assert ids == candidate and max_new_tokens == 100 and start > 1  # turns were left out
    # The last message alone leaves less room than asked: the answer gets what is left.
    short = serve.GenerateRequest.model_validate(request(model_dir, "s", max_new_tokens=8000, fit_context=True))
    ids, max_new_tokens = serve.fit_to_context(short, tokenizer, 256)
    assert ids == serve.prompt_ids(short, tokenizer) and max_new_tokens == 256 - len(ids)
    huge = serve.GenerateRequest.model_validate(request(
        model_dir, "h", messages=[{"role": "user", "content": "words " * 400}], fit_context=True))
    with pytest.raises(ValueError, match=r"fills the model's context \(256 tokens\) on its own; send a shorter one"):
        serve.fit_to_context(huge, tokenizer, 256)
    # Without fit_context (the API) nothing is changed: the server refuses what does not fit.
    strict = serve.GenerateRequest.model_validate(request(model_dir, "x", messages=messages, max_new_tokens=100))
    assert serve.fit_to_context(strict, tokenizer, 256) == (serve.prompt_ids(strict, tokenizer), 100)


def test_a_system_prompt_that_fills_the_context_is_named_as_the_cause(model_dir):
    """QA: a conversation whose system prompt alone filled the context refused every turn, even "hi", with "the
    message (7017 tokens with the chat template and system prompt) fills the model's context ...; send a shorter
    one": no shorter message could fit, and the page's system prompt is fixed for the conversation."""
    tokenizer = load_serving_model(model_dir).tokenizer
    long_system = serve.GenerateRequest.model_validate(request(
        model_dir, "sys", messages=[{"role": "system", "content": "words " * 400}, {"role": "user", "content": "hi"}],
        max_new_tokens=50, fit_context=True))
    with pytest.raises(ValueError, match=r"^the system prompt \(\d+ tokens with the chat template\) fills the model's "
                                         r"context \(256 tokens\) on its own; start a new conversation with a shorter "
                                         r"system prompt$"):
        serve.fit_to_context(long_system, tokenizer, 256)
    # A short system prompt leaves the refusal to the message, as before.
    long_message = serve.GenerateRequest.model_validate(request(
        model_dir, "msg", messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "words " * 400}],
        max_new_tokens=50, fit_context=True))
    with pytest.raises(ValueError, match=r"fills the model's context \(256 tokens\) on its own; send a shorter one$"):
        serve.fit_to_context(long_message, tokenizer, 256)


def test_a_request_over_the_context_fails_with_its_code_unless_fitted(redis_db, model_dir):
    refused = serve.generate(request(model_dir, "over", max_new_tokens=4000))
    assert "exceeds the model's context length (256)" in refused["error"]
    last = channels.stored_events(redis_db, "over")[-1]
    assert (last["type"], last["message"], last["code"]) == ("error", refused["error"], "context_length_exceeded")
    done = serve.generate(request(model_dir, "fitted", max_new_tokens=4000, fit_context=True, timeout_seconds=60))
    assert "error" not in done and done["prompt_tokens"] + done["completion_tokens"] <= 256


def test_a_request_that_does_not_say_how_many_tokens_gets_what_the_context_leaves(redis_db, model_dir):
    """QA: an API request without max_tokens asked for 256 new tokens, so every prompt to a model whose context is
    256 tokens (the demo model's) was refused with context_length_exceeded; OpenAI's and vLLM's servers fill
    what the context leaves instead."""
    tokenizer = load_serving_model(model_dir).tokenizer
    unsaid = {key: value for key, value in request(model_dir, "open").items() if key != "max_new_tokens"}
    ids, max_new_tokens = serve.fit_to_context(serve.GenerateRequest.model_validate(unsaid), tokenizer, 256)
    assert max_new_tokens == 256 - len(ids) < serve.DEFAULT_MAX_NEW_TOKENS
    assert serve.fit_to_context(serve.GenerateRequest.model_validate(unsaid), tokenizer, 4096)[1] == 256
    done = serve.generate({**unsaid, "timeout_seconds": 60})
    assert "error" not in done and done["prompt_tokens"] + done["completion_tokens"] <= 256
    huge = {**unsaid, "id": "open-huge", "messages": [{"role": "user", "content": "words " * 400}]}
    assert "fills the model's context (256 tokens) on its own" in serve.generate(huge)["error"]


def test_a_serving_copy_asked_for_is_written_measured_and_then_served(db, model_dir, tmp_path, settings):
    from tests.webapp.factories import make_base_model, make_ready_version, make_team
    from webapp.chat.selectors import model_choice
    from webapp.runs.models import ServingCopy, ServingCopyStatus

    settings.DATA_ROOT = tmp_path
    team = make_team()
    base_model = make_base_model(team.project, name="tiny", path=str(model_dir))
    pairs = make_ready_version(team.project, name="pairs", kind="preference", rows=[
        {"prompt": "Hello there", "chosen": " general", "rejected": " no"},
        {"prompt": "a b c", "chosen": " d e", "rejected": " z"}])
    copy = ServingCopy.objects.create(project=team.project, base_model=base_model, eval_version=pairs)
    description = serve.make_serving_copy(copy.pk)
    copy.refresh_from_db()
    assert copy.status == ServingCopyStatus.READY and copy.error_message == ""
    assert description["scheme"] == "int8" and description["eval_sequences"] == 2 and description["eval_prompts"] == 2
    assert 0.5 < description["ratio_to_bfloat16"] < 0.7 and description["greedy_agreement"] >= 0.5
    served = model_choice(project=team.project, ref=base_model.public_id)
    assert served.path == str(tmp_path / "serving-copies" / base_model.public_id) and served.quantization == "int8"
    assert str(model_dir) not in served.path  # written outside the registered model's own directory
    done = serve.generate({"id": "from-copy", "model_key": served.cache_key, "model_path": served.path,
                           "project_slug": team.project.slug, "prompt": "Hello", "max_new_tokens": 4, "temperature": 0.0})
    assert done["completion_tokens"] == 4 and "error" not in done
    assert serve.make_serving_copy(copy.pk) == {"dropped": copy.pk}  # a message delivered twice writes nothing


def test_a_serving_copy_measured_on_a_version_with_a_bad_row_fails_with_the_web_apps_words(db, model_dir, tmp_path,
                                                                                             settings):
    """quantize_model_dir read the version chosen to measure on with a job spec's words: a row under another column
    name was told to set "data.columns in the job spec", which the web app's serving copy form has none of."""
    from tests.webapp.factories import make_base_model, make_ready_version, make_team
    from webapp.runs.models import ServingCopy, ServingCopyStatus

    settings.DATA_ROOT = tmp_path
    team = make_team()
    base_model = make_base_model(team.project, name="tiny", path=str(model_dir))
    chats = make_ready_version(team.project, name="chats", rows=[
        {"prompt": "Hello there", "completion": " general"}, {"prompt": "a b c", "reply": " d e"}])
    copy = ServingCopy.objects.create(project=team.project, base_model=base_model, eval_version=chats)
    outcome = serve.make_serving_copy(copy.pk)
    copy.refresh_from_db()
    assert copy.status == ServingCopyStatus.FAILED and outcome["error"] == copy.error_message
    # The version by its name, as a run's error names it (reporting.in_project_terms): its path under the data root
    # was named, which nobody chose and a user of the web cannot open.
    assert copy.error_message.startswith("DataError: chats v1: line 2, row 2, field 'completion': missing 'completion'")
    assert str(chats.absolute_path) not in copy.error_message
    assert copy.error_message.endswith("(map a differently named column to it: the Column mapping of a new version "
                                       "of the dataset, uploaded again)"), copy.error_message
    assert "data.columns" not in copy.error_message
    assert not (tmp_path / "serving-copies").exists() or not any((tmp_path / "serving-copies").rglob("quantization.json"))


def test_a_runs_serving_copy_on_an_eval_version_with_a_bad_row_fails_with_the_launchs_words(db, model_dir, tmp_path,
                                                                                            settings, monkeypatch):
    """quantize_run_export read a web run's data.eval with a job spec's words: a row under another column name was
    told to set "data.columns in the job spec" (a run launched in the web app has no spec file to edit), and the
    version's file was named by its path under the data root. Its serving copy made again, the automatic copy written
    as the run succeeded and a pipeline's export stage all read it so; each now says what the launch's check says."""
    import shutil

    from jaxengine.spec import dump_spec, parse_spec
    from tests.webapp.factories import make_base_model, make_ready_version, make_team
    from webapp.runs import pipelines, reporting, serving_copies
    from webapp.runs.models import PipelineStatus, Run, RunStatus, ServingCopy, ServingCopyStatus
    from worker.tasks import train

    monkeypatch.setattr("webapp.celery.app.send_task", lambda *args, **kwargs: None)
    settings.DATA_ROOT = tmp_path
    team = make_team()
    base_model = make_base_model(team.project, name="tiny", path=str(model_dir))
    chats = make_ready_version(team.project, name="chats", rows=[{"prompt": "Hello there", "completion": " general"}])
    held_out = make_ready_version(team.project, name="held-out", rows=[
        {"prompt": "Hello there", "completion": " general"}, {"prompt": "a b c", "reply": " d e"}])
    spec = {"task": "sft", "model": base_model.public_id,
            "data": {"train": chats.public_id, "eval": held_out.public_id, "max_seq_len": 64},
            "train": {"max_steps": 1}}
    document = {"name": "to-serve", "stages": [{"name": "sft", "spec": spec},
                                                {"name": "serve", "export": {"quantize": "int8"}}]}
    pipeline = pipelines.pipeline_create(project=team.project, document=document, user=team.owner)
    run = pipeline.runs.get()
    run.output_dir.mkdir(parents=True)
    (run.output_dir / "spec.yaml").write_text(dump_spec(parse_spec(run.resolved_spec)))
    shutil.copytree(model_dir, run.output_dir / "export")
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    run = reporting.run_finish(run=Run.objects.get(pk=run.pk), summary={
        "status": "succeeded", "step": 1, "export": {"model": str(run.output_dir / "export")}})
    expected_start = "DataError: held-out v1: line 2, row 2, field 'completion': missing 'completion'"
    expected_end = "(map a differently named column to it: the Column mapping of a new version of the dataset, uploaded again)"

    def in_the_launchs_words(message: str) -> None:
        assert expected_start in message and expected_end in message, message
        assert "data.columns" not in message and str(held_out.absolute_path) not in message, message

    copy = ServingCopy.objects.create(project=team.project, run=run)
    outcome = serve.make_serving_copy(copy.pk)
    copy.refresh_from_db()
    assert copy.status == ServingCopyStatus.FAILED and outcome["error"] == copy.error_message
    in_the_launchs_words(copy.error_message)
    copy.delete()
    settings.TEMPER_SERVE_QUANTIZE = "int8"
    serve.quantize_run(str(run.output_dir))
    card = serving_copies.final_serving_copy(run=run, automatic_scheme="int8")
    assert card["state"] == "failed"
    in_the_launchs_words(card["message"])
    pipelines.pipeline_advance(run=run)
    train.export_stage(pipeline.pk, 1)
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.FAILED
    in_the_launchs_words(pipeline.message)


def test_a_serving_copy_that_fails_records_why_and_the_model_serves_unquantized(db, tmp_path, settings):
    from tests.webapp.factories import make_base_model, make_team
    from webapp.chat.selectors import model_choice
    from webapp.runs.models import ServingCopy, ServingCopyStatus

    settings.DATA_ROOT = tmp_path
    team = make_team()
    base_model = make_base_model(team.project, name="gone", path=str(tmp_path / "no-such-model"))
    copy = ServingCopy.objects.create(project=team.project, base_model=base_model)
    outcome = serve.make_serving_copy(copy.pk)
    copy.refresh_from_db()
    # QA: it said only "TokenizerError: …/no-such-model: no such directory".
    assert copy.status == ServingCopyStatus.FAILED and copy.error_message == (
        f"the files of base model {isolated('gone')} are missing: {tmp_path / 'no-such-model'} is not there any more "
        "(moved or deleted outside Temper); put the model back at that path, or unregister it and register the "
        "model where it is now")
    assert outcome["error"] == copy.error_message
    served = model_choice(project=team.project, ref=base_model.public_id)
    assert served.path == base_model.path and served.quantization == ""
    assert not (tmp_path / "serving-copies").exists() or not any((tmp_path / "serving-copies").rglob("quantization.json"))


def test_a_deletion_wakes_the_watching_thread_at_once(redis_db, model_dir):
    """The watching thread read the deleted models every DELETED_POLL_SECONDS only: a deleted model's weights
    stayed up to 5 s. It now listens on the deletions' channel too, so models_deleted reaches it at once (the
    poll remains for what a lost connection missed)."""
    serve.server_for(f"run_soon_gone@{model_dir}", str(model_dir))
    assert serve._watcher is not None and serve._watcher.is_alive()
    for _attempt in range(1000):  # the thread subscribes once it runs
        if redis_db.pubsub_numsub(channels.DELETED_MODELS_CHANNEL)[0][1]:
            break
        time.sleep(0.01)
    assert redis_db.pubsub_numsub(channels.DELETED_MODELS_CHANNEL)[0][1] == 1
    assert channels.models_deleted(redis_db, ["run_soon_gone"]) == 1  # serve workers told at once
    while any(serve.model_ref(key) == "run_soon_gone" for key in serve._cache.keys):
        time.sleep(0.01)
    assert f"run_soon_gone@{model_dir}" not in serve._servers


def test_a_deleted_models_weights_and_server_are_dropped_and_its_answer_ends_saying_so(redis_db, model_dir,
                                                                                       monkeypatch):
    """A run deleted (or a base model unregistered, or their project) while a serve worker had its model loaded:
    the weights stayed in memory until evicted, and an answer decoding on them went on. Once the web names the
    model deleted, the worker drops its weights and server (a thread looks every DELETED_POLL_SECONDS), and the
    answer ends with an error that says why; other models stay."""
    kept_key, gone_key = f"bm_kept@{model_dir}", f"run_gone:step-10@{model_dir}#int8"
    kept, _ = serve.server_for(kept_key, str(model_dir))
    gone, _ = serve.server_for(gone_key, str(model_dir))
    assert serve._watcher is not None and serve._watcher.is_alive()
    slow_down_decoding(monkeypatch, 0.1)  # ~80 tokens a second
    outcome = {}
    answering = threading.Thread(target=lambda: outcome.update(serve.generate(
        request(model_dir, "deleted", model_key=gone_key, max_new_tokens=200))))
    answering.start()
    while len(channels.stored_events(redis_db, "deleted")) < 2 and answering.is_alive():  # until it decodes
        time.sleep(0.01)
    assert answering.is_alive(), outcome
    channels.models_deleted(redis_db, ["run_gone"])
    serve.drop_deleted_models()  # what the watching thread does within DELETED_POLL_SECONDS
    answering.join(timeout=60)
    assert outcome == {"error": serve.MODEL_DELETED}
    last = channels.stored_events(redis_db, "deleted")[-1]
    assert last["type"] == "error" and last["message"] == serve.MODEL_DELETED
    assert gone_key not in serve._cache.keys and gone_key not in serve._servers
    gone._thread.join(timeout=10)
    assert not gone._thread.is_alive()
    assert kept_key in serve._cache.keys and serve.server_for(kept_key, str(model_dir))[0] is kept
    # The same model under two keys: the programs they share stay with the one still served.
    assert kept.decoder.compiled is gone.decoder.compiled and kept.decoder.compiled in held_programs()


def test_the_deleted_models_watcher_logs_a_redis_outage_once_and_its_end(redis_server, settings, monkeypatch, caplog):
    """The watcher logged a warning every DELETED_POLL_SECONDS for as long as Redis was away (17,000 a day)."""
    import redis as redis_library

    monkeypatch.setattr(serve, "DELETED_POLL_SECONDS", 0.01)
    turns = []  # the watcher subscribes anew on each turn after a failed one
    subscribe = redis_library.Redis.pubsub
    monkeypatch.setattr(redis_library.Redis, "pubsub", lambda self, **kw: turns.append(1) or subscribe(self, **kw))
    down = redis_library.Redis.from_url(redis_server.url)  # a port nothing listens on, once its server is known
    settings.REDIS_URL = f"redis://127.0.0.1:{down.connection_pool.connection_kwargs['port'] + 1}/0"
    caplog.set_level(logging.INFO, logger="worker.tasks.serve")
    stopping = threading.Event()
    watcher = threading.Thread(target=serve._watch_deleted_models, kwargs={"stopping": stopping}, daemon=True)
    watcher.start()
    try:
        deadline = time.monotonic() + 60
        while len(turns) < 5:
            assert time.monotonic() < deadline, turns
            time.sleep(0.01)
        settings.REDIS_URL = redis_server.url
        while not any("read from Redis again" in record.getMessage() for record in caplog.records):
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.01)
    finally:
        stopping.set()
        watcher.join()
    messages = [(record.levelname, record.getMessage()) for record in caplog.records]
    assert [level for level, _ in messages] == ["WARNING", "INFO"], messages
    assert messages[0][1].startswith("the models deleted could not be read from Redis: ")
    assert "logged once until it is back" in messages[0][1]


@pytest.mark.parametrize("step, source", [(3, "export-step-3"), (None, "export")])
def test_a_serving_copy_of_a_runs_export_deleted_since_it_was_asked_for_fails_saying_what_to_do(
        db, tmp_path, settings, step, source):
    """QA: a checkpoint's (or the final model's) export deleted outside Temper after its copy was asked for: the
    task failed with the engine's bare "TokenizerError: …: no such directory"."""
    from tests.webapp.factories import make_team
    from webapp.runs.models import Artifact, ArtifactKind, Run, RunStatus, ServingCopy, ServingCopyStatus

    settings.DATA_ROOT = tmp_path
    team = make_team()
    output_dir = tmp_path / "runs" / "finished"
    run = Run.objects.create(project=team.project, name="finished", task="sft", spec={}, status=RunStatus.SUCCEEDED,
                             resolved_spec={"output_dir": str(output_dir)})
    Artifact.objects.create(run=run, kind=ArtifactKind.CHECKPOINT, step=3, path=str(output_dir / "export-step-3"))
    copy = ServingCopy.objects.create(project=team.project, run=run, step=step)
    outcome = serve.make_serving_copy(copy.pk)
    copy.refresh_from_db()
    what = "final model" if step is None else "checkpoint 3"
    assert copy.status == ServingCopyStatus.FAILED and copy.error_message == (
        f"the export of {what} of run {run.public_id} is missing: {output_dir / source} is not there any more (moved "
        "or deleted outside Temper); put the export back at that path, or make the copy of another exported "
        "checkpoint of the run")
    assert outcome["error"] == copy.error_message


def test_shutdown_closes_the_servers_and_stops_the_watcher(redis_db, model_dir, monkeypatch):
    """A serve process's batching servers and its deleted-models watcher lived as long as the process: a
    test process (or a worker shutting down) had no way to end their threads. ``shutdown`` (Celery's
    worker_shutdown) closes them, and the next answer loads its model and starts a watcher anew."""
    monkeypatch.setattr(serve, "DELETED_POLL_SECONDS", 0.05)
    serve.shutdown()  # a watcher of an earlier test polls at the old pace
    first, _ = serve.server_for(f"bm_a@{model_dir}", str(model_dir))
    second, _ = serve.server_for(f"bm_b@{model_dir}", str(model_dir))
    watcher = serve._watcher
    assert watcher is not None and watcher.is_alive() and first._thread.is_alive() and second._thread.is_alive()
    serve.shutdown()
    for thread in (first._thread, second._thread, watcher):
        thread.join(timeout=30)
        assert not thread.is_alive(), thread.name
    assert serve._servers == {} and serve._cache is None and serve._watcher is None
    done = serve.generate(request(model_dir, "after-shutdown", model_key=f"bm_a@{model_dir}"))
    assert done["completion_tokens"] == 12 and serve._servers[f"bm_a@{model_dir}"] is not first
    assert serve._watcher is not None and serve._watcher is not watcher and serve._watcher.is_alive()


def test_a_generation_whose_first_worker_died_mid_answer_ends_saying_so(redis_db, model_dir):
    """A serve worker killed mid-answer leaves its message delivered; the reapers queue it again
    (``webapp.workers.deliveries``), and the next worker generated the answer again from the start, its events
    numbered from 0 again after the dead worker's: a page had shown those numbers already, so it skipped the new
    tokens that far and glued the rest onto the dead worker's words. It ends the answer instead, with the reason
    and what to do, numbered after what the page saw; a generation whose answer was written already does nothing."""
    channels.emit(redis_db, "lost", {"seq": 0, "type": "token", "text": "Hel", "tokens": 1})  # then its worker died
    result = serve.generate(request(model_dir, "lost"))
    assert result["error"] == serve.WORKER_LOST
    assert channels.stored_events(redis_db, "lost")[1:] == [{"seq": 1, "type": "error", "message": serve.WORKER_LOST}]

    channels.emit(redis_db, "early", {"seq": 0, "type": "status", "message": "loading the model"})  # died loading
    answered = serve.generate(request(model_dir, "early"))
    events = channels.stored_events(redis_db, "early")
    assert [event["seq"] for event in events] == list(range(len(events))) and events[-1]["text"] == answered["text"]

    serve.generate(request(model_dir, "written"))
    events = channels.stored_events(redis_db, "written")
    assert serve.generate(request(model_dir, "written")) == {}  # delivered again once it was done
    assert channels.stored_events(redis_db, "written") == events


def test_an_echo_whose_first_worker_died_after_sending_the_prompt_ends_saying_so(redis_db, model_dir):
    """The prompt event is output a client has shown (a stream's first chunk): a second delivery would send it
    again, then the answer, after it, so it ends the answer as one lost after a token."""
    channels.emit(redis_db, "lost-echo", {"seq": 0, "type": "prompt", "text": PROMPT, "tokens": 9})
    result = serve.generate(echo_request(model_dir, "lost-echo", max_new_tokens=0, logprobs=1))
    assert result["error"] == serve.WORKER_LOST
    assert [event["type"] for event in channels.stored_events(redis_db, "lost-echo")] == ["prompt", "error"]


def test_a_request_for_n_answers_whose_first_worker_died_mid_answer_ends_each_saying_so(redis_db, model_dir):
    """The n-answer case of the test above: each answer its worker left unended ends with WORKER_LOST, numbered
    after what it had (tokens, a status, or nothing yet: the relay emits answer by answer, so a worker can die
    between them), and one it had ended keeps its done as its last event, not an error after it."""
    ids = [channels.choice_id("lost-n", index) for index in range(4)]
    channels.emit(redis_db, ids[0], {"seq": 0, "type": "token", "text": "Hel", "tokens": 1})
    channels.emit(redis_db, ids[1], {"seq": 0, "type": "status", "message": "compiling"})
    done = {"seq": 1, "type": "done", "text": "Hi", "finish_reason": "stop", "choice": 2, "prompt_tokens": 5,
            "completion_tokens": 1, "first_token_seconds": 0.1}
    channels.emit(redis_db, ids[2], {"seq": 0, "type": "token", "text": "Hi", "tokens": 1})
    channels.emit(redis_db, ids[2], done)  # ids[3]: its worker died before its first event
    result = serve.generate(request(model_dir, "lost-n", n=4))
    assert result["error"] == serve.WORKER_LOST
    lost = {"type": "error", "message": serve.WORKER_LOST}
    assert channels.stored_events(redis_db, ids[0])[1:] == [{"seq": 1, **lost}]
    assert channels.stored_events(redis_db, ids[1])[1:] == [{"seq": 1, **lost}]
    assert channels.stored_events(redis_db, ids[2])[-1] == done
    assert channels.stored_events(redis_db, ids[3]) == [{"seq": 0, **lost}]
    assert not channels.stored_events(redis_db, "lost-n")

    for choice_id in [channels.choice_id("early-n", index) for index in range(2)]:  # died loading the model
        channels.emit(redis_db, choice_id, {"seq": 0, "type": "status", "message": "loading the model"})
    answered = serve.generate(request(model_dir, "early-n", n=2))
    for index, choice in enumerate(answered["choices"]):
        events = channels.stored_events(redis_db, channels.choice_id("early-n", index))
        assert [event["seq"] for event in events] == list(range(len(events))) and events[-1]["text"] == choice["text"]
    assert serve.generate(request(model_dir, "early-n", n=2)) == {}  # delivered again once every answer was done


def test_a_requests_template_variables_are_laid_over_the_models_own(model_dir, tmp_path):
    """A run's export keeps its data.chat_template_kwargs (chat_template_kwargs.json): the serve worker renders
    a conversation with them, and a request's chat_template_kwargs (a /v1 body's, the Thinking switch's) over them."""
    import json
    import shutil

    thinking = tmp_path / "thinking"
    shutil.copytree(model_dir, thinking)
    config = json.loads((thinking / "tokenizer_config.json").read_text())
    config["chat_template"] = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                               "{% if enable_thinking is defined and enable_thinking is false %}no thinking{% endif %}")
    (thinking / "tokenizer_config.json").write_text(json.dumps(config))
    (thinking / "chat_template_kwargs.json").write_text('{"enable_thinking": false}')
    tokenizer = load_serving_model(thinking).tokenizer

    def prompt(**fields) -> str:
        return tokenizer.decode(serve.prompt_ids(serve.GenerateRequest.model_validate(request(thinking, "t", **fields)),
                                                 tokenizer))

    assert prompt().endswith("no thinking")
    assert not prompt(chat_template_kwargs={"enable_thinking": True}).endswith("no thinking")
    with pytest.raises(ValueError, match="chat_template_kwargs: 'messages' is set by the renderer"):
        serve.GenerateRequest.model_validate(request(thinking, "t", chat_template_kwargs={"messages": "x"}))


@pytest.mark.parametrize("template,message", factories.HOSTILE_CHAT_TEMPLATES.values(),
                         ids=factories.HOSTILE_CHAT_TEMPLATES.keys())
def test_a_prompt_a_hostile_chat_template_fails_on_is_a_value_error_naming_its_file(tmp_path, template, message):
    """The chat panel's, /v1's and a review campaign's prompts are rendered here: a template's 1/0 or RecursionError
    was 'the model failed: division by zero' (no file), and an endless loop held the serve worker. generate answers a
    ValueError with its message as the request's error."""
    from jaxengine.chat_template import ChatTemplateError
    from jaxengine.tokenizer import load_tokenizer

    model_dir = factories.build_bpe_tokenizer_dir(tmp_path, chat_template=template)
    parsed = serve.GenerateRequest.model_validate(request(model_dir, "hostile"))
    started = time.monotonic()
    with pytest.raises(ChatTemplateError) as raised:
        serve.prompt_ids(parsed, load_tokenizer(model_dir))
    assert time.monotonic() - started < 4
    assert isinstance(raised.value, ValueError)
    assert str(raised.value).startswith(f"{model_dir / 'tokenizer_config.json'}: chat template")
    assert message in str(raised.value)


def live_programs() -> int:
    import jax

    return len(jax.devices()[0].client.live_executables())


def test_models_served_in_turn_leave_no_programs_behind(redis_db, tmp_path, settings):
    """A serve worker kept the compiled programs of every model structure it had served (up to 16), each with memory
    maps of its own: one serving many models for days could reach vm.max_map_count, where XLA's compiler segfaults
    mid-chat (bench/RESULTS.md, "The serve worker's compiled programs"). An evicted model's programs are kept among
    the last few retired, for a user going back to it, and go past them: served one at a time, five models of five
    structures (contexts) leave no more live programs than the first three."""
    settings.TEMPER_SERVE_WARMUP = False
    settings.TEMPER_SERVE_MEMORY_BYTES = 1  # one model at a time (a model over the budget is served alone)
    serve.shutdown()
    before = set(threading.enumerate())  # servers of earlier tests end at their next turn, not waited for
    counts, compiled = [], {}  # ids: holding the programs here would keep them
    for context in (64, 80, 96, 112, 128):
        model_dir = factories.build_tiny_model_dir(tmp_path / f"context-{context}", context=context)
        done = serve.generate(request(model_dir, f"turn-{context}", model_key=f"turn-{context}", max_new_tokens=4))
        assert done["completion_tokens"] == 4, done
        server = serve.server_for(f"turn-{context}", str(model_dir))[0]
        compiled[context] = id(server.decoder.compiled)
        # The programs the answer did without compile once the server is idle: counted before they were, a model's
        # count came out low, and a later one's above it (under load, on CI).
        wait_for(lambda: not server.compiling, timeout=120, what="the programs the answer did without")
        # An evicted model's server is closed without waiting: its loop thread (and a compile under way on its compile
        # thread) holds its programs until it ends, later under load than this count was taken.
        wait_for(lambda: not [thread for thread in set(threading.enumerate()) - before
                              if thread.name.startswith(("batching-server", "serving-compile"))
                              and thread is not server._thread and thread not in server_compile_threads(server)],
                 timeout=120, what="the evicted models' servers to end")
        gc.collect()  # the programs of an evicted model's server, once its thread has ended (a cycle through jit)
        counts.append(live_programs())
    retired = PROGRAMS.retired_kept
    assert counts[-1] <= counts[retired], counts
    # The one served and the last `retired` evicted.
    assert {id(held) for held in held_programs()} == {compiled[context] for context in (128, 112, 96)[:1 + retired]}
    # Going back to a model just evicted finds its programs compiled.
    assert id(serve.server_for("turn-112", str(tmp_path / "context-112"))[0].decoder.compiled) == compiled[112]
    # A deleted one's are dropped at once: nothing holds them for a later decoder.
    assert serve.drop_deleted_models({"turn-112"}) == ["turn-112"]
    assert compiled[112] not in {id(held) for held in held_programs()}
    serve.shutdown()


def server_compile_threads(server) -> set:
    """The threads of ``server``'s compile pool (a ThreadPoolExecutor keeps them until it shuts down)."""
    return set(server._compiler._threads)


def held_programs() -> list:
    """The compiled programs of each model structure that ``jaxengine.serving`` keeps for later decoders."""
    return [held for held in PROGRAMS.held() if isinstance(held, serving._Compiled)]


def test_past_the_maps_high_water_mark_a_model_load_drops_every_retired_structures_programs(redis_db, tmp_path,
                                                                                             settings, caplog):
    """A safety net under the bounds: after a model load, a serve worker whose memory maps (/proc/self/maps lines)
    pass ``TEMPER_SERVE_MAPS_HIGH_WATER`` drops the programs of every structure retired (kept for a user going back
    to an evicted model) rather than compile on towards vm.max_map_count, where XLA's compiler segfaults, and says
    so in its log. Below the mark they stay."""
    settings.TEMPER_SERVE_WARMUP = False
    settings.TEMPER_SERVE_MEMORY_BYTES = 1  # one model at a time
    serve.shutdown()
    caplog.set_level(logging.INFO, logger="worker.tasks.serve")
    compiled = {}
    for context in (64, 80, 96):
        if context == 96:
            settings.TEMPER_SERVE_MAPS_HIGH_WATER = 1  # any process is past it
        model_dir = factories.build_tiny_model_dir(tmp_path / f"context-{context}", context=context)
        done = serve.generate(request(model_dir, f"mark-{context}", model_key=f"mark-{context}", max_new_tokens=4))
        assert done["completion_tokens"] == 4, done
        compiled[context] = id(serve.server_for(f"mark-{context}", str(model_dir))[0].decoder.compiled)
        if context == 80:  # below the mark: the evicted model's programs are kept
            assert {id(held) for held in held_programs()} == {compiled[64], compiled[80]}
    assert {id(held) for held in held_programs()} == {compiled[96]}
    [record] = [record for record in caplog.records if "high-water" in record.getMessage()]
    assert record.levelno == logging.WARNING and "2 retired model structures" in record.getMessage()
    serve.shutdown()
