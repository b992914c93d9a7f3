"""The OpenAI-compatible API's own behaviour over a real Redis, with the serve worker's events written by
the test: errors shaped and named as OpenAI's, a streamed request refused before its stream starts,
OpenAI's chunks, and a client that goes away stopping its generation. (tests/integration/test_openai_api.py
drives it with the official client against a real serve worker.)"""
import asyncio
import json

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.test import AsyncClient, Client

from jaxengine.chat_template import TEMPLATE_VARIABLES_MAX
from tests.webapp.factories import make_base_model
from webapp.chat import channels, openai_api
from webapp.chat.tokens import project_token_create
from webapp.core import sse
from webapp.runs.channels import redis_client
from worker.tasks.serve import GenerateRequest


@pytest.fixture
def api(team, redis_server, settings):
    settings.REDIS_URL = redis_server.url
    redis_client().flushdb()
    model = make_base_model(team.project, name="tiny", path="/models/tiny")
    _token, secret = project_token_create(user=team.teammate, project=team.project, name="x")
    return model, {"HTTP_AUTHORIZATION": f"Bearer {secret}"}


@pytest.fixture
def worker(monkeypatch):
    """Stands in for the serve worker: each request sent gets the events the test gave, at once."""
    scripts, requests = [], []

    def send_task(name, args, queue, **options):
        requests.append(args[0])
        n = args[0].get("n", 1)  # a request for n answers: a script each, under each answer's own id
        ids = [args[0]["id"]] if n == 1 else [channels.choice_id(args[0]["id"], index) for index in range(n)]
        for generation_id in ids:
            for seq, event in enumerate(scripts.pop(0) if scripts else []):
                channels.emit(redis_client(), generation_id, {"seq": seq, **event})

    monkeypatch.setattr(openai_api.celery_app, "send_task", send_task)
    return scripts, requests


def post(path, body, headers, **extra):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return Client().post(path, data, content_type="application/json", **headers, **extra)


CHAT = {"model": None, "messages": [{"role": "user", "content": "hi"}]}


def chat(model, **fields):
    return {**CHAT, "model": model.public_id, **fields}


@pytest.mark.parametrize("fields,message,param", [
    ({"stream": "yes"}, 'stream: "yes" is not true or false', "stream"),
    ({"max_tokens": True}, "max_tokens: true is not a whole number", "max_tokens"),
    ({"temperature": "0.5"}, "temperature: ", "temperature"),
    ({"stop": 5}, "stop: give a string or a list of strings", "stop"),
    ({"stop": ["a", 1]}, "stop: give a string or a list of strings", "stop"),
    ({"messages": ["hi"]}, 'messages[0]: "hi" is not a JSON object', "messages[0]"),
    ({"messages": [{"role": "user", "content": ["x"]}]},
     'messages[0].content: part 0 is not an object: send text parts ({"type": "text", "text": ...}) or a string',
     "messages[0].content"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content: ", "messages[0].content"),
    # QA: a top_k of 2**40 reached the batch's int32 array and failed the other requests sharing it.
    ({"top_k": 2**40}, "top_k: 1099511627776 is too large; give a whole number from 0 to 2147483647", "top_k"),
    ({"temperature": float("nan")}, "temperature: NaN is not a finite number", "temperature"),
    ({"top_p": float("nan")}, "top_p: NaN is not a finite number", "top_p"),
    # QA: a lone surrogate ("\\ud800": half of a UTF-16 pair) reached the serve worker, whose tokenizer failed
    # on it: a 400 reading "the model failed: Unable to cast Python instance of type <class 'str'> to C++ type".
    ({"messages": [{"role": "user", "content": "a\ud800"}]},
     "messages[0].content: U+D800 at position 2 is half of a UTF-16 surrogate pair, not a character",
     "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]},
     "messages[0].content: U+DFFF at position 1 is half", "messages[0].content"),
    ({"stop": ["ok", "\udc00"]}, "stop: U+DC00 at position 1 is half", "stop"),
    ({"stream_options": {"include_usage": True}},
     "stream_options: only allowed when stream is true; leave it out, or set stream: true",
     "stream_options"),
])
def test_a_bad_field_is_named_as_the_client_wrote_it(api, fields, message, param):
    """Strings and booleans were taken for numbers and flags ("stream": "yes" streamed), and messages named
    pydantic's internals ("instance of _Message", "stop.str")."""
    model, headers = api
    response = post("/v1/chat/completions", chat(model, **fields), headers)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"].startswith(message) and error["param"] == param and error["type"] == "invalid_request_error"
    assert "_Message" not in error["message"] and "ChatBody" not in error["message"]


HI = {"role": "user", "content": "hi"}
GIVE_A_MODEL = "give the id of one of this project's models (GET /v1/models lists them)"
GIVE_MESSAGES = 'give a JSON array of messages, each {"role": ..., "content": ...}, at least one'
GIVE_A_ROLE = "give one of system, developer, user, assistant"


@pytest.mark.parametrize("path,body,param,code,message", [
    # a required field missing, at the top and in a message
    ("/v1/chat/completions", {"messages": [HI]}, "model", "missing_required_parameter",
     f"model: missing (it is required); {GIVE_A_MODEL}"),
    ("/v1/chat/completions", {"model": "{model}"}, "messages", "missing_required_parameter",
     f"messages: missing (it is required); {GIVE_MESSAGES}"),
    ("/v1/completions", {"model": "{model}"}, "prompt", "missing_required_parameter",
     f"prompt: missing (it is required); give {openai_api.PROMPT_FORMS}; up to 32 prompts, a choice each"),
    ("/v1/chat/completions", {"model": "{model}", "messages": [HI, {"content": "x"}]}, "messages[1].role",
     "missing_required_parameter", f"messages[1].role: missing (it is required); {GIVE_A_ROLE}"),
    # the wrong type, a number or true/false in quotes told to leave them out
    ("/v1/chat/completions", {"model": 5, "messages": [HI]}, "model", "invalid_type",
     f"model: 5 is not text (a JSON string); {GIVE_A_MODEL}"),
    ("/v1/chat/completions", {"model": "{model}", "messages": [HI], "max_tokens": 1.5}, "max_tokens", "invalid_type",
     "max_tokens: 1.5 is not a whole number; give a whole number from 1 to 8192"),
    ("/v1/chat/completions", {"model": "{model}", "messages": [HI], "temperature": "0.5"}, "temperature",
     "invalid_type", 'temperature: "0.5" is text (in quotes), not a number; give a number from 0 to 2, without quotes'),
    ("/v1/chat/completions", {"model": "{model}", "messages": [HI], "stream": "yes"}, "stream", "invalid_type",
     'stream: "yes" is not true or false; give true or false'),
    ("/v1/completions", {"model": "{model}", "prompt": "x", "echo": "false"}, "echo", "invalid_type",
     'echo: "false" is text (in quotes), not true or false; give true or false, without quotes'),
    ("/v1/chat/completions", {"model": "{model}", "messages": "hi"}, "messages", "invalid_type",
     f'messages: "hi" is not a JSON array; {GIVE_MESSAGES}'),
    ("/v1/chat/completions", {"model": "{model}", "messages": [HI], "tool_choice": 5}, "tool_choice", "invalid_type",
     'tool_choice: 5 is not text (a JSON string) or a JSON object; give "none" (the answers here are text only, the '
     "model is not asked to call tools), or leave tool_choice out"),
    ("/v1/chat/completions", {"model": "{model}", "messages": [HI], "response_format": "json"}, "response_format",
     "invalid_type",
     'response_format: "json" is not a JSON object; give {"type": "text"}, or leave response_format out'),
    ("/v1/chat/completions", {"model": "{model}", "messages": [HI], "logit_bias": {"5": "x"}}, 'logit_bias["5"]',
     "invalid_type", 'logit_bias["5"]: "x" is not a number; give a number from -100 to 100'),
    ("/v1/chat/completions", {"model": "{model}", "messages": [HI], "top_logprobs": 1.5}, "top_logprobs",
     "invalid_type", "top_logprobs: 1.5 is not a whole number; give a whole number from 0 to 20"),
    ("/v1/completions", {"model": "{model}", "prompt": "x", "logprobs": "2"}, "logprobs", "invalid_type",
     'logprobs: "2" is text (in quotes), not a whole number; give a whole number from 0 to 5, without quotes'),
    # out of range: the field's whole range
    ("/v1/chat/completions", {"model": "{model}", "messages": [HI], "temperature": 3}, "temperature", "invalid_value",
     "temperature: 3 is too large; give a number from 0 to 2"),
    ("/v1/chat/completions", {"model": "{model}", "messages": [HI], "top_p": 0}, "top_p", "invalid_value",
     "top_p: 0 is too small; give a number above 0 and at most 1"),
    ("/v1/chat/completions", {"model": "{model}", "messages": [HI], "max_completion_tokens": 0},
     "max_completion_tokens", "invalid_value",
     "max_completion_tokens: 0 is too small; give a whole number from 1 to 8192"),
    ("/v1/chat/completions", {"model": "{model}", "messages": [HI], "seed": 2**63}, "seed", "invalid_value",
     "seed: 9223372036854775808 is too large; give a whole number from -9223372036854775808 to 9223372036854775807"),
    ("/v1/chat/completions", {"model": "{model}", "messages": [HI], "n": 9}, "n", "invalid_value",
     "n: 9 is too large; give a whole number from 1 to 8 (the answers to sample, a choice each), or leave n out"),
    ("/v1/completions", {"model": "{model}", "prompt": "x", "n": 0}, "n", "invalid_value",
     "n: 0 is too small; give a whole number from 1 to 8 (the answers to sample, a choice each), or leave n out"),
    ("/v1/completions", {"model": "{model}", "prompt": ["x"] * 5, "n": 8}, "prompt", "invalid_value",
     "prompt: 5 prompts with n 8 ask for 40 choices; ask for at most 32 (fewer prompts, or a smaller n)"),
    ("/v1/chat/completions", {"model": "{model}", "messages": [HI], "temperature": float("nan")}, "temperature",
     "invalid_value", "temperature: NaN is not a finite number; give a number from 0 to 2"),
    ("/v1/chat/completions", {"model": "{model}", "messages": []}, "messages", "invalid_value",
     f"messages: [] is too short; {GIVE_MESSAGES}"),
    # a value outside those taken
    ("/v1/chat/completions", {"model": "{model}", "messages": [HI, {"role": "robot", "content": "x"}]},
     "messages[1].role", "invalid_value", f'messages[1].role: "robot" is not a value taken here; {GIVE_A_ROLE}'),
    # within a message, and within an object that is not a message
    ("/v1/chat/completions", {"model": "{model}", "messages": [HI, HI, {"role": "user", "content": 5}]},
     "messages[2].content", "invalid_type", "messages[2].content: 5 is not text (a JSON string); give the message's "
     'text: a string, or a JSON array of text parts {"type": "text", "text": ...}'),
    ("/v1/chat/completions", {"model": "{model}", "messages": [HI, "hi"]}, "messages[1]", "invalid_type",
     'messages[1]: "hi" is not a JSON object; give a JSON object {"role": ..., "content": ...}'),
    ("/v1/chat/completions", {"model": "{model}", "messages": [HI], "stream": True,
                              "stream_options": {"include_usage": 1}}, "stream_options.include_usage", "invalid_type",
     "stream_options.include_usage: 1 is not true or false; give true or false"),
])
def test_a_bad_body_is_refused_naming_the_field_what_was_wrong_and_what_to_give(api, path, body, param, code, message):
    """QA: bad bodies were answered in pydantic's words ("Input should be a valid integer", "Field required",
    "Input should be a valid dictionary or instance of _Message"), the field a Python location ("messages.2.content",
    "temperature.float" inside), with no word of what to send instead. Each is one translation
    (``openai_errors.body_problem``): the path as the client wrote it, what was wrong, what to give, and OpenAI's
    code for the kind of problem."""
    model, headers = api
    sent = {key: model.public_id if value == "{model}" else value for key, value in body.items()}
    response = post(path, sent, headers)
    assert response.status_code == 400, response.content
    assert response.json() == {"error": {"message": message, "type": "invalid_request_error", "param": param,
                                         "code": code}}


def test_a_field_these_answers_do_not_read_is_taken_and_left_unread(api, worker):
    """As the README says (OpenAI's clients send fields such as user that these answers do not use): an extra
    field is not a bad body."""
    model, headers = api
    scripts, requests = worker
    scripts.append(ANSWER)
    response = post("/v1/chat/completions", chat(model, user="u-1", messages=[{**HI, "name": "ann"}]), headers)
    assert response.status_code == 200, response.content
    assert requests[0]["messages"] == [HI]


@pytest.mark.parametrize("path,fields,param,meant", [
    ("/v1/chat/completions", {"temprature": 0.2}, "temprature", "temperature"),
    ("/v1/chat/completions", {"max_token": 5}, "max_token", "max_tokens"),
    ("/v1/chat/completions", {"top-p": 0.5}, "top-p", "top_p"),
    ("/v1/chat/completions", {"stop_sequences": ["\n"]}, "stop_sequences", "stop"),
    ("/v1/chat/completions", {"maxTokens": 5}, "maxTokens", "max_tokens"),
    ("/v1/chat/completions", {"Temperature": 0.2}, "Temperature", "temperature"),
    ("/v1/chat/completions", {"presense_penalty": 1}, "presense_penalty", "presence_penalty"),
    ("/v1/chat/completions", {"temperature": 0.2, "temprature": 0.2}, "temprature", "temperature"),
    ("/v1/chat/completions", {"stream": True, "stream_options": {"include-usage": True}},
     "stream_options.include-usage", "include_usage"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "contnet": "hi"}]}, "messages[0].contnet", "content"),
    ("/v1/completions", {"max_new_tokens": 5}, "max_new_tokens", "max_tokens"),
    ("/v1/completions", {"frequency-penalty": 1}, "frequency-penalty", "frequency_penalty"),
])
def test_a_misspelt_field_is_refused_naming_the_field_meant(api, worker, path, fields, param, meant):
    """A field the API does not read is ignored, so a misspelling of one it reads ("temprature", "max_token",
    "top-p", Anthropic's "stop_sequences") was answered with that field's default, the client none the wiser. A near
    miss of a field read (close, or the same name in another case or with - for _) is a 400 saying which was meant."""
    model, headers = api
    scripts, requests = worker
    scripts.append(ANSWER)  # what a body taken is answered with
    inputs = {"messages": CHAT["messages"]} if path == "/v1/chat/completions" else {"prompt": "x"}
    response = post(path, {"model": model.public_id, **inputs, **fields}, headers)
    assert response.status_code == 400, response.content
    assert response.json() == {"error": {
        "message": f"{param}: not a field read here; did you mean {meant}? (A field not read here is ignored: the "
                   "answer would have been made without it.)",
        "type": "invalid_request_error", "param": param, "code": "unknown_parameter"}}
    assert requests == []


def test_openai_fields_not_read_and_unrelated_ones_are_still_taken(api, worker):
    """The fields of OpenAI's API that Temper does not read, and those of other servers near a field read (vLLM's
    min_tokens), are no misspellings: "store" is as close to "stop" as "stops" is, and is answered."""
    model, headers = api
    scripts, requests = worker
    scripts += [ANSWER, ANSWER]
    fields = {"user": "u-1", "store": False, "metadata": {"a": "b"}, "service_tier": "auto", "min_tokens": 1,
              "parallel_tool_calls": False, "reasoning_effort": "low", "my_trace_id": "t-1", "system": "x"}
    response = post("/v1/chat/completions", chat(model, stream=True, stream_options={
        "include_usage": True, "include_obfuscation": False}, messages=[{**HI, "name": "ann"}], **fields), headers)
    assert response.status_code == 200, response.content
    response = post("/v1/completions", {"model": model.public_id, "prompt": "x", "suffix": "!", "best_of": 1,
                                        **fields}, headers)
    assert response.status_code == 200, response.content
    assert [request["temperature"] for request in requests] == [1.0, 1.0]


MISSPELT = "not a field read here; did you mean {}? (A field not read here is ignored: the answer would have been made without it.)"


@pytest.mark.parametrize("path,body,param,code,lines", [
    # a misspelling, then the fields in the schema's order; stream_options is not told "only when stream is true"
    # for a stream itself refused, nor tools "tool_choice: none" for a tool_choice refused
    ("/v1/chat/completions", {"max_token": 5, "messages": [HI, {"role": "robot", "content": "x"}], "temperature": 3,
                              "stream": "yes", "stream_options": {"include_usage": True}, "tool_choice": 5,
                              "tools": [{"type": "function"}]},
     "max_token", "unknown_parameter",
     ["max_token: " + MISSPELT.format("max_tokens"), f"model: missing (it is required); {GIVE_A_MODEL}",
      "temperature: 3 is too large; give a number from 0 to 2", 'stream: "yes" is not true or false; give true or false',
      f'messages[1].role: "robot" is not a value taken here; {GIVE_A_ROLE}',
      'tool_choice: 5 is not text (a JSON string) or a JSON object; give "none" (the answers here are text only, the '
      "model is not asked to call tools), or leave tool_choice out"]),
    # a value no member of a union takes is one problem; a field missing through its misspelling is the misspelling
    ("/v1/chat/completions", {"model": "{model}", "messages": [{"role": "user", "contnet": "hi"}, {"role": "user"}],
                              "temperature": "0.5", "chat_template_kwargs": {"enable_thinking": [False]}},
     "temperature", "invalid_type",
     ['temperature: "0.5" is text (in quotes), not a number; give a number from 0 to 2, without quotes',
      "messages[0].contnet: " + MISSPELT.format("content"),
      'messages[1].content: missing (it is required); give the message\'s text: a string, or a JSON array of text '
      'parts {"type": "text", "text": ...}',
      'chat_template_kwargs["enable_thinking"]: [false] is not text (a JSON string) or a number or true or false; '
      "give a JSON scalar: a string, a number, true/false or null"]),
    ("/v1/completions", {"model": "{model}", "prompt": 5, "max_tokens": 0, "echo": "yes"},
     "max_tokens", "invalid_value",
     [f"max_tokens: {openai_api.NOTHING_TO_GENERATE}",
      f"prompt: give {openai_api.PROMPT_FORMS}",
      'echo: "yes" is not true or false; give true or false']),
])
def test_every_problem_of_a_bad_body_is_said_at_once(api, worker, path, body, param, code, lines):
    """Only the first problem of a body was said: a client mended it, sent the body again and was told the next one,
    a request per problem. OpenAI's error is one object: its message says every problem, a line each, and param and
    code are the first one's."""
    model, headers = api
    scripts, requests = worker
    sent = {key: model.public_id if value == "{model}" else value for key, value in body.items()}
    response = post(path, sent, headers)
    assert response.status_code == 400, response.content
    assert response.json() == {"error": {"message": "\n".join(lines), "type": "invalid_request_error", "param": param,
                                         "code": code}}
    assert requests == []


def test_a_misspelt_field_sent_as_null_is_a_field_left_out(api, worker):
    """null is a field not sent (OpenAI's schema marks optional fields nullable), misspelt or not: it changes no
    answer."""
    model, headers = api
    scripts, requests = worker
    scripts.append(ANSWER)
    response = post("/v1/chat/completions", chat(model, temprature=None), headers)
    assert response.status_code == 200, response.content


@pytest.mark.parametrize("method,path,allowed", [
    ("get", "/v1/chat/completions", "POST"),
    ("put", "/v1/completions", "POST"),
    ("post", "/v1/models", "GET"),
    ("delete", "/v1/models/bm_x", "GET"),
])
def test_a_wrong_method_gets_the_allow_header_and_an_openai_error(db, method, path, allowed):
    """A 405 came without the Allow header HTTP requires on it (RFC 9110, 15.5.6), and said only "use GET"."""
    response = getattr(Client(), method)(path)
    assert response.status_code == 405 and response["Allow"] == allowed
    assert response.json() == {"error": {"message": f"{method.upper()} is not allowed here; use {allowed}",
                                         "type": "invalid_request_error", "param": None, "code": "method_not_allowed"}}


def test_a_body_that_is_not_an_object_or_too_large_gets_a_json_error(api, settings):
    model, headers = api
    response = post("/v1/chat/completions", "[1, 2]", headers)
    assert response.status_code == 400 and response.json()["error"]["message"] == "the body must be a JSON object"
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000  # (10 MiB by default) was answered with an HTML page
    response = post("/v1/completions", {"model": model.public_id, "prompt": "x" * 2000}, headers)
    assert response.status_code == 413 and response["Content-Type"] == "application/json"
    assert response.json()["error"]["code"] == "request_too_large"


def test_a_number_of_5000_digits_gets_a_json_error_not_a_server_error(api):
    """json.loads raises a ValueError (Python's limit on integer digits) that was not caught: a 500."""
    model, headers = api
    body = json.dumps(chat(model)).replace('"hi"}]', '"hi"}], "seed": ' + "9" * 5000)
    response = post("/v1/chat/completions", body, headers)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "the body cannot be read: a number has more digits than any field takes (over 4,300)"


def test_the_bearer_scheme_is_case_insensitive(api):
    model, headers = api
    secret = headers["HTTP_AUTHORIZATION"].split(" ", 1)[1]
    assert Client().get("/v1/models", HTTP_AUTHORIZATION=f"bearer {secret}").status_code == 200
    assert Client().get("/v1/models", HTTP_AUTHORIZATION=f"BEARER  {secret} ").status_code == 200
    assert Client().get("/v1/models", HTTP_AUTHORIZATION=f"Basic {secret}").status_code == 401


def stream(path, body, headers):
    async def collect():
        response = await AsyncClient().post(path, json.dumps(body), content_type="application/json",
                                            headers={"Authorization": headers["HTTP_AUTHORIZATION"]})
        if not response.streaming:
            return response.status_code, response.json()
        return response.status_code, [chunk.decode() async for chunk in response.streaming_content]
    return async_to_sync(collect)()


CONTEXT_ERROR = {"type": "error", "code": "context_length_exceeded",
                 "message": "the prompt (10 tokens) plus the tokens to generate (8192) exceeds the model's context"}


def test_a_streamed_request_the_model_refuses_gets_a_400_not_a_stream(api, worker):
    """It was a 200 stream with a server_error chunk, which the openai client raises as a bare APIError."""
    model, headers = api
    scripts, _requests = worker
    scripts += [[{"type": "status", "message": "loading the model"}, CONTEXT_ERROR], [CONTEXT_ERROR]]
    status, body = stream("/v1/chat/completions", chat(model, stream=True, max_tokens=8192), headers)
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    assert body["error"]["message"] == CONTEXT_ERROR["message"]
    whole = post("/v1/chat/completions", chat(model, max_tokens=8192), headers)
    assert whole.status_code == 400 and whole.json()["error"]["code"] == "context_length_exceeded"


def test_a_blank_user_message_is_answered_as_openai_answers_it(api, worker):
    """OpenAI's API answers a user message of white space (or none at all) like any other, and so does this one:
    the request reaches the model as sent, nothing is refused by the web and nothing fails there. (The chat
    page, whose person can type again, refuses a blank turn: ``services.check_turn_text``.)"""
    model, headers = api
    scripts, requests = worker
    scripts.append([{"type": "token", "text": "Hello"},
                    {"type": "done", "text": "Hello", "finish_reason": "stop", "prompt_tokens": 4, "completion_tokens": 1}])
    response = post("/v1/chat/completions", chat(model, messages=[{"role": "user", "content": "  \n "}]), headers)
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == "Hello"
    assert requests[0]["messages"] == [{"role": "user", "content": "  \n "}]


def test_chunks_name_the_role_once_and_usage_only_when_asked(api, worker):
    model, headers = api
    scripts, _requests = worker
    events = [{"type": "token", "text": ""}, {"type": "token", "text": "Hel"}, {"type": "token", "text": "lo"},
              {"type": "done", "text": "Hello", "finish_reason": "length", "prompt_tokens": 5, "completion_tokens": 2}]
    scripts += [events, events]
    status, lines = stream("/v1/chat/completions", chat(model, stream=True), headers)
    assert status == 200 and lines[-1] == "data: [DONE]\n\n"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert [chunk["choices"][0]["delta"] for chunk in chunks] == [
        {"role": "assistant", "content": "Hel"}, {"content": "lo"}, {}]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and all("usage" not in chunk for chunk in chunks)
    status, lines = stream("/v1/chat/completions", chat(model, stream=True, stream_options={"include_usage": True}),
                           headers)
    usage = json.loads(lines[-2].removeprefix("data: "))
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}


def test_a_client_that_goes_away_stops_its_generation(api, worker):
    """A client that disconnected left its generation running to its end, holding a place in the batch."""
    client = redis_client()
    channels.emit(client, "cmpl-gone", {"seq": 0, "type": "token", "text": "Hel"})

    async def read_one_chunk_and_leave():
        events = openai_api._events("cmpl-gone")
        first = await openai_api._first_output(events)
        chunks = openai_api._stream([("cmpl-gone", first, events)],
                                    lambda index, text, reason, logprobs=None: {"text": text},
                                    include_usage=False)
        assert await anext(chunks) == 'data: {"text": "Hel"}\n\n'
        await chunks.aclose()  # what Django does with the response's iterator when the client disconnects

    async_to_sync(read_one_chunk_and_leave)()
    assert client.exists(channels.stop_key("cmpl-gone"))

    async def wait_and_be_cancelled():
        waiting = asyncio.ensure_future(openai_api._final("cmpl-waiting"))
        await asyncio.sleep(0.3)
        waiting.cancel()  # what Django does with an async view when the client disconnects
        with pytest.raises(asyncio.CancelledError):
            await waiting

    async_to_sync(wait_and_be_cancelled)()
    assert client.exists(channels.stop_key("cmpl-waiting"))
    # A stream read to its end stops nothing.
    channels.emit(client, "cmpl-done", {"seq": 0, "type": "done", "text": "", "finish_reason": "stop"})
    async_to_sync(openai_api._final)("cmpl-done")
    assert not client.exists(channels.stop_key("cmpl-done"))


def test_a_model_is_retrieved_by_its_id_with_when_it_was_made(api):
    """GET /v1/models/{id} was a 404, so the openai client's models.retrieve failed; created was 0."""
    model, headers = api
    listed = Client().get("/v1/models", **headers).json()["data"]
    assert [entry["created"] for entry in listed] == [int(model.created_at.timestamp())]
    one = Client().get(f"/v1/models/{model.public_id}", **headers)
    assert one.status_code == 200 and one.json() == listed[0]
    missing = Client().get("/v1/models/bm_nothing", **headers)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert Client().get(f"/v1/models/{model.public_id}").status_code == 401


def test_a_token_whose_user_is_now_a_viewer_is_told_so_not_to_send_a_token(api, team):
    """QA: bob, demoted to viewer, got 401 'send Authorization: Bearer <token> with a project token (tpk_…)'
    for the tpk_ token he had sent."""
    from webapp.projects.models import Membership

    model, headers = api
    Membership.objects.filter(project=team.project, user=team.teammate).update(role="viewer")
    for response in (post("/v1/chat/completions", chat(model), headers), Client().get("/v1/models", **headers)):
        assert response.status_code == 403
        error = response.json()["error"]
        assert error["code"] == "insufficient_role" and "is now a viewer of alpha" in error["message"], error
    assert post("/v1/chat/completions", chat(model), {"HTTP_AUTHORIZATION": "Bearer tpk_nothing"}).status_code == 401


ANSWER = [{"type": "token", "text": "Hi"},
          {"type": "done", "text": "Hi", "finish_reason": "stop", "prompt_tokens": 4, "completion_tokens": 1}]


def test_an_empty_stop_list_means_no_stop_sequence(api, worker):
    """QA: "stop": [] (which OpenAI's and vLLM's servers take as no stop sequence) was a 500 with an HTML page:
    the lone-surrogate check read the last of no texts."""
    model, headers = api
    scripts, requests = worker
    scripts += [ANSWER, ANSWER]
    for path, body in (("/v1/chat/completions", chat(model, stop=[])),
                       ("/v1/completions", {"model": model.public_id, "prompt": "x", "stop": []})):
        response = post(path, body, headers)
        assert response.status_code == 200, response.content
    assert [request["stop"] for request in requests] == [[], []]


def test_a_seed_is_any_64_bit_integer_and_each_gives_its_own_draws(api, worker):
    """OpenAI's API takes a seed of 64 bits, negative ones too; a seed from 2**32 or below 0 was a 400. The engine
    draws from 32 bits: a seed in [0, 2**32) is passed as it is, any other is folded by a hash, so the same seed
    draws the same and 2**32 does not draw as 0 does."""
    model, headers = api
    scripts, requests = worker
    seeds = [0, 7, 2**32 - 1, 2**32, 2**32 + 7, 2**40, -1, -7, 2**63 - 1, -2**63]
    for seed in seeds + seeds:
        scripts.append(ANSWER)
        response = post("/v1/chat/completions", chat(model, seed=seed), headers)
        assert response.status_code == 200, response.content
    sent = [request["seed"] for request in requests]
    assert sent[:3] == [0, 7, 2**32 - 1]
    assert sent[:len(seeds)] == sent[len(seeds):]
    assert len(set(sent[:len(seeds)])) == len(seeds)
    assert all(0 <= seed < 2**32 for seed in sent)  # what the serve worker takes (GenerateRequest.seed)
    for seed in (2**63, -2**63 - 1):
        response = post("/v1/chat/completions", chat(model, seed=seed), headers)
        assert response.status_code == 400 and response.json()["error"]["param"] == "seed"
        assert response.json()["error"]["message"] == (
            f"seed: {seed} is too {'large' if seed > 0 else 'small'}; give a whole number from -9223372036854775808 "
            "to 9223372036854775807")


def test_penalties_and_logit_bias_are_sent_to_the_serve_worker(api, worker):
    """frequency_penalty, presence_penalty and logit_bias were accepted and dropped: the answer was the
    unpenalized one. Both endpoints send them with the request."""
    model, headers = api
    scripts, requests = worker
    fields = {"frequency_penalty": 1.5, "presence_penalty": -0.5, "logit_bias": {"5": -100, "17": 2.5}}
    scripts += [ANSWER, ANSWER]
    assert post("/v1/chat/completions", chat(model, **fields), headers).status_code == 200
    assert post("/v1/completions", {"model": model.public_id, "prompt": "x", **fields}, headers).status_code == 200
    for request in requests:
        assert (request["frequency_penalty"], request["presence_penalty"], request["logit_bias"]) == (
            1.5, -0.5, {5: -100.0, 17: 2.5})


@pytest.mark.parametrize("fields,message,param", [
    ({"frequency_penalty": 2.5}, "frequency_penalty: 2.5 is too large; give a number from -2 to 2",
     "frequency_penalty"),
    ({"presence_penalty": -3}, "presence_penalty: -3 is too small; give a number from -2 to 2", "presence_penalty"),
    ({"logit_bias": {"abc": 1}}, "logit_bias: 'abc' is not a token id", "logit_bias"),
    ({"logit_bias": {"-5": 1}}, "logit_bias: '-5' is not a token id", "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias: the bias of token 5 is 101; give a number from -100 to 100",
     "logit_bias"),
    ({"logit_bias": {str(token_id): 1 for token_id in range(1025)}}, "logit_bias: 1025 tokens; give at most 1024",
     "logit_bias"),
])
def test_bad_penalties_and_logit_bias_are_named(api, fields, message, param):
    model, headers = api
    response = post("/v1/chat/completions", chat(model, **fields), headers)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["message"].startswith(message) and error["param"] == param, error


OPTIONAL_FIELDS = ("max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stream",
                   "stream_options", "n", "stop", "logprobs", "top_logprobs", "response_format", "tools",
                   "tool_choice", "functions", "function_call", "presence_penalty", "frequency_penalty", "logit_bias")


def test_null_is_a_field_left_out(api, worker):
    """QA: OpenAI's API takes null for each optional field (its schema marks them nullable), and clients send it
    (a None left in a request's arguments, LangChain's "n": null): "temperature": null was a 400 "Input should
    be a valid number", "stream": null "a valid boolean", "n": null "a valid integer"."""
    model, headers = api
    scripts, requests = worker
    scripts += [ANSWER, ANSWER]
    nulls = dict.fromkeys(OPTIONAL_FIELDS)
    response = post("/v1/chat/completions", chat(model, **nulls), headers)
    assert response.status_code == 200, response.content
    assert response.json()["choices"][0]["message"]["content"] == "Hi"
    response = post("/v1/completions", {"model": model.public_id, "prompt": "x", "echo": None, "best_of": None,
                                        **nulls}, headers)
    assert response.status_code == 200, response.content
    for request in requests:  # each as if the field had not been sent
        assert (request["max_new_tokens"], request["temperature"], request["top_p"], request["top_k"],
                request["stop"]) == (None, 1.0, 1.0, 0, [])
    # A required field sent as null is still refused, naming it.
    response = post("/v1/chat/completions", {**chat(model), "model": None}, headers)
    assert response.status_code == 400 and response.json()["error"]["param"] == "model"


def some_input(path: str) -> dict:
    """The messages (chat completions) or the prompt (completions) of a request to ``path``."""
    return {"messages": CHAT["messages"]} if path == "/v1/chat/completions" else {"prompt": "x"}


def assert_refused_as_unsupported(api, path: str, fields: dict, param: str) -> None:
    """A request to ``path`` with ``fields`` is a 400 naming ``param`` as asking for what these answers do not serve."""
    model, headers = api
    response = post(path, {"model": model.public_id, **some_input(path), **fields}, headers)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["param"] == param and error["code"] == "unsupported_value", error
    assert error["message"].startswith(f"{param}: ") and "not supported" in error["message"], error


def token_logprobs(token: str, logprob: float, *alternatives: tuple[str, float]) -> dict:
    """A token's entry as the serve worker's events carry it (``worker.tasks.serve.logprobs_json``)."""
    def named(text, value):
        return {"token": text, "bytes": list(text.encode()), "logprob": value}

    return {**named(token, logprob), "top_logprobs": [named(text, value) for text, value in alternatives]}


HEL = token_logprobs("Hel", -0.25, ("Hel", -0.25), ("He", -1.5))
LO = token_logprobs("lo", -0.5, ("lo", -0.5), ("p", -2.0))
NUL = token_logprobs("bytes:\\xe2", -3.0, ("bytes:\\xe2", -3.0), ("!", -3.5))  # part of a character: no text yet
WITH_LOGPROBS = [{"type": "token", "text": "Hel", "tokens": 1, "logprobs": [HEL]},
                 {"type": "token", "text": "lo", "tokens": 2, "logprobs": [LO, NUL]},
                 {"type": "token", "text": "", "tokens": 1, "logprobs": [NUL]},
                 {"type": "done", "text": "Hello", "finish_reason": "length", "prompt_tokens": 3,
                  "completion_tokens": 4, "logprobs": [HEL, LO, NUL, NUL]}]


def test_chat_logprobs_are_each_tokens_and_its_alternatives_whole_and_streamed(api, worker):
    model, headers = api
    scripts, requests = worker
    scripts += [WITH_LOGPROBS, WITH_LOGPROBS]
    response = post("/v1/chat/completions", chat(model, logprobs=True, top_logprobs=2), headers)
    assert response.status_code == 200, response.content
    [answer] = response.json()["choices"]
    assert answer["logprobs"] == {"content": [HEL, LO, NUL, NUL], "refusal": None}
    assert requests[-1]["logprobs"] == 2
    status, lines = stream("/v1/chat/completions", chat(model, logprobs=True, top_logprobs=2, stream=True), headers)
    assert status == 200 and requests[-1]["logprobs"] == 2
    chunks = [json.loads(line.removeprefix("data: "))["choices"][0] for line in lines[:-1]]
    # A chunk per token event, the one whose token has no text yet too, so that no token's log probability is lost.
    assert [(chunk["delta"], chunk["logprobs"]) for chunk in chunks] == [
        ({"role": "assistant", "content": "Hel"}, {"content": [HEL], "refusal": None}),
        ({"content": "lo"}, {"content": [LO, NUL], "refusal": None}),
        ({}, {"content": [NUL], "refusal": None}),
        ({}, None)]


def test_each_of_n_choices_carries_its_own_answers_logprobs(api, worker):
    """n and logprobs together: each choice's logprobs are its own answer's, whole and streamed."""
    model, headers = api
    scripts, requests = worker
    other = [{"type": "token", "text": "lo", "tokens": 1, "logprobs": [LO]},
             {"type": "done", "text": "lo", "finish_reason": "length", "prompt_tokens": 3, "completion_tokens": 1,
              "logprobs": [LO]}]
    scripts += [WITH_LOGPROBS, other]
    response = post("/v1/chat/completions", chat(model, n=2, logprobs=True, top_logprobs=2), headers)
    assert response.status_code == 200, response.content
    assert requests[-1]["n"] == 2 and requests[-1]["logprobs"] == 2
    assert [(choice["index"], choice["logprobs"]) for choice in response.json()["choices"]] == [
        (0, {"content": [HEL, LO, NUL, NUL], "refusal": None}), (1, {"content": [LO], "refusal": None})]
    scripts += [WITH_LOGPROBS, other]
    status, lines = stream("/v1/chat/completions", chat(model, n=2, logprobs=True, top_logprobs=2, stream=True),
                           headers)
    assert status == 200
    streamed = {0: [], 1: []}
    for line in lines[:-1]:
        for choice in json.loads(line.removeprefix("data: "))["choices"]:
            streamed[choice["index"]] += (choice["logprobs"] or {}).get("content", [])
    assert streamed == {0: [HEL, LO, NUL, NUL], 1: [LO]}


def test_logprobs_true_alone_asks_for_no_alternatives(api, worker):
    model, headers = api
    scripts, requests = worker
    scripts.append(ANSWER)
    assert post("/v1/chat/completions", chat(model, logprobs=True), headers).status_code == 200
    assert requests[-1]["logprobs"] == 0


def test_an_answer_asked_without_logprobs_carries_none(api, worker):
    model, headers = api
    scripts, requests = worker
    scripts += [ANSWER, ANSWER, ANSWER]
    for path, fields in (("/v1/chat/completions", {}), ("/v1/chat/completions", {"logprobs": False, "top_logprobs": 0}),
                         ("/v1/completions", {})):
        response = post(path, {"model": model.public_id, **some_input(path), **fields}, headers)
        assert response.status_code == 200 and response.json()["choices"][0]["logprobs"] is None
        assert "logprobs" not in requests[-1]


def test_completion_logprobs_are_openais_legacy_shape(api, worker):
    model, headers = api
    scripts, requests = worker
    scripts += [WITH_LOGPROBS, WITH_LOGPROBS]
    path, body = "/v1/completions", {"model": model.public_id, "prompt": "x", "logprobs": 2}
    response = post(path, body, headers)
    assert response.status_code == 200, response.content
    assert requests[-1]["logprobs"] == 2
    expected = {"tokens": ["Hel", "lo", "bytes:\\xe2", "bytes:\\xe2"], "token_logprobs": [-0.25, -0.5, -3.0, -3.0],
                "top_logprobs": [{"Hel": -0.25, "He": -1.5}, {"lo": -0.5, "p": -2.0},
                                 {"bytes:\\xe2": -3.0, "!": -3.5}, {"bytes:\\xe2": -3.0, "!": -3.5}],
                "text_offset": [0, 3, 5, 15]}
    assert response.json()["choices"][0]["logprobs"] == expected
    status, lines = stream(path, {**body, "stream": True}, headers)
    assert status == 200
    chunks = [json.loads(line.removeprefix("data: "))["choices"][0]["logprobs"] for line in lines[:-1]]
    # Each chunk's offsets go on from the tokens of the chunks before it.
    assert chunks[:3] == [{key: values[:1] for key, values in expected.items()},
                          {key: values[1:3] for key, values in expected.items()},
                          {key: values[3:] for key, values in expected.items()}]
    assert chunks[3] is None


# An echo's prompt event (the serve worker's ``echo_fields``): the prompt "x y" of three tokens, the first with no
# log probability (nothing predicts it).
X = {**token_logprobs("x", 0.0), "logprob": None, "top_logprobs": None}
SPACE = token_logprobs(" ", -1.25, (" ", -1.25), ("z", -2.0))
Y = token_logprobs("y", -4.0, ("q", -0.5), ("y", -4.0))
PROMPT_EVENT = {"type": "prompt", "text": "x y", "tokens": 3, "logprobs": [X, SPACE, Y]}
ECHOED = [PROMPT_EVENT, *WITH_LOGPROBS[:-1],
          {**WITH_LOGPROBS[-1], "prompt_text": "x y", "prompt_logprobs": [X, SPACE, Y]}]
ECHOED_LOGPROBS = {"tokens": ["x", " ", "y", "Hel", "lo", "bytes:\\xe2", "bytes:\\xe2"],
                   "token_logprobs": [None, -1.25, -4.0, -0.25, -0.5, -3.0, -3.0],
                   "top_logprobs": [None, {" ": -1.25, "z": -2.0}, {"q": -0.5, "y": -4.0}, {"Hel": -0.25, "He": -1.5},
                                    {"lo": -0.5, "p": -2.0}, {"bytes:\\xe2": -3.0, "!": -3.5},
                                    {"bytes:\\xe2": -3.0, "!": -3.5}],
                   "text_offset": [0, 1, 2, 3, 6, 8, 18]}


def test_echo_puts_the_prompt_and_its_logprobs_before_the_answers_whole_and_streamed(api, worker):
    """echo: true was refused. The prompt's text comes before the answer's in the choice's text, and with logprobs
    its tokens' entries before the answer's (the first token's log probability and alternatives null, as OpenAI's
    and vLLM's echo give them), the text offsets going on from the prompt's tokens into the answer's; streamed, the
    prompt comes first, in a chunk of its own. The usage counts the prompt's tokens once, and the answer's."""
    model, headers = api
    scripts, requests = worker
    scripts += [ECHOED, ECHOED]
    body = {"model": model.public_id, "prompt": "x y", "echo": True, "logprobs": 2, "max_tokens": 4}
    response = post("/v1/completions", body, headers)
    assert response.status_code == 200, response.content
    assert requests[-1]["echo"] is True and requests[-1]["logprobs"] == 2 and requests[-1]["prompt"] == "x y"
    [choice] = response.json()["choices"]
    assert choice["text"] == "x yHello" and choice["logprobs"] == ECHOED_LOGPROBS
    assert response.json()["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    status, lines = stream("/v1/completions", {**body, "stream": True}, headers)
    assert status == 200
    chunks = [json.loads(line.removeprefix("data: "))["choices"][0] for line in lines[:-1]]
    assert [chunk["text"] for chunk in chunks] == ["x y", "Hel", "lo", "", ""]
    streamed = {key: [value for chunk in chunks if chunk["logprobs"] for value in chunk["logprobs"][key]]
                for key in ECHOED_LOGPROBS}
    assert streamed == ECHOED_LOGPROBS
    assert chunks[0]["logprobs"]["tokens"] == ["x", " ", "y"] and chunks[-1]["finish_reason"] == "length"


def test_echo_without_logprobs_is_the_prompt_and_the_answer(api, worker):
    model, headers = api
    scripts, requests = worker
    prompt_alone = {"type": "prompt", "text": "x y", "tokens": 3}
    echoed = [prompt_alone, *ANSWER[:-1], {**ANSWER[-1], "prompt_text": "x y"}]
    scripts += [echoed, echoed]
    body = {"model": model.public_id, "prompt": "x y", "echo": True}
    response = post("/v1/completions", body, headers)
    assert response.status_code == 200, response.content
    assert "logprobs" not in requests[-1]
    assert [(choice["text"], choice["logprobs"]) for choice in response.json()["choices"]] == [("x yHi", None)]
    status, lines = stream("/v1/completions", {**body, "stream": True}, headers)
    assert [json.loads(line.removeprefix("data: "))["choices"][0]["text"] for line in lines[:-1]] == ["x y", "Hi", ""]


def test_echo_of_no_new_tokens_is_the_prompt_scored_and_max_tokens_0_is_refused_without_it(api, worker):
    """max_tokens 0 with echo is how a client scores text (lm-evaluation-harness, OpenAI's own echo): the prompt and
    its log probabilities alone, finished by its length, no completion token counted. Without echo it would answer
    nothing, and is refused as vLLM refuses it, naming max_tokens."""
    model, headers = api
    scripts, requests = worker
    scored = [PROMPT_EVENT, {"type": "done", "text": "", "finish_reason": "length", "prompt_tokens": 3,
                             "completion_tokens": 0, "logprobs": [], "prompt_text": "x y",
                             "prompt_logprobs": [X, SPACE, Y]}]
    scripts += [scored, scored]
    body = {"model": model.public_id, "prompt": "x y", "echo": True, "logprobs": 2, "max_tokens": 0,
            "temperature": 0}
    response = post("/v1/completions", body, headers)
    assert response.status_code == 200, response.content
    assert requests[-1]["max_new_tokens"] == 0
    [choice] = response.json()["choices"]
    prompt_only = {key: values[:3] for key, values in ECHOED_LOGPROBS.items()}
    assert (choice["text"], choice["logprobs"], choice["finish_reason"]) == ("x y", prompt_only, "length")
    assert response.json()["usage"] == {"prompt_tokens": 3, "completion_tokens": 0, "total_tokens": 3}
    status, lines = stream("/v1/completions", {**body, "stream": True}, headers)
    chunks = [json.loads(line.removeprefix("data: "))["choices"][0] for line in lines[:-1]]
    assert [(chunk["text"], chunk["logprobs"], chunk["finish_reason"]) for chunk in chunks] == [
        ("x y", prompt_only, None), ("", None, "length")]
    sent = len(requests)
    for fields in ({"echo": False}, {"echo": None}, {}):
        refused = post("/v1/completions", {**body, "echo": True, **fields} if fields else
                       {key: value for key, value in body.items() if key != "echo"}, headers)
        assert refused.status_code == 400, refused.content
        assert refused.json()["error"] == {"message": f"max_tokens: {openai_api.NOTHING_TO_GENERATE}",
                                           "type": "invalid_request_error", "param": "max_tokens",
                                           "code": "invalid_value"}
    assert len(requests) == sent
    refused = post("/v1/completions", {**body, "max_tokens": -1}, headers)
    assert refused.json()["error"]["message"] == "max_tokens: -1 is too small; give a whole number from 0 to 8192"
    chat_refused = post("/v1/chat/completions", chat(model, max_tokens=0), headers)  # nothing echoed there
    assert chat_refused.json()["error"]["message"] == "max_tokens: 0 is too small; give a whole number from 1 to 8192"


def test_each_choice_of_a_list_of_prompts_echoes_its_own_prompt(api, worker):
    """Prompt p's answer i is choice p * n + i: it begins with prompt p, and its log probabilities with p's tokens."""
    model, headers = api
    scripts, requests = worker

    def answer(prompt: str, choice: int, entry: dict) -> list[dict]:
        first = {**token_logprobs(prompt, 0.0), "logprob": None, "top_logprobs": None}
        return [{"type": "prompt", "text": prompt, "tokens": 1, "logprobs": [first]},
                {"type": "token", "text": "!", "tokens": 1, "logprobs": [entry]},
                {"type": "done", "text": "!", "finish_reason": "length", "prompt_tokens": 1, "completion_tokens": 1,
                 "logprobs": [entry], "prompt_text": prompt, "prompt_logprobs": [first], "choice": choice}]

    bang, dot = token_logprobs("!", -0.5), token_logprobs("!", -1.5)
    scripts += [answer("a", 0, bang), answer("a", 1, dot), answer("b", 0, bang), answer("b", 1, dot)]
    response = post("/v1/completions", {"model": model.public_id, "prompt": ["a", "b"], "n": 2, "echo": True,
                                        "logprobs": 0, "max_tokens": 1}, headers)
    assert response.status_code == 200, response.content
    assert [request["prompt"] for request in requests[-2:]] == ["a", "b"] and requests[-1]["n"] == 2
    assert [(choice["index"], choice["text"], choice["logprobs"]["tokens"], choice["logprobs"]["token_logprobs"],
             choice["logprobs"]["text_offset"]) for choice in response.json()["choices"]] == [
        (0, "a!", ["a", "!"], [None, -0.5], [0, 1]), (1, "a!", ["a", "!"], [None, -1.5], [0, 1]),
        (2, "b!", ["b", "!"], [None, -0.5], [0, 1]), (3, "b!", ["b", "!"], [None, -1.5], [0, 1])]
    assert response.json()["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}


@pytest.mark.parametrize("path,fields,param,message", [
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs",
     "top_logprobs: 21 is too large; give a whole number from 0 to 20"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": -1}, "top_logprobs",
     "top_logprobs: -1 is too small; give a whole number from 0 to 20"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs",
     "top_logprobs: 2 alternatives asked for without the tokens' log probabilities; send logprobs: true with it, or "
     "leave top_logprobs out"),
    ("/v1/completions", {"logprobs": 6}, "logprobs", "logprobs: 6 is too large; give a whole number from 0 to 5"),
    ("/v1/completions", {"logprobs": True}, "logprobs", "logprobs: true is not a whole number"),
])
def test_logprobs_past_openais_limits_are_refused(api, worker, path, fields, param, message):
    model, headers = api
    scripts, requests = worker
    response = post(path, {"model": model.public_id, **some_input(path), **fields}, headers)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["param"] == param and error["message"].startswith(message), error
    assert requests == []


TOOL = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}}}


@pytest.mark.parametrize("path,fields,param", [
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format"),
    ("/v1/completions", {"response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/chat/completions", {"tools": [TOOL]}, "tools"),
    ("/v1/chat/completions", {"tools": [TOOL], "tool_choice": "auto"}, "tool_choice"),
    ("/v1/chat/completions", {"tools": [TOOL], "tool_choice": "required"}, "tool_choice"),
    ("/v1/chat/completions", {"tool_choice": {"type": "function", "function": {"name": "weather"}}}, "tool_choice"),
    # The legacy names of tools and tool_choice, which OpenAI's API still takes: ignored, they were the same silence.
    ("/v1/chat/completions", {"functions": [TOOL["function"]]}, "functions"),
    ("/v1/chat/completions", {"functions": [TOOL["function"]], "function_call": "auto"}, "function_call"),
    ("/v1/chat/completions", {"function_call": {"name": "weather"}}, "function_call"),
])
def test_json_output_and_tool_calls_are_refused_not_ignored(api, worker, path, fields, param):
    """A client asking for JSON output or tool calls got free text and no error: it then failed parsing the
    answer as JSON, or waited for a tool call that never came. Each is a 400 naming the field."""
    assert_refused_as_unsupported(api, path, fields, param)


@pytest.mark.parametrize("fields", [
    {"response_format": {"type": "text"}},
    {"tools": [TOOL], "tool_choice": "none"},
    {"tools": [], "tool_choice": "none"},
    {"tools": []},
    {"functions": [TOOL["function"]], "function_call": "none"},
    {"functions": []},
])
def test_text_output_and_no_tool_call_are_answered(api, worker, fields):
    model, headers = api
    scripts, _requests = worker
    scripts.append(ANSWER)
    response = post("/v1/chat/completions", chat(model, **fields), headers)
    assert response.status_code == 200, response.content


def test_an_unknown_response_format_is_named(api):
    model, headers = api
    response = post("/v1/chat/completions", chat(model, response_format={"type": "xml"}), headers)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "response_format" and error["code"] == "invalid_value", error
    assert "'xml' is not one of 'text', 'json_object', 'json_schema'" in error["message"], error


def test_with_usage_asked_for_every_chunk_carries_usage_as_openai_sends_them(api, worker):
    """QA: with stream_options.include_usage, OpenAI's chunks before the last carry "usage": null (its documented
    shape, which typed clients read as a field that is always there); these chunks had no usage key."""
    model, headers = api
    scripts, _requests = worker
    scripts.append(ANSWER)
    status, lines = stream("/v1/completions", {"model": model.public_id, "prompt": "x", "stream": True,
                                               "stream_options": {"include_usage": True}}, headers)
    assert status == 200 and lines[-1] == "data: [DONE]\n\n"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert [chunk["usage"] for chunk in chunks] == [None, None, {"prompt_tokens": 4, "completion_tokens": 1,
                                                                 "total_tokens": 5}]
    assert [chunk["choices"][0]["finish_reason"] for chunk in chunks[:-1]] == [None, "stop"]


@pytest.mark.parametrize("method,path", [("get", "/v1/models"), ("get", "/v1/models/bm_x"),
                                         ("post", "/v1/chat/completions"), ("post", "/v1/completions")])
def test_a_401_names_the_scheme_to_authenticate_with(db, method, path):
    """QA: the /v1 401 came without the WWW-Authenticate header RFC 9110 requires on a 401 (the REST API's has it)."""
    response = getattr(Client(), method)(path, HTTP_AUTHORIZATION="Bearer tpk_revoked")
    assert response.status_code == 401 and response["WWW-Authenticate"] == 'Bearer realm="temper"'
    assert response.json()["error"]["code"] == "invalid_api_key"


def test_max_tokens_and_max_completion_tokens_that_differ_are_refused_naming_both(api, worker):
    """Both were taken and max_completion_tokens won without a word. OpenAI reads max_tokens as the older name of
    max_completion_tokens: the same number in both is one budget; two numbers are a 400 naming both."""
    model, headers = api
    scripts, requests = worker
    response = post("/v1/chat/completions", chat(model, max_tokens=100, max_completion_tokens=200), headers)
    assert response.status_code == 400 and response.json()["error"] == {
        "message": "max_completion_tokens: 200 is not max_tokens (100): max_tokens is the older name of "
                   "max_completion_tokens; send one of them", "type": "invalid_request_error",
        "param": "max_completion_tokens", "code": "invalid_value"}
    assert requests == []
    scripts.append(ANSWER)
    response = post("/v1/chat/completions", chat(model, max_tokens=100, max_completion_tokens=100), headers)
    assert response.status_code == 200 and requests[0]["max_new_tokens"] == 100


def completion_events(text: str, prompt_tokens: int) -> list[dict]:
    return [{"type": "token", "text": text}, {"type": "done", "text": text, "finish_reason": "stop",
                                               "prompt_tokens": prompt_tokens, "completion_tokens": 1}]


def test_a_list_of_prompts_gets_a_choice_per_prompt_in_order(api, worker):
    """A list of prompts was a 400 ("Input should be a valid string"); OpenAI's /v1/completions answers a choice per
    prompt, its index the prompt's place in the list, and the usage of them all."""
    model, headers = api
    scripts, requests = worker
    scripts += [completion_events("A", 3), completion_events("B", 5)]
    response = post("/v1/completions", {"model": model.public_id, "prompt": ["one", "two"], "max_tokens": 1}, headers)
    assert response.status_code == 200, response.content
    body = response.json()
    assert [request["prompt"] for request in requests] == ["one", "two"]
    assert len({request["id"] for request in requests}) == 2
    assert body["choices"] == [{"index": 0, "text": "A", "logprobs": None, "finish_reason": "stop"},
                               {"index": 1, "text": "B", "logprobs": None, "finish_reason": "stop"}]
    assert body["usage"] == {"prompt_tokens": 8, "completion_tokens": 2, "total_tokens": 10}
    # Streamed: each chunk names its prompt's index; the usage is of them all.
    scripts += [completion_events("A", 3), completion_events("B", 5)]
    status, lines = stream("/v1/completions", {"model": model.public_id, "prompt": ["one", "two"], "stream": True,
                                               "stream_options": {"include_usage": True}}, headers)
    assert status == 200 and lines[-1] == "data: [DONE]\n\n"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    by_index = {0: [], 1: []}
    for chunk in chunks[:-1]:
        (part,) = chunk["choices"]
        by_index[part["index"]].append((part["text"], part["finish_reason"]))
    assert by_index == {0: [("A", None), ("", "stop")], 1: [("B", None), ("", "stop")]}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {"prompt_tokens": 8, "completion_tokens": 2,
                                                                   "total_tokens": 10}
    # One string in a list is that string; what is not a list of strings is named.
    scripts.append(completion_events("A", 3))
    response = post("/v1/completions", {"model": model.public_id, "prompt": ["one"]}, headers)
    assert response.status_code == 200 and len(response.json()["choices"]) == 1
    for prompt, message in (([], "prompt: give at least one prompt (an empty list is none)"),
                            (["a", [1, 2]], "prompt: the list mixes lists and strings; give "
                                            f"{openai_api.PROMPT_FORMS}, not a mix"),
                            (["a"] * 33, "prompt: give at most 32 prompts")):
        response = post("/v1/completions", {"model": model.public_id, "prompt": prompt}, headers)
        assert response.status_code == 400 and response.json()["error"]["message"] == message, response.content


def test_a_prompt_of_token_ids_is_sent_as_its_ids_and_a_list_of_them_a_prompt_each(api, worker):
    """Token ids were refused ("token ids are not taken"): lm-evaluation-harness's local-completions sends them by
    default. A list of ids is one prompt, a list of lists a prompt each (a choice each, in order); each reaches the
    serve worker as its ids, not as text. An echo's text is the worker's (the ids' text: the web has none)."""
    model, headers = api
    scripts, requests = worker
    scripts += [completion_events("A", 3)]
    response = post("/v1/completions", {"model": model.public_id, "prompt": [5, 0, 7], "max_tokens": 1}, headers)
    assert response.status_code == 200, response.content
    assert [(request["prompt_token_ids"], "prompt" in request) for request in requests] == [([5, 0, 7], False)]
    GenerateRequest.model_validate({**requests[0], "model_path": "/m"})  # the worker takes it
    assert [choice["text"] for choice in response.json()["choices"]] == ["A"]
    scored = [[{"type": "prompt", "text": text, "tokens": 2},
               {"type": "done", "text": "", "finish_reason": "length", "prompt_tokens": 2, "completion_tokens": 0,
                "prompt_text": text}] for text in ("ab", "cd")]
    scripts += scored
    body = {"model": model.public_id, "prompt": [[1, 2], [3, 4]], "echo": True, "max_tokens": 0}
    response = post("/v1/completions", body, headers)
    assert response.status_code == 200, response.content
    assert [request["prompt_token_ids"] for request in requests[1:]] == [[1, 2], [3, 4]]
    assert [(choice["index"], choice["text"]) for choice in response.json()["choices"]] == [(0, "ab"), (1, "cd")]
    assert response.json()["usage"] == {"prompt_tokens": 4, "completion_tokens": 0, "total_tokens": 4}
    scripts += scored
    status, lines = stream("/v1/completions", {**body, "stream": True}, headers)
    assert status == 200
    texts = {json.loads(line.removeprefix("data: "))["choices"][0]["text"] for line in lines[:-1]}
    assert texts == {"ab", "cd", ""}


IDS_RANGE = "token ids are whole numbers from 0 to the model's vocabulary size less one"


@pytest.mark.parametrize("prompt,message", [
    ([[]], "prompt 0 is an empty list of token ids; give at least one token id"),
    ([[1], []], "prompt 1 is an empty list of token ids; give at least one token id"),
    ([5, -1], f"the token id at index 1, -1, is out of range; {IDS_RANGE}"),
    ([[5], [6, 7, -3]], f"the token id at index 2 of prompt 1, -3, is out of range; {IDS_RANGE}"),
    ([5, 2**40], f"the token id at index 1, {2**40}, is out of range; {IDS_RANGE}"),
    ([[5], [6, 7.5]], f"the item at index 1 of prompt 1, 7.5, is not a token id; {IDS_RANGE}"),
    ([[5], [True]], f"the item at index 0 of prompt 1, true, is not a token id; {IDS_RANGE}"),
    ([[5], ["6"]], f'the item at index 0 of prompt 1, "6", is not a token id; {IDS_RANGE}'),
    ([True, 5], "the item at index 0, true, is not a string, a token id or a list of token ids; give "
                f"{openai_api.PROMPT_FORMS}"),
    ([5, "a"], f"the list mixes strings and token ids; give {openai_api.PROMPT_FORMS}, not a mix"),
    ([[5], "a"], f"the list mixes lists and strings; give {openai_api.PROMPT_FORMS}, not a mix"),
    ([[5], 6], f"the list mixes lists and token ids; give {openai_api.PROMPT_FORMS}, not a mix"),
    ([[5]] * 33, "give at most 32 prompts"),
])
def test_it_rejects_a_prompt_of_token_ids_it_cannot_take_and_queues_nothing(api, worker, prompt, message):
    model, headers = api
    _scripts, requests = worker
    response = post("/v1/completions", {"model": model.public_id, "prompt": prompt}, headers)
    assert response.status_code == 400, response.content
    assert response.json()["error"] == {"message": f"prompt: {message}", "type": "invalid_request_error",
                                        "param": "prompt", "code": "invalid_value"}
    assert requests == []


def test_prompts_of_token_ids_times_n_are_bounded_as_a_list_of_strings(api, worker):
    model, headers = api
    _scripts, requests = worker
    one_prompt = openai_api.CompletionBody.model_validate({"model": "m", "prompt": list(range(40)), "n": 8})
    assert one_prompt.prompts == [list(range(40))]  # 40 ids: one prompt, its 8 choices within the bound
    response = post("/v1/completions", {"model": model.public_id, "prompt": [[1]] * 5, "n": 7}, headers)
    assert response.json()["error"]["message"] == ("prompt: 5 prompts with n 7 ask for 35 choices; ask for at most 32 "
                                                   "(fewer prompts, or a smaller n)")


def test_a_token_id_the_model_has_not_is_the_workers_400_naming_the_prompt_of_a_list(api, worker):
    """The web does not know the model's vocabulary; the serve worker refuses an id past it, naming its index and the
    range (jaxengine's check_prompt). Of a list of prompts, the answer says which prompt it was."""
    model, headers = api
    scripts, _requests = worker
    past = {"type": "error", "message": "prompt: the token id at index 1, 999, is outside the model's vocabulary; "
                                        "give token ids from 0 to 402 (its vocab_size is 403)"}
    scripts += [completion_events("A", 1), [past]]
    response = post("/v1/completions", {"model": model.public_id, "prompt": [[1], [2, 999]]}, headers)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == past["message"] + " (prompt 1 of the list, counted from 0)"
    scripts += [completion_events("A", 1), [past]]
    status, body = stream("/v1/completions", {"model": model.public_id, "prompt": [[1], [2, 999]], "stream": True},
                          headers)
    assert status == 400 and body["error"]["message"] == past["message"] + " (prompt 1 of the list, counted from 0)"
    scripts += [[past]]
    response = post("/v1/completions", {"model": model.public_id, "prompt": [2, 999]}, headers)
    assert response.json()["error"]["message"] == past["message"]  # one prompt: no more to say


def test_a_token_id_past_the_vocabulary_its_config_states_is_refused_before_a_worker_is_asked(
        api, worker, team, models_root, settings):
    """The worker's refusal (code generation_failed, param null) came after the request was queued; where the model's
    config.json states its vocab_size, the web says it first, naming the index, the id and the range, and queues
    nothing. The size is read again once the file changes."""
    from tests.webapp.factories import write_model_dir

    settings.TEMPER_MODEL_FILES_RECHECK_SECONDS = 0
    _model, headers = api
    scripts, requests = worker
    model_dir = write_model_dir(models_root / "sized")  # vocab_size 64
    sized = make_base_model(team.project, name="sized", path=str(model_dir))
    range_said = "is outside the model's vocabulary; give token ids from 0 to 63 (its vocab_size is 64)"
    for prompt, message in (([5, 64], f"prompt: the token id at index 1, 64, {range_said}"),
                            ([[1], [2, 3, 70]], f"prompt: the token id at index 2 of prompt 1, 70, {range_said}")):
        for stream_it in (False, True):
            response = post("/v1/completions", {"model": sized.public_id, "prompt": prompt, "stream": stream_it},
                            headers)
            assert response.status_code == 400, response.content
            assert response.json()["error"] == {"message": message, "type": "invalid_request_error",
                                                "param": "prompt", "code": "invalid_value"}
    assert requests == []
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "vocab_size": 128}))
    scripts += [completion_events("A", 2)]
    response = post("/v1/completions", {"model": sized.public_id, "prompt": [5, 64], "max_tokens": 1}, headers)
    assert response.status_code == 200, response.content
    assert [request["prompt_token_ids"] for request in requests] == [[5, 64]]


def choice_events(text: str, index: int, *, prompt_tokens: int = 4, finish_reason: str = "stop") -> list[dict]:
    """The serve worker's events of answer ``index`` of a request for several (its done numbers its choice)."""
    return [{"type": "token", "text": text}, {"type": "done", "text": text, "finish_reason": finish_reason,
                                               "choice": index, "prompt_tokens": prompt_tokens,
                                               "completion_tokens": len(text)}]


def test_n_answers_are_one_task_and_a_choice_each_with_the_prompt_counted_once(api, worker):
    """Issue 4: n was refused past 1. A request for n answers is one serve task asking for n (rows of one batch),
    answered with n choices, each its own finish_reason; the usage counts the prompt once and every answer's
    tokens, as OpenAI's does. Streamed, each chunk names its answer's index."""
    model, headers = api
    scripts, requests = worker
    scripts += [choice_events("ab", 0), choice_events("cde", 1, finish_reason="length"), choice_events("f", 2)]
    response = post("/v1/chat/completions", chat(model, n=3, seed=5), headers)
    assert response.status_code == 200, response.content
    assert len(requests) == 1 and requests[0]["n"] == 3 and requests[0]["seed"] == 5
    GenerateRequest.model_validate({**requests[0], "model_path": "/m", "project_slug": "alpha"})  # the worker takes it
    body = response.json()
    assert body["choices"] == [
        {"index": 0, "message": {"role": "assistant", "content": "ab"}, "logprobs": None,
         "finish_reason": "stop"},
        {"index": 1, "message": {"role": "assistant", "content": "cde"}, "logprobs": None,
         "finish_reason": "length"},
        {"index": 2, "message": {"role": "assistant", "content": "f"}, "logprobs": None,
         "finish_reason": "stop"}]
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}
    scripts += [choice_events("ab", 0), choice_events("cde", 1, finish_reason="length"), choice_events("f", 2)]
    status, lines = stream("/v1/chat/completions", chat(model, n=3, stream=True,
                                                        stream_options={"include_usage": True}), headers)
    assert status == 200 and lines[-1] == "data: [DONE]\n\n"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    by_index = {0: [], 1: [], 2: []}
    for chunk in chunks[:-1]:
        (part,) = chunk["choices"]
        by_index[part["index"]].append((part["delta"].get("content"), part["finish_reason"]))
    assert by_index == {0: [("ab", None), (None, "stop")], 1: [("cde", None), (None, "length")],
                        2: [("f", None), (None, "stop")]}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == body["usage"]
    # One answer asks for no n: the chat panel's and a lone completion's requests are as before.
    scripts.append(completion_events("A", 3))
    assert post("/v1/completions", {"model": model.public_id, "prompt": "x"}, headers).status_code == 200
    assert "n" not in requests[-1]


def test_every_streamed_choice_names_its_role_once_an_empty_answer_too(api, worker):
    """An empty answer's choice got only its finish chunk, with no role (found in the QA of n): OpenAI's chunks
    name the role once in every choice, so a client that keys a choice's message on it met none."""
    model, headers = api
    scripts, _requests = worker
    scripts += [choice_events("ab", 0), choice_events("", 1)]
    status, lines = stream("/v1/chat/completions", chat(model, n=2, stream=True), headers)
    assert status == 200
    deltas = {0: [], 1: []}
    for line in lines[:-1]:
        for choice in json.loads(line.removeprefix("data: "))["choices"]:
            deltas[choice["index"]].append(choice["delta"])
    assert deltas == {0: [{"role": "assistant", "content": "ab"}, {}], 1: [{"role": "assistant"}]}


def test_a_list_of_prompts_with_n_numbers_each_prompts_answers_in_turn(api, worker):
    """OpenAI numbers prompt p's answer i as choice p * n + i; each prompt is a task for n answers."""
    model, headers = api
    scripts, requests = worker
    scripts += [choice_events("a0", 0, prompt_tokens=3), choice_events("a1", 1, prompt_tokens=3),
                choice_events("b0", 0, prompt_tokens=5), choice_events("b1", 1, prompt_tokens=5)]
    response = post("/v1/completions", {"model": model.public_id, "prompt": ["one", "two"], "n": 2}, headers)
    assert response.status_code == 200, response.content
    assert [(request["prompt"], request["n"]) for request in requests] == [("one", 2), ("two", 2)]
    body = response.json()
    assert [(choice["index"], choice["text"]) for choice in body["choices"]] == [
        (0, "a0"), (1, "a1"), (2, "b0"), (3, "b1")]
    assert body["usage"] == {"prompt_tokens": 8, "completion_tokens": 8, "total_tokens": 16}


def test_a_body_cannot_name_the_chat_answer_or_project_the_serve_worker_acts_for(api, worker, team):
    """Review of _with_asking_project (a serve request naming no project borrows its chat answer's): a /v1 body's
    message, project_slug or id are fields these answers do not read, so a token's request always names its own
    project and no chat answer: an answer id of another project cannot lend its project, nor be written over."""
    model, headers = api
    scripts, requests = worker
    scripts += [choice_events("a", 0), choice_events("b", 1)]
    response = post("/v1/completions", {"model": model.public_id, "prompt": "x", "n": 2, "message": "msg_elsewhere",
                                        "project_slug": team.outsider_project.slug, "id": "chosen"}, headers)
    assert response.status_code == 200, response.content
    (request,) = requests
    assert request["project_slug"] == team.project.slug and "message" not in request
    assert request["id"] != "chosen" and request["id"].startswith("cmpl-")


def test_n_answers_are_refused_to_a_token_of_another_project(api, worker, team):
    """An outsider's token (its own project) asking for n answers of this project's model gets the 404 any model
    of another project gets, and nothing is queued."""
    model, _headers = api
    _scripts, requests = worker
    _token, secret = project_token_create(user=team.outsider, project=team.outsider_project, name="x")
    response = post("/v1/chat/completions", chat(model, n=3), {"HTTP_AUTHORIZATION": f"Bearer {secret}"})
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"
    assert requests == []


def test_a_list_of_prompts_one_of_which_the_model_refuses_is_a_400(api, worker):
    model, headers = api
    scripts, _requests = worker
    scripts += [completion_events("A", 3), [CONTEXT_ERROR], completion_events("A", 3), [CONTEXT_ERROR]]
    response = post("/v1/completions", {"model": model.public_id, "prompt": ["one", "two"]}, headers)
    assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"
    status, body = stream("/v1/completions", {"model": model.public_id, "prompt": ["one", "two"], "stream": True},
                          headers)
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    # A refused prompt is answered at once, and the generations of the others still going are stopped.
    scripts += [[{"type": "token", "text": "still going"}], [CONTEXT_ERROR]]
    response = post("/v1/completions", {"model": model.public_id, "prompt": ["one", "two"]}, headers)
    assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"
    assert redis_client().exists(channels.stop_key(_requests[-2]["id"]))


def test_a_model_is_not_deleted_while_a_completion_is_answered_with_it(api, worker, team):
    """A /v1 answer left no trace a deletion could see: the model (or its project) was deleted under it, and the
    serve worker dropped the weights it was answering with."""
    from django.core.exceptions import ValidationError

    from webapp.basemodels.services import basemodel_unregister
    from webapp.chat.models import ApiGeneration
    from webapp.projects.services import project_delete

    model, headers = api
    scripts, _requests = worker
    scripts.append([{"type": "token", "text": "Hel"}])  # the rest once the deletions were tried

    async def answer_while_deleting():
        response = await AsyncClient().post("/v1/chat/completions", json.dumps(chat(model, stream=True)),
                                            content_type="application/json",
                                            headers={"Authorization": headers["HTTP_AUTHORIZATION"]})
        chunks = aiter(response.streaming_content)
        answer_id = json.loads((await anext(chunks)).decode().removeprefix("data: "))["id"]
        refusals = []
        for delete in (lambda: basemodel_unregister(base_model=model),
                       lambda: project_delete(project=team.project, confirmation="alpha")):
            with pytest.raises(ValidationError) as refused:
                await sync_to_async(delete)()
            refusals.append(refused.value.message_dict["delete"])
        channels.emit(redis_client(), answer_id, {"seq": 1, "type": "done", "text": "Hel", "finish_reason": "stop"})
        return answer_id, refusals, [chunk.decode() async for chunk in chunks]

    answer_id, refusals, rest = async_to_sync(answer_while_deleting)()
    assert refusals == [[f"\u2068alpha-teammate\u2069's /v1 completion {answer_id} (project token \u2068x\u2069) is "
                         "being answered by its model; wait for it to finish"],
                        ["a /v1 completion is being answered; wait for it to finish"]]
    assert rest[-1] == "data: [DONE]\n\n" and not ApiGeneration.objects.exists()
    # A whole answer, and a refused one, leave nothing behind either.
    scripts += [[{"type": "done", "text": "Hi", "finish_reason": "stop"}], [CONTEXT_ERROR]]
    assert post("/v1/chat/completions", chat(model), headers).status_code == 200
    assert post("/v1/chat/completions", chat(model, max_tokens=8192), headers).status_code == 400
    assert not ApiGeneration.objects.exists()
    basemodel_unregister(base_model=model)


def test_a_completion_asked_of_a_model_deleted_as_it_was_asked_for_is_refused(api, team):
    """The model was looked up before the deletion committed and is gone once its row is locked: the completion is
    not recorded (nor queued), and says why. (tests/postgres/test_project_delete_postgres.py races the two.)"""
    from django.core.exceptions import ValidationError

    from webapp.basemodels.services import basemodel_unregister
    from webapp.chat import selectors, services
    from webapp.chat.models import ApiGeneration, ProjectToken

    model, _headers = api
    choice = selectors.model_choice(project=team.project, ref=model.public_id)
    basemodel_unregister(base_model=model)
    with pytest.raises(ValidationError) as refused:
        services.api_generation_start(token=ProjectToken.objects.get(name="x"), model=choice,
                                      generation_id="chatcmpl-late")
    assert refused.value.messages == ["the model \u2068Base model: tiny\u2069 was deleted as the completion was being "
                                      "asked for; choose another model"]
    assert not ApiGeneration.objects.exists()


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_no_serve_worker_takes_up_says_so_not_that_redis_is_down(api, monkeypatch, stream):
    """QA: with no serve worker running (or every one stuck), a completion waited five minutes and was told "the
    live event channel (Redis) is unavailable; try again", though Redis answered all along."""
    monkeypatch.setattr(openai_api.celery_app, "send_task", lambda name, args, queue, **options: None)  # no worker
    monkeypatch.setattr(openai_api, "answer_wait_seconds", lambda: 1.0)
    model, headers = api
    response = post("/v1/chat/completions", chat(model, stream=stream), headers)
    assert response.status_code == 503
    assert response.json()["error"] == {
        "message": "no serve worker answered within 1 s: check that a serve worker consumes the 'serve' queue "
                   "(scripts/up.sh starts one) and is not stuck, then try again",
        "type": "server_error", "param": None, "code": "no_serve_worker"}


def test_a_completion_waits_as_long_as_its_generation_may_last(settings):
    """A serve timeout set past five minutes (TEMPER_SERVE_TIMEOUT_SECONDS) cut completions at five minutes."""
    settings.TEMPER_SERVE_TIMEOUT_SECONDS = 600
    # Taken up just before it expires, then its wait for compiles and its timeout.
    assert openai_api.answer_wait_seconds() == 600 + 120 + 120 + 120 + 600


def test_a_client_gone_before_its_stream_started_leaves_no_record(api, worker, transactional_db):
    """A client that went away after the view answered, as Django sent the response's head, left the completion
    recorded (``ApiGeneration``) until it expired: its model and project could not be deleted meanwhile, and its
    generation ran on. Django never read the stream, whose own ending does both; it only closed the response."""
    from django.core.handlers.asgi import ASGIHandler

    from webapp.chat.models import ApiGeneration

    model, headers = api
    scripts, requests = worker
    scripts.append([{"type": "token", "text": "Hel"}])
    body = json.dumps(chat(model, stream=True)).encode()

    async def leave_as_the_head_is_sent():
        head_sent, sent, asked = asyncio.Event(), [], []

        async def receive():
            if not asked:
                asked.append(True)
                return {"type": "http.request", "body": body, "more_body": False}
            await head_sent.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)
            if message["type"] == "http.response.start":
                head_sent.set()
                await asyncio.Event().wait()  # a client that reads nothing more: Django waits until it cancels

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
                 "query_string": b"", "root_path": "", "client": ("127.0.0.1", 5000), "server": ("testserver", 80),
                 "headers": [(b"host", b"testserver"), (b"content-type", b"application/json"),
                             (b"authorization", headers["HTTP_AUTHORIZATION"].encode())]}
        await ASGIHandler()(scope, receive, send)
        return sent

    sent = async_to_sync(leave_as_the_head_is_sent)()
    assert [(message["type"], message.get("status")) for message in sent] == [("http.response.start", 200)]
    assert not ApiGeneration.objects.exists()
    assert redis_client().exists(channels.stop_key(requests[0]["id"]))


def _deactivate(team, token):
    type(team.teammate).objects.filter(pk=team.teammate.pk).update(is_active=False)


def _revoke(team, token):
    from webapp.chat.tokens import project_token_revoke

    project_token_revoke(user=team.teammate, project=team.project, token_id=token.pk)


@pytest.mark.django_db(transaction=True)  # the ASGI handler answers from threads of its own
@pytest.mark.parametrize("revoke, why", [(_revoke, "this token was revoked"),
                                         (_deactivate, "this token's user, alpha-teammate, is deactivated")])
@pytest.mark.parametrize("streamed", [True, False])
def test_an_answer_stops_once_its_token_may_no_longer_be_used(api, worker, team, monkeypatch, revoke, why, streamed):
    """A /v1 answer being written as its token was revoked (or its user deactivated, removed from the project) ran
    on to its token limit. It stops its generation within ACCESS_RECHECK_SECONDS and ends with an error chunk
    (streamed) or a 401 (whole), which the official openai client raises naming why."""
    import httpx2
    import openai
    from django.core.handlers.asgi import ASGIHandler

    from webapp.chat.models import ApiGeneration, ProjectToken

    monkeypatch.setattr(sse, "ACCESS_RECHECK_SECONDS", 0.1)
    model, headers = api
    scripts, requests = worker
    scripts.append([{"type": "token", "text": "Hel"}])  # and nothing more: the answer would go on and on
    token = ProjectToken.objects.get(user=team.teammate)
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=ASGIHandler()), base_url="http://testserver")
    client = openai.AsyncOpenAI(base_url="http://testserver/v1", api_key=headers["HTTP_AUTHORIZATION"][7:],
                                http_client=http, max_retries=0)

    async def read():
        answer = await client.chat.completions.create(
            model=model.public_id, messages=[{"role": "user", "content": "hi"}], stream=streamed)
        return [chunk async for chunk in answer] if streamed else answer

    async def revoke_once_answering():
        while not await sync_to_async(ApiGeneration.objects.exists)():
            await asyncio.sleep(0.05)
        await sync_to_async(revoke)(team, token)

    async def answer_while_revoking():
        revoking = asyncio.ensure_future(revoke_once_answering())
        try:
            await asyncio.wait_for(read(), timeout=20)
        finally:
            await revoking

    with pytest.raises(openai.APIError if streamed else openai.AuthenticationError,
                       match=f"this completion was stopped: {why}"):
        async_to_sync(answer_while_revoking)()
    assert redis_client().exists(channels.stop_key(requests[0]["id"]))
    assert not ApiGeneration.objects.exists()


def test_chat_template_kwargs_are_sent_to_the_serve_worker(api, worker):
    """vLLM's and SGLang's chat_template_kwargs ({"enable_thinking": false} for Qwen3) reach the serve worker, which
    lays them over the model's own; a body without them sends none."""
    model, headers = api
    scripts, requests = worker
    scripts += [ANSWER, ANSWER]
    variables = {"enable_thinking": False, "date_string": "01 Jan 2030", "effort": 2, "persona": None}
    assert post("/v1/chat/completions", chat(model, chat_template_kwargs=variables), headers).status_code == 200
    assert post("/v1/chat/completions", chat(model), headers).status_code == 200
    assert requests[0]["chat_template_kwargs"] == variables and "chat_template_kwargs" not in requests[1]


def test_a_runs_model_is_sent_its_run_rows_variables_under_the_requests(api, worker, team, tmp_path):
    """A run's export made before exports kept chat_template_kwargs.json had its variables from the run directory's
    spec.yaml alone: its Run row's go with each chat completion, a request's own over them; a raw completion renders
    no template and gets none."""
    from webapp.runs.models import Artifact, ArtifactKind, Run, RunStatus

    _model, headers = api
    scripts, requests = worker
    scripts += [ANSWER, ANSWER, ANSWER]
    variables = {"enable_thinking": False, "date_string": "01 Jan 2030"}
    run = Run.objects.create(project=team.project, name="trained off", task="sft", status=RunStatus.SUCCEEDED,
                             spec={"task": "sft"}, created_by=team.owner,
                             resolved_spec={"output_dir": str(tmp_path), "data": {"chat_template_kwargs": variables}})
    (tmp_path / "export-step-4").mkdir()
    Artifact.objects.create(run=run, kind=ArtifactKind.CHECKPOINT, step=4, path=str(tmp_path / "export-step-4"))
    checkpoint = {**CHAT, "model": f"{run.public_id}:step-4"}
    assert post("/v1/chat/completions", checkpoint, headers).status_code == 200
    assert post("/v1/chat/completions", {**checkpoint, "chat_template_kwargs": {"enable_thinking": True}},
                headers).status_code == 200
    assert post("/v1/completions", {"model": checkpoint["model"], "prompt": "hi"}, headers).status_code == 200
    assert requests[0]["chat_template_kwargs"] == variables
    assert requests[1]["chat_template_kwargs"] == {"enable_thinking": True, "date_string": "01 Jan 2030"}
    assert "chat_template_kwargs" not in requests[2]


def test_a_runs_variables_and_a_requests_own_reach_the_serve_worker_together(api, worker, team, tmp_path):
    """A run with as many template variables as a spec may hold, chatted with a request setting as many others: the
    serve worker takes the request (it refused more than 32 variables in all)."""
    from webapp.runs.models import Artifact, ArtifactKind, Run, RunStatus

    _model, headers = api
    scripts, requests = worker
    scripts += [ANSWER]
    own = {f"own{index:02}": "x" for index in range(TEMPLATE_VARIABLES_MAX)}
    asked = {f"asked{index:02}": "y" for index in range(TEMPLATE_VARIABLES_MAX)}
    run = Run.objects.create(project=team.project, name="many variables", task="sft", status=RunStatus.SUCCEEDED,
                             spec={"task": "sft"}, created_by=team.owner,
                             resolved_spec={"output_dir": str(tmp_path), "data": {"chat_template_kwargs": own}})
    (tmp_path / "export").mkdir()
    Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, path=str(tmp_path / "export"))
    assert post("/v1/chat/completions", {**CHAT, "model": run.public_id, "chat_template_kwargs": asked},
                headers).status_code == 200
    assert GenerateRequest.model_validate(requests[0]).chat_template_kwargs == {**own, **asked}


@pytest.mark.parametrize("variables,message", [
    ([1], 'chat_template_kwargs: [1] is not a JSON object; give a JSON object of chat template variables'),
    ({"enable_thinking": [False]}, 'chat_template_kwargs["enable_thinking"]: [false] is not text'),
    ({"messages": "hi"}, "chat_template_kwargs: 'messages' is set by the renderer itself"),
    ({"two words": 1}, "chat_template_kwargs: 'two words' is not a variable name a template can read"),
])
def test_bad_chat_template_kwargs_are_named(api, variables, message):
    model, headers = api
    response = post("/v1/chat/completions", chat(model, chat_template_kwargs=variables), headers)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["message"].startswith(message), error
    assert error["param"].startswith("chat_template_kwargs") and error["type"] == "invalid_request_error"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_key_given_twice_is_refused_naming_it(api, worker, path):
    """Audit: /v1 kept the last of a key given twice (the first temperature was dropped without a word), which the
    REST API refuses."""
    model, headers = api
    scripts, requests = worker
    scripts.extend([ANSWER, ANSWER])  # what a body taken would be answered with
    rest = '"messages": [{"role": "user", "content": "hi"}]' if path == "/v1/chat/completions" else '"prompt": "hi"'
    body = f'{{"model": "{model.public_id}", {rest}, "temperature": 0, "temperature": 2}}'
    response = post(path, body, headers)
    assert response.status_code == 400, response.content
    assert response.json() == {"error": {
        "message": "'temperature' is given twice in one object; JSON keeps the last, so send it once",
        "type": "invalid_request_error", "param": None, "code": "duplicate_key"}}
    nested = '"messages": [{"role": "user", "role": "system", "content": "hi"}]'
    if path == "/v1/chat/completions":
        response = post(path, f'{{"model": "{model.public_id}", {nested}}}', headers)
        assert response.status_code == 400 and "'role' is given twice" in response.json()["error"]["message"]
    assert requests == []


LONG_ID = "bm_" + "x" * 5000


@pytest.mark.parametrize("ask", [
    lambda model, headers: Client().get(f"/v1/models/{LONG_ID}", **headers),
    lambda model, headers: post("/v1/chat/completions", {**CHAT, "model": LONG_ID}, headers),
    lambda model, headers: post("/v1/completions", {"model": LONG_ID, "prompt": "hi"}, headers),
    lambda model, headers: post("/v1/chat/completions", chat(model, logit_bias={LONG_ID: 1}), headers),
    lambda model, headers: post("/v1/chat/completions", chat(model, chat_template_kwargs={"no-" + "x" * 5000: 1}),
                                headers),
    lambda model, headers: post("/v1/chat/completions", chat(model, chat_template_kwargs={"a" * 5000: {"x": 1}}),
                                headers),
    lambda model, headers: post("/v1/chat/completions", chat(model, **{"max_tokens": 5, "max_" + "_" * 5000 + "tokens": 5}),
                                headers),
    lambda model, headers: post("/v1/completions",
                                f'{{"model": "{model.public_id}", "prompt": "hi", "{LONG_ID}": 1, "{LONG_ID}": 2}}',
                                headers),
])
def test_an_error_shows_a_long_id_or_key_cut_short(api, worker, ask):
    """Audit: a 404 repeated a 5,000-character model id in full; every place /v1 echoes a client's text in an error
    shows at most its first 100 characters and "…"."""
    model, headers = api
    worker[0].append(ANSWER)  # what a body taken would be answered with
    response = ask(model, headers)
    assert 400 <= response.status_code < 500, response.content
    error = response.json()["error"]
    shown = error["message"] + (error["param"] or "")
    assert "…" in shown and not any(letter * 101 in shown for letter in "xa_"), shown[:400]
    assert len(error["message"]) < 1000 and len(error["param"] or "") < 200, error


def test_a_run_that_serves_no_model_is_named_with_why(api, team):
    """Audit: a script that launched a run and chatted with it before it ended was told "the model 'run_…' does not
    exist in project alpha", though GET runs/<id>/ showed it training: the 404 now says why the run serves no model
    and what to do, for a run still training, one that ended without an export, and a checkpoint not exported."""
    from webapp.runs.models import Artifact, ArtifactKind, Run, RunStatus

    _model, headers = api

    def refusal(ref: str) -> dict:
        response = post("/v1/chat/completions", {**CHAT, "model": ref}, headers)
        assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"
        retrieved = Client().get(f"/v1/models/{ref}", **headers)  # the openai client's models.retrieve says the same
        assert retrieved.status_code == 404 and retrieved.json()["error"] == response.json()["error"]
        return response.json()["error"]["message"]

    def run(name: str, **fields) -> Run:
        return Run.objects.create(project=team.project, name=name, spec={}, resolved_spec={}, created_by=team.teammate,
                                  **{"task": "sft", **fields})

    training = run("first-sft", status=RunStatus.RUNNING, current_step=3, total_steps=100)
    assert refusal(training.public_id) == (
        f"run {training.public_id} (\u2068first-sft\u2069) is running (step 3 of 100): its model is served once the run "
        f"succeeds; GET /api/v1/projects/alpha/runs/{training.public_id}/ says when it has")
    cancelled = run("stopped", status=RunStatus.CANCELLED, current_step=0, total_steps=100)
    assert refusal(cancelled.public_id) == (
        f"run {cancelled.public_id} (\u2068stopped\u2069) was cancelled at step 0 without exporting a model, so there is "
        "nothing to chat with: resume it to train on and export one (POST "
        f"/api/v1/projects/alpha/runs/{cancelled.public_id}/resume/)")
    done = run("done", status=RunStatus.SUCCEEDED, current_step=5, total_steps=5)
    Artifact.objects.create(run=done, kind=ArtifactKind.MODEL, step=5, path="/nowhere/export")
    assert refusal(f"{done.public_id}@4") == (
        f"run {done.public_id} (\u2068done\u2069) has no exported checkpoint at step 4: export it on the run's page "
        "(Checkpoints) to chat with it")
    external = run("laptop", status=RunStatus.SUCCEEDED, task="external")
    assert refusal(external.public_id) == (
        f"run {external.public_id} (\u2068laptop\u2069) was trained elsewhere and logged here: Temper holds no model "
        "of it")
    reward = run("judge", status=RunStatus.SUCCEEDED, task="reward")
    Artifact.objects.create(run=reward, kind=ArtifactKind.MODEL, step=5, path="/nowhere/judge")
    assert refusal(reward.public_id) == (
        f"run {reward.public_id} (\u2068judge\u2069) trained a reward model, which scores answers and writes none: "
        "there is nothing to chat with")
    # Not a run of this project, none at all or another project's: the words are those of a missing model.
    assert refusal("run_nothing") == "the model 'run_nothing' does not exist in project alpha; GET /v1/models lists them"
    theirs = Run.objects.create(project=team.outsider_project, name="secret", task="sft", spec={}, resolved_spec={},
                                created_by=team.outsider, status=RunStatus.RUNNING)
    assert refusal(theirs.public_id) == (f"the model '{theirs.public_id}' does not exist in project alpha; "
                                         "GET /v1/models lists them")
