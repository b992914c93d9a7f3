"""The OpenAI-compatible API driven by the official ``openai`` client against the real ASGI server and
a real serve worker: models, chat completions (streaming and not), completions, project-scoped tokens."""
from __future__ import annotations

from pathlib import Path

import pytest
from django.core.management import call_command

from tests.browser.test_runs import asgi_server  # noqa: F401  (uvicorn on the test database and Redis)
from tests.factories import build_tiny_model_dir
from tests.live import wait_for
from tests.webapp.factories import make_base_model, make_team

pytestmark = pytest.mark.integration


@pytest.fixture
def api(asgi_server, celery_workers, transactional_db, settings, capsys):  # noqa: F811
    import openai

    celery_workers.ensure("serve")
    team = make_team()
    model_dir = build_tiny_model_dir(settings.MODELS_ROOT / "tiny-openai")
    base_model = make_base_model(team.project, name="tiny", path=str(model_dir))
    call_command("apitoken", user=team.teammate.username, project=team.project.slug)
    secret = capsys.readouterr().out.strip()
    client = openai.OpenAI(base_url=f"{asgi_server}/v1", api_key=secret, max_retries=0, timeout=90)
    return client, team, base_model


def test_models_and_chat_completions_streaming_and_not(api):
    client, team, base_model = api
    assert [model.id for model in client.models.list().data] == [base_model.public_id]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    whole = client.chat.completions.create(model=base_model.public_id, messages=messages, max_tokens=12,
                                           temperature=0)
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 12
    chunks = list(client.chat.completions.create(model=base_model.public_id, messages=messages, max_tokens=12,
                                                 temperature=0, stream=True))
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
    assert streamed == whole.choices[0].message.content and len(chunks) > 2
    assert chunks[-1].choices[0].finish_reason == "length"
    assert whole.object == "chat.completion" and whole.id.startswith("chatcmpl-")
    assert {chunk.object for chunk in chunks} == {"chat.completion.chunk"} and {chunk.id for chunk in chunks} == {chunks[0].id}
    # Content as a list of text parts (as many clients send it) is the same conversation; other parts are refused.
    parts = [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
             {"role": "user", "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]}]
    joined = [messages[0], {"role": "user", "content": "Hel\nlo"}]
    as_parts = client.chat.completions.create(model=base_model.public_id, messages=parts, max_tokens=12, temperature=0)
    as_string = client.chat.completions.create(model=base_model.public_id, messages=joined, max_tokens=12,
                                               temperature=0)
    assert as_parts.choices[0].message.content == as_string.choices[0].message.content
    import openai

    with pytest.raises(openai.BadRequestError, match="part 1 is of type 'image_url': these models read text only"):
        client.chat.completions.create(model=base_model.public_id, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}])


def test_completions(api):
    import openai

    client, team, base_model = api
    whole = client.completions.create(model=base_model.public_id, prompt="Once upon a time", max_tokens=8,
                                      temperature=0)
    chunks = list(client.completions.create(model=base_model.public_id, prompt="Once upon a time", max_tokens=8,
                                            temperature=0, stream=True))
    assert "".join(chunk.choices[0].text for chunk in chunks) == whole.choices[0].text
    assert whole.usage.completion_tokens == 8
    assert whole.object == "text_completion" and whole.id.startswith("cmpl-")
    assert {chunk.object for chunk in chunks} == {"text_completion"}
    # stop: the text ends before the first occurrence, streamed or not, with finish_reason "stop".
    stop = whole.choices[0].text[3:5]
    cut = whole.choices[0].text[:whole.choices[0].text.find(stop)]
    stopped = client.completions.create(model=base_model.public_id, prompt="Once upon a time", max_tokens=8,
                                        temperature=0, stop=[stop])
    assert stopped.choices[0].text == cut and stopped.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(model=base_model.public_id, prompt="Once upon a time", max_tokens=8,
                                            temperature=0, stop=stop, stream=True))
    assert "".join(chunk.choices[0].text for chunk in chunks) == cut
    with pytest.raises(openai.BadRequestError, match="at most 4 stop sequences"):
        client.completions.create(model=base_model.public_id, prompt="x", stop=["a", "b", "c", "d", "e"])
    # Without max_tokens: what the model's context leaves after the prompt, up to 256 (this model's context is 256
    # tokens, so a fixed 256 refused every prompt with context_length_exceeded).
    unsaid = client.completions.create(model=base_model.public_id, prompt="Once upon a time", temperature=0)
    assert 1 <= unsaid.usage.completion_tokens and unsaid.usage.total_tokens <= 256


def test_logprobs_read_by_the_openai_client_streamed_and_not(api):
    """Each answer token's log probability and its top alternatives', as OpenAI's clients read them: the chat
    completion's ``choices[0].logprobs.content`` (whole, and per streamed chunk), the completion's legacy
    ``choices[0].logprobs``; an answer asked without them carries none."""
    client, team, base_model = api
    messages = [{"role": "user", "content": "Hello"}]
    asked = {"model": base_model.public_id, "messages": messages, "max_tokens": 12, "temperature": 0}
    whole = client.chat.completions.create(**asked, logprobs=True, top_logprobs=3)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens == 12
    for entry in content:  # greedy: each token is its most likely alternative, which comes first
        assert len(entry.top_logprobs) == 3 and entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == entry.logprob <= 0 and entry.bytes is not None
        assert [top.logprob for top in entry.top_logprobs] == sorted((top.logprob for top in entry.top_logprobs),
                                                                     reverse=True)
    chunks = list(client.chat.completions.create(**asked, logprobs=True, top_logprobs=3, stream=True))
    streamed = [entry for chunk in chunks if chunk.choices[0].logprobs for entry in chunk.choices[0].logprobs.content]
    assert [entry.model_dump() for entry in streamed] == [entry.model_dump() for entry in content]
    plain = client.chat.completions.create(**asked)
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == whole.choices[0].message.content
    text = client.completions.create(model=base_model.public_id, prompt="Once upon a time", max_tokens=8,
                                     temperature=0, logprobs=2)
    logprobs = text.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.text_offset) == 8
    assert all(len(alternatives) <= 2 for alternatives in logprobs.top_logprobs)
    assert logprobs.text_offset[0] == 0 and logprobs.text_offset == sorted(logprobs.text_offset)


def test_echo_gives_the_prompt_and_its_logprobs_before_the_answer_streamed_and_not(api):
    """echo as the official client asks it of the real serve worker: the prompt alone, scored (max_tokens 0: its
    tokens' log probabilities, the first null; nothing generated), and the prompt before an answer, whole and
    streamed, the prompt's entries those of the prompt alone and the answer's those of the answer asked without
    echo, the text offsets going on from the prompt's tokens."""
    client, team, base_model = api
    prompt, asked = "Once upon a time", {"model": base_model.public_id, "temperature": 0, "logprobs": 2}
    scored = client.completions.create(prompt=prompt, echo=True, max_tokens=0, **asked)
    [choice] = scored.choices
    assert (choice.text, choice.finish_reason, scored.usage.completion_tokens) == (prompt, "length", 0)
    prompt_logprobs = choice.logprobs
    assert len(prompt_logprobs.tokens) == scored.usage.prompt_tokens > 2
    assert prompt_logprobs.token_logprobs[0] is None and prompt_logprobs.top_logprobs[0] is None
    assert all(logprob <= 0 for logprob in prompt_logprobs.token_logprobs[1:])
    assert all(1 <= len(alternatives) <= 2 for alternatives in prompt_logprobs.top_logprobs[1:])
    assert "".join(prompt_logprobs.tokens) == prompt
    assert prompt_logprobs.text_offset == [prompt.index(token, offset) for token, offset in
                                           zip(prompt_logprobs.tokens, prompt_logprobs.text_offset)]
    plain = client.completions.create(prompt=prompt, max_tokens=4, **asked).choices[0]
    whole = client.completions.create(prompt=prompt, echo=True, max_tokens=4, **asked).choices[0]
    assert whole.text == prompt + plain.text
    for key in ("tokens", "token_logprobs", "top_logprobs"):
        assert getattr(whole.logprobs, key) == getattr(prompt_logprobs, key) + getattr(plain.logprobs, key)
    assert whole.logprobs.text_offset == prompt_logprobs.text_offset + [len(prompt) + offset for offset in
                                                                        plain.logprobs.text_offset]
    chunks = list(client.completions.create(prompt=prompt, echo=True, max_tokens=4, stream=True, **asked))
    assert chunks[0].choices[0].text == prompt and chunks[0].choices[0].logprobs.tokens == prompt_logprobs.tokens
    assert "".join(chunk.choices[0].text for chunk in chunks) == whole.text
    assert [offset for chunk in chunks if chunk.choices[0].logprobs
            for offset in chunk.choices[0].logprobs.text_offset] == whole.logprobs.text_offset


def test_echo_answers_lm_evaluation_harness_local_completions_loglikelihood(api, asgi_server):  # noqa: F811
    """lm-evaluation-harness's local-completions scores a context's continuations (loglikelihood tasks) by posting
    each context + continuation with echo, logprobs 1, max_tokens 1 and temperature 0 (its _create_payload), as
    raw JSON, and reading, for each choice by its index, ``token_logprobs[ctxlen:-1]`` (the continuation's tokens:
    ctxlen the context's tokens, -1 the token generated) summed, and whether each is its top_logprobs' most likely
    (its parse_logprobs). Here each continuation's tokens are read where lm-eval reads them, their sum is that of
    the same text scored alone (max_tokens 0), and each token's alternative is at least as likely as it."""
    import json
    import urllib.request

    from jaxengine.prompts import with_bos
    from jaxengine.tokenizer import load_tokenizer

    client, team, base_model = api
    context, continuations = "Once upon a", [" time", " zebra"]
    tokenizer = load_tokenizer(base_model.path)
    ctxlen = len(with_bos(tokenizer, tokenizer.encode(context)))
    assert [with_bos(tokenizer, tokenizer.encode(context + continuation))[:ctxlen] for continuation in continuations
            ] == [with_bos(tokenizer, tokenizer.encode(context))] * 2  # the context's tokens begin each prompt
    payload = {"model": base_model.public_id, "prompt": [context + continuation for continuation in continuations],
               "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": True}
    posted = urllib.request.Request(f"{asgi_server}/v1/completions", data=json.dumps(payload).encode(), method="POST",
                                    headers={"Authorization": f"Bearer {client.api_key}",
                                             "Content-Type": "application/json"})
    with urllib.request.urlopen(posted, timeout=90) as response:
        answer = json.load(response)
    sums = []
    for choice in sorted(answer["choices"], key=lambda choice: choice["index"]):  # lm-eval's parse_logprobs
        logprobs = choice["logprobs"]
        continuation = logprobs["token_logprobs"][ctxlen:-1]
        sums.append(sum(continuation))
        assert "".join(logprobs["tokens"][ctxlen:-1]) == continuations[choice["index"]]
        # What its is_greedy compares: each token's log probability with its most likely alternative's.
        assert all(max(top.values()) >= logprob
                   for logprob, top in zip(continuation, logprobs["top_logprobs"][ctxlen:-1]))
    for continuation, logprob in zip(continuations, sums):
        alone = client.completions.create(model=base_model.public_id, prompt=context + continuation, echo=True,
                                          logprobs=1, max_tokens=0, temperature=0).choices[0].logprobs
        assert logprob == sum(alone.token_logprobs[ctxlen:]) < 0
    assert answer["usage"]["completion_tokens"] == 2 and len(answer["choices"]) == 2


def test_token_id_prompts_as_lm_evaluation_harness_sends_them_answer_as_their_text_does(api, asgi_server):  # noqa: F811
    """lm-evaluation-harness's local-completions sends its prompts as token ids by default (tokenized_requests=True),
    which were refused: its loglikelihood payload (a list of id lists, echo, logprobs 1, max_tokens 1, temperature
    0) gets the log probabilities the same prompts sent as text get, each prompt's ids being the tokens the text
    becomes, and its generation payload (ids, greedy, a stop) the text's answer; the openai client's ids alike,
    streamed too."""
    import json
    import urllib.request

    from jaxengine.prompts import with_bos
    from jaxengine.tokenizer import load_tokenizer

    client, team, base_model = api
    tokenizer = load_tokenizer(base_model.path)
    texts = ["Once upon a time", "Once upon a zebra"]
    ids = [with_bos(tokenizer, tokenizer.encode(text)) for text in texts]

    def post(payload: dict) -> dict:
        posted = urllib.request.Request(f"{asgi_server}/v1/completions", data=json.dumps(payload).encode(),
                                        method="POST", headers={"Authorization": f"Bearer {client.api_key}",
                                                                "Content-Type": "application/json"})
        with urllib.request.urlopen(posted, timeout=90) as response:
            return json.load(response)

    def scored(prompt) -> dict:  # lm-eval's _create_payload(generate=False)
        return post({"model": base_model.public_id, "prompt": prompt, "temperature": 0, "max_tokens": 1,
                     "logprobs": 1, "seed": 1234, "echo": True})

    by_ids, by_text = scored(ids), scored(texts)
    assert by_ids["usage"] == by_text["usage"] and by_ids["usage"]["prompt_tokens"] == sum(map(len, ids))
    for id_choice, text_choice in zip(by_ids["choices"], by_text["choices"], strict=True):
        assert id_choice["index"] == text_choice["index"] and id_choice["text"] == text_choice["text"]
        assert id_choice["logprobs"] == text_choice["logprobs"]
        assert len(id_choice["logprobs"]["token_logprobs"]) == len(ids[id_choice["index"]]) + 1
    alone = post({"model": base_model.public_id, "prompt": ids[0], "echo": True, "logprobs": 1, "max_tokens": 0})
    assert alone["choices"][0]["logprobs"]["token_logprobs"] == by_text["choices"][0]["logprobs"]["token_logprobs"][:-1]

    def generated(prompt) -> list[str]:  # lm-eval's _create_payload(generate=True), greedy
        answer = post({"model": base_model.public_id, "prompt": prompt, "max_tokens": 12, "temperature": 0,
                       "stop": ["\n\n"], "seed": 1234})
        return [choice["text"] for choice in sorted(answer["choices"], key=lambda choice: choice["index"])]

    assert generated(ids) == generated(texts) and all(generated(ids))
    one = client.completions.create(model=base_model.public_id, prompt=ids[1], max_tokens=6, temperature=0)
    as_text = client.completions.create(model=base_model.public_id, prompt=texts[1], max_tokens=6, temperature=0)
    assert one.choices[0].text == as_text.choices[0].text and one.usage == as_text.usage
    chunks = list(client.completions.create(model=base_model.public_id, prompt=ids[1], max_tokens=6, temperature=0,
                                            stream=True))
    assert "".join(chunk.choices[0].text for chunk in chunks) == one.choices[0].text


def test_tokens_are_project_scoped(api, asgi_server):  # noqa: F811
    import openai

    client, team, base_model = api
    with pytest.raises(openai.NotFoundError, match="does not exist in project"):
        client.chat.completions.create(model="bm_not_in_this_project", messages=[{"role": "user", "content": "x"}])
    stranger = openai.OpenAI(base_url=f"{asgi_server}/v1", api_key="tpk_wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        stranger.models.list()
    # A token stops working when its user leaves the project, and says why.
    from webapp.projects.models import Membership

    Membership.objects.filter(project=team.project, user=team.teammate).delete()
    with pytest.raises(openai.PermissionDeniedError, match="is no longer a member of"):
        client.models.list()


def test_chat_template_kwargs_reach_the_template_and_lay_over_the_models_own(api, settings):
    """vLLM's chat_template_kwargs, as the openai client sends them (extra_body): enable_thinking false renders
    Qwen3's empty think block after the generation prompt (more prompt tokens); a model whose own variables
    (chat_template_kwargs.json, as a run's export keeps them) turn thinking off renders it unasked, and a request
    turns it back on."""
    import json
    import shutil

    import openai

    client, team, base_model = api
    template = Path(__file__).parents[1] / "jaxengine/tokenizer/real_templates/qwen3.jinja"
    thinker_dir = settings.MODELS_ROOT / "tiny-openai-thinker"
    shutil.copytree(base_model.path, thinker_dir)
    config = json.loads((thinker_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = template.read_text(encoding="utf-8")
    (thinker_dir / "tokenizer_config.json").write_text(json.dumps(config))
    thinker = make_base_model(team.project, name="thinker", path=str(thinker_dir))
    messages = [{"role": "user", "content": "Hello"}]

    def prompt_tokens(model, **variables) -> int:
        extra = {"extra_body": {"chat_template_kwargs": variables}} if variables else {}
        return client.chat.completions.create(model=model.public_id, messages=messages, max_tokens=1, temperature=0,
                                              **extra).usage.prompt_tokens

    thinking = prompt_tokens(thinker)
    assert prompt_tokens(thinker, enable_thinking=False) > thinking
    assert prompt_tokens(thinker, enable_thinking=True) == thinking

    trained_off_dir = settings.MODELS_ROOT / "tiny-openai-trained-off"
    shutil.copytree(thinker_dir, trained_off_dir)
    (trained_off_dir / "chat_template_kwargs.json").write_text('{"enable_thinking": false}')
    trained_off = make_base_model(team.project, name="trained-off", path=str(trained_off_dir))
    assert prompt_tokens(trained_off) == prompt_tokens(thinker, enable_thinking=False)
    assert prompt_tokens(trained_off, enable_thinking=True) == thinking

    with pytest.raises(openai.BadRequestError, match=r"chat_template_kwargs\[\"enable_thinking\"\]: \[false\] is not"):
        client.chat.completions.create(model=thinker.public_id, messages=messages, max_tokens=1,
                                       extra_body={"chat_template_kwargs": {"enable_thinking": [False]}})


def test_n_answers_streamed_and_not_seeded_and_bounded(api):
    """Issue 4: n answers through the real serve worker, asked with the official client. Seeded, the whole response
    is reproducible: the same n answers whole, streamed (chunks naming their answer's index) or asked again; its
    first answer is the one n=1 gives. The prompt is counted once in the usage; greedy answers are all the same."""
    import openai

    client, team, base_model = api
    ask = dict(model=base_model.public_id, messages=[{"role": "user", "content": "Hello"}], max_tokens=10,
               temperature=1.0, seed=3)
    whole = client.chat.completions.create(n=3, **ask)
    texts = [choice.message.content for choice in whole.choices]
    assert [choice.index for choice in whole.choices] == [0, 1, 2] and len(set(texts)) > 1
    assert all(choice.finish_reason in ("stop", "length") for choice in whole.choices)
    one = client.chat.completions.create(n=1, **ask)
    assert one.choices[0].message.content == texts[0]
    assert whole.usage.prompt_tokens == one.usage.prompt_tokens and 3 <= whole.usage.completion_tokens <= 30
    chunks = list(client.chat.completions.create(n=3, stream=True, stream_options={"include_usage": True}, **ask))
    streamed = {0: "", 1: "", 2: ""}
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        streamed[choice.index] += choice.delta.content or ""
    assert list(streamed.values()) == texts
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole.usage.model_dump()
    twice = [[choice.message.content for choice in client.chat.completions.create(n=2, **ask).choices]
             for _ in range(2)]
    assert twice[0] == twice[1] == texts[:2]
    greedy = client.completions.create(model=base_model.public_id, prompt="Once upon a time", max_tokens=6,
                                       temperature=0, n=2)
    assert len(greedy.choices) == 2 and greedy.choices[0].text == greedy.choices[1].text
    with pytest.raises(openai.BadRequestError, match="n: 9 is too large; give a whole number from 1 to 8") as refused:
        client.chat.completions.create(n=9, **ask)
    assert refused.value.param == "n"


def test_n_answers_take_every_sampling_field_as_one_answer_does(api, settings, redis_url):
    """QA of issue 4 as a user of the official client: each of n answers is the answer n=1 would give under the same
    stop sequences, max_tokens, penalties and logit_bias (its first, seeded; every one, greedy); a list of prompts
    with n numbers prompt p's answer i as p * n + i, streamed with include_usage as whole; a client that goes away
    mid-stream ends every one of the serve worker's rows, not just its HTTP response."""
    from webapp.chat import channels
    from webapp.runs.channels import redis_client

    client, team, base_model = api
    ask = dict(model=base_model.public_id, prompt="Once upon a time", max_tokens=12)
    greedy = client.completions.create(temperature=0, **ask).choices[0].text
    stop = greedy[4:6]
    stopped = client.completions.create(temperature=0, n=3, stop=[stop], **ask)
    assert [(choice.text, choice.finish_reason) for choice in stopped.choices] == [
        (greedy[:greedy.find(stop)], "stop")] * 3
    sampled = dict(temperature=1.0, seed=7, **ask)
    for fields in ({"max_tokens": 3}, {"presence_penalty": 2.0, "frequency_penalty": 2.0}, {"stop": stop}):
        one = client.completions.create(n=1, **(sampled | fields))
        many = client.completions.create(n=3, **(sampled | fields))
        assert many.choices[0].text == one.choices[0].text and len(many.choices) == 3, fields
        assert many.usage.prompt_tokens == one.usage.prompt_tokens
    capped = client.completions.create(n=4, **(sampled | {"max_tokens": 3}))
    assert capped.usage.completion_tokens <= 12 and all(choice.text for choice in capped.choices)
    from jaxengine.tokenizer import load_tokenizer

    token = load_tokenizer(base_model.path).encode(" the")[-1]
    biased = client.completions.create(n=3, logit_bias={str(token): 100}, **(sampled | {"max_tokens": 4}))
    one = client.completions.create(n=1, logit_bias={str(token): 100}, **(sampled | {"max_tokens": 4}))
    assert [choice.text for choice in biased.choices] == [one.choices[0].text] * 3
    prompts = dict(model=base_model.public_id, prompt=["Once upon a time", "Hello there, how"], max_tokens=5,
                   temperature=0.9, seed=1, n=2)
    whole = client.completions.create(**prompts)
    alone = [client.completions.create(**(prompts | {"prompt": prompt})) for prompt in prompts["prompt"]]
    assert [choice.index for choice in whole.choices] == [0, 1, 2, 3]
    assert [choice.text for choice in whole.choices] == [choice.text for answer in alone for choice in answer.choices]
    assert whole.usage.prompt_tokens == sum(answer.usage.prompt_tokens for answer in alone)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **prompts))
    texts = ["", "", "", ""]
    for chunk in chunks[:-1]:
        texts[chunk.choices[0].index] += chunk.choices[0].text
    assert texts == [choice.text for choice in whole.choices]
    assert chunks[-1].usage.model_dump() == whole.usage.model_dump()

    # Answers that cannot end before the client's leaving reaches the worker: no end of text (the model's end ids
    # biased away) and room for 3,000 tokens; CI (2026-12-07) saw every row of a 256-token model draw its 200 tokens
    # or its end of text before the cancel came, on a slow run.
    long_dir = build_tiny_model_dir(settings.MODELS_ROOT / "tiny-openai-long", context=4096)
    long_model = make_base_model(team.project, name="tiny-long", path=str(long_dir))
    no_end = {str(token): -100 for token in load_tokenizer(long_dir).eos_ids}
    leaving = client.completions.create(model=long_model.public_id, prompt="Once upon a time", max_tokens=3000,
                                        temperature=1.0, n=8, stream=True, logit_bias=no_end)
    generation_id = next(iter(leaving)).id
    leaving.close()  # the client goes away after its first chunk
    settings.REDIS_URL = redis_url
    redis = redis_client()

    def ended():
        lasts = [(channels.stored_events(redis, channels.choice_id(generation_id, index)) or [{}])[-1]
                 for index in range(8)]
        return lasts if all(last.get("type") == "done" for last in lasts) else None

    lasts = wait_for(ended, timeout=60, what="every answer's end")
    # Every row stopped mid-answer (none can draw an end of text, none ran to its 3,000 tokens).
    assert [last["finish_reason"] for last in lasts] == ["cancelled"] * 8, lasts
    assert all(last["completion_tokens"] < 3000 for last in lasts), lasts
