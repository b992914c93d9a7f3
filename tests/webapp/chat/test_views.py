"""Chat pages with an owner, a member (teammate), a viewer and an outsider: conversations, turns sent to
the serve queue, stop, regenerate, the worker's outcome, escaping of model output, the SSE relay."""
import json
import os
import re
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient
from django.urls import reverse
from django.utils import timezone
from kombu.exceptions import OperationalError

from tests.webapp import factories
from tests.webapp.factories import make_base_model, thinking_model_dir
from webapp.chat import channels, forms, selectors, services, views
from webapp.chat.models import Conversation, Message, MessageStatus
from webapp.runs.channels import redis_client


@pytest.fixture
def base_model(team):
    return make_base_model(team.project, name="tiny", path="/models/tiny")


def conversation_of(team, client_for, base_model, **settings):
    fields = {"model": base_model.public_id, "system_prompt": "Be brief.", "temperature": 0.5, "top_p": 0.9,
              "top_k": 40, "max_tokens": 64, **settings}
    response = client_for(team.teammate).post(reverse("chat:list", args=[team.project.slug]), fields)
    assert response.status_code == 302
    return Conversation.objects.get(project=team.project, user=team.teammate)


def url(name, conversation, *extra):
    return reverse(f"chat:{name}", args=[conversation.project.slug, conversation.public_id, *extra])


def test_it_works(team, client_for, base_model, sent, django_capture_on_commit_callbacks):
    conversation = conversation_of(team, client_for, base_model)
    client = client_for(team.teammate)
    assert client.get(url("detail", conversation)).status_code == 200
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(url("send", conversation), {"content": "What is 2 + 2?"})
    assert response.status_code == 200
    answer = Message.objects.get(public_id=response.json()["message"])
    assert answer.role == "assistant" and answer.status == MessageStatus.STREAMING
    [(name, [request], queue)] = sent
    assert name == "worker.tasks.serve.generate" and queue == "serve"
    assert request["id"] == request["message"] == answer.public_id
    assert request["model_path"] == "/models/tiny"
    assert request["messages"] == [{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": "What is 2 + 2?"}]
    assert (request["temperature"], request["top_p"], request["top_k"], request["max_new_tokens"]) == (0.5, 0.9, 40, 64)
    conversation.refresh_from_db()
    assert conversation.title == "What is 2 + 2?"

    # The worker reports the answer; the next turn carries the whole conversation.
    services.message_finish(message_id=answer.public_id, text="4", finish_reason="stop", completion_tokens=2)
    with django_capture_on_commit_callbacks(execute=True):
        client.post(url("send", conversation), {"content": "And 3 + 3?"})
    assert [turn["content"] for turn in sent[1][1][0]["messages"]] == ["Be brief.", "What is 2 + 2?", "4", "And 3 + 3?"]


def test_a_project_without_models_says_where_they_come_from(team, client_for, sent):
    """The chat said "register a base model, or finish a run" with nowhere to click: a newcomer's dead end."""
    page = client_for(team.teammate).get(reverse("chat:list", args=[team.project.slug])).content.decode()
    assert "No model to chat with yet" in page
    assert f'href="{reverse("basemodels:register", args=[team.project.slug])}"' in page
    assert f'href="{reverse("runs:new", args=[team.project.slug])}"' in page


def test_the_message_box_has_a_name_and_says_how_to_send(team, client_for, base_model, sent):
    """QA: the box had no label, no accessible name and no placeholder: a screen reader said only "edit
    text", and nothing said that Enter sends."""
    conversation = conversation_of(team, client_for, base_model)
    page = client_for(team.teammate).get(url("detail", conversation)).content.decode()
    box = page.split('<form id="chat-form"', 1)[1].split("<textarea", 1)[1].split(">", 1)[0]
    assert 'aria-label="Message"' in box
    assert 'placeholder="Message the model: Enter sends, Shift+Enter starts a new line"' in box


def test_opening_a_conversation_asks_the_serve_worker_to_load_its_model(team, client_for, base_model, sent,
                                                                       django_capture_on_commit_callbacks):
    conversation = conversation_of(team, client_for, base_model)
    with django_capture_on_commit_callbacks(execute=True):
        assert client_for(team.teammate).get(url("detail", conversation)).status_code == 200
    model = selectors.model_choice(project=team.project, ref=conversation.model_ref)
    assert sent == [("worker.tasks.serve.prepare", [model.cache_key, "/models/tiny", team.project.slug], "serve")]


def test_a_conversation_opens_while_the_broker_is_down(team, client_for, base_model, monkeypatch,
                                                       django_capture_on_commit_callbacks):
    conversation = conversation_of(team, client_for, base_model)

    def broker_down(name, args, queue, **options):
        assert options == {"retry": False}  # a hint is not worth the page's time in retries
        raise OperationalError("Error 111 connecting to localhost:6379. Connection refused.")

    monkeypatch.setattr(services.celery_app, "send_task", broker_down)
    with django_capture_on_commit_callbacks(execute=True):
        response = client_for(team.teammate).get(url("detail", conversation))
    assert response.status_code == 200 and b'id="chat-form"' in response.content


def test_a_generation_expires_when_its_answer_would_be_given_up(team, client_for, base_model, monkeypatch, settings,
                                                                 django_capture_on_commit_callbacks):
    """A request that reaches a worker late (queued behind others, or queued again after its first worker died
    holding it) is dropped by Celery instead of writing an answer that was already given up."""
    settings.TEMPER_SERVE_TIMEOUT_SECONDS = 30
    options = []
    monkeypatch.setattr(services.celery_app, "send_task", lambda name, args, queue, **kw: options.append((name, kw)))
    conversation = conversation_of(team, client_for, base_model)
    with django_capture_on_commit_callbacks(execute=True):
        response = client_for(team.teammate).post(url("send", conversation), {"content": "Hi"})
    expires = 30 + services.FIRST_TOKEN_WAIT_SECONDS + services.LOST_ANSWER_GRACE_SECONDS
    assert options[-1] == ("worker.tasks.serve.generate", {"expires": expires})
    answer = Message.objects.get(public_id=response.json()["message"])
    expiry = answer.created_at + timedelta(seconds=options[-1][1]["expires"])
    assert not services.answer_is_lost(answer, now=expiry) and services.answer_is_lost(answer, now=expiry + timedelta(seconds=1))


def test_line_breaks_typed_in_the_page_reach_the_model_as_typed(team, client_for, base_model, sent,
                                                                django_capture_on_commit_callbacks):
    """A browser sends a textarea's line breaks as CRLF (the form encodings do): the model read each as the
    tokens of "\\r\\n", which no API client and no training row sends (the demo tokenizer: two more tokens
    for a message of three lines), and the arena's preference pairs carried them into training data."""
    conversation = conversation_of(team, client_for, base_model, system_prompt="Be brief.\r\nUse English.")
    with django_capture_on_commit_callbacks(execute=True):
        client_for(team.teammate).post(url("send", conversation), {"content": "first line\r\nsecond line"})
    [(_name, [request], _queue)] = sent
    assert request["messages"] == [{"role": "system", "content": "Be brief.\nUse English."},
                                   {"role": "user", "content": "first line\nsecond line"}]
    assert conversation.messages.get(role="user").content == "first line\nsecond line"


def test_a_turn_names_the_message_the_page_must_show_before_it(team, client_for, base_model, sent):
    """A second tab on the conversation may have taken a turn: the page compares ``previous`` with its last message."""
    conversation = conversation_of(team, client_for, base_model)
    client = client_for(team.teammate)
    first = client.post(url("send", conversation), {"content": "Hi"}).json()
    assert first["previous"] == "" and Message.objects.get(public_id=first["user_message"]).content == "Hi"
    services.message_finish(message_id=first["message"], text="Hello.", finish_reason="stop")
    second = client.post(url("send", conversation), {"content": "Again"}).json()
    assert second["previous"] == first["message"]
    services.message_finish(message_id=second["message"], text="Hello again.", finish_reason="stop")
    assert client.post(url("regenerate", conversation)).json()["previous"] == second["user_message"]


def test_it_rejects_a_turn_while_an_answer_is_streaming(team, client_for, base_model, sent):
    conversation = conversation_of(team, client_for, base_model)
    client = client_for(team.teammate)
    assert client.post(url("send", conversation), {"content": "one"}).status_code == 200
    response = client.post(url("send", conversation), {"content": "two"})
    assert response.status_code == 409 and "still being written" in response.json()["error"]
    assert client.post(url("send", conversation), {"content": ""}).status_code == 400


@pytest.mark.parametrize("content", [" \n\t ", "\u00a0\u3000"])  # no-break and ideographic spaces too
def test_it_rejects_a_blank_message_naming_the_field(team, client_for, base_model, sent, content):
    """White space alone passed the form (it keeps the text as typed) and the service refused it as a 409, the
    status of a conversation busy with an answer: bad input is a 400 naming the field."""
    conversation = conversation_of(team, client_for, base_model)
    response = client_for(team.teammate).post(url("send", conversation), {"content": content})
    assert response.status_code == 400
    assert response.json() == {
        "error": "content: the message is empty or only white space; write something to send",
        "errors": {"content": ["the message is empty or only white space; write something to send"]}}
    assert not conversation.messages.exists() and not sent


def test_regenerate_replaces_the_last_answer(team, client_for, base_model, sent, django_capture_on_commit_callbacks):
    conversation = conversation_of(team, client_for, base_model)
    client = client_for(team.teammate)
    with django_capture_on_commit_callbacks(execute=True):
        first = client.post(url("send", conversation), {"content": "Hi"}).json()["message"]
    services.message_finish(message_id=first, text="Hello!", finish_reason="stop")
    with django_capture_on_commit_callbacks(execute=True):
        second = client.post(url("regenerate", conversation)).json()["message"]
    assert second != first and not Message.objects.filter(public_id=first).exists()
    assert [turn["content"] for turn in sent[-1][1][0]["messages"]] == ["Be brief.", "Hi"]
    assert len(sent) == 2 and sent[1][1][0]["seed"] != sent[0][1][0]["seed"]


def test_a_send_or_regenerate_sent_again_with_its_token_attaches_to_the_first_answer(
        team, client_for, base_model, sent, django_capture_on_commit_callbacks):
    """A double click or a retry sent the turn twice: the second got a 409 "still being written", or, once the first
    answer had ended, took a second turn. The same sending (its one-time token and text) is now answered with the
    first's answer to follow; a new token takes a new turn."""
    conversation = conversation_of(team, client_for, base_model)
    client = client_for(team.teammate)

    def post(name, **fields):
        with django_capture_on_commit_callbacks(execute=True):  # the request to the serve worker, if one is made
            return client.post(url(name, conversation), fields)

    first = post("send", content="Hi", submission_token="send-1")
    again = post("send", content="Hi", submission_token="send-1")
    assert first.status_code == again.status_code == 200 and again.json() == first.json()
    assert conversation.messages.count() == 2 and len(sent) == 1  # one turn, one request to the serve worker
    services.message_finish(message_id=first.json()["message"], text="Hello.", finish_reason="stop")
    # Its answer ended: sent again, still the first's answer, not a second turn.
    assert post("send", content="Hi", submission_token="send-1").json() == first.json()
    assert conversation.messages.count() == 2 and len(sent) == 1
    # A new sending (a new token) takes a new turn.
    assert post("send", content="Hi", submission_token="send-2").json()["message"] != first.json()["message"]
    assert conversation.messages.count() == 4 and len(sent) == 2

    services.message_finish(message_id=Message.objects.filter(role="assistant").last().public_id, text="Hi!",
                            finish_reason="stop")
    regenerated = post("regenerate", submission_token="regenerate-1")
    assert post("regenerate", submission_token="regenerate-1").json() == regenerated.json()
    assert conversation.messages.count() == 4 and len(sent) == 3
    services.message_finish(message_id=regenerated.json()["message"], text="Hey.", finish_reason="stop")
    post("regenerate", submission_token="regenerate-2")
    # The first regenerate's answer is replaced since: its repeat says so rather than show a stale answer.
    gone = post("regenerate", submission_token="regenerate-1")
    assert gone.status_code == 409 and gone.json()["error"] == views.REPEAT_ANSWER_GONE
    assert conversation.messages.count() == 4 and len(sent) == 4


def test_a_one_time_token_attaches_only_to_its_own_conversations_answer(
        team, client_for, base_model, sent, django_capture_on_commit_callbacks):
    """Review of the once-only send: a token is the user's and the conversation's (the record is keyed by the user and
    the address, which names the conversation), so the same token and text sent by another member in their own
    conversation, or by the same user in another conversation, takes a turn of its own, never attaching to (or
    showing) the first's answer; others posting to the first's conversation get its 404, and a repeat once it is
    deleted gets the 404 too, not its answer."""
    conversation = conversation_of(team, client_for, base_model)
    teammate = client_for(team.teammate)

    def post(client, name, target, **fields):
        with django_capture_on_commit_callbacks(execute=True):
            return client.post(url(name, target), {"content": "Hi", "submission_token": "same", **fields})

    def new_conversation(client, user):
        fields = {"model": base_model.public_id, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "max_tokens": 64}
        assert client.post(reverse("chat:list", args=[team.project.slug]), fields).status_code == 302
        return Conversation.objects.filter(user=user).latest("pk")

    first = post(teammate, "send", conversation).json()["message"]
    other = new_conversation(teammate, team.teammate)
    in_other = post(teammate, "send", other).json()["message"]
    owner = client_for(team.owner)
    owners = new_conversation(owner, team.owner)
    in_owners = post(owner, "send", owners).json()["message"]
    assert len({first, in_other, in_owners}) == 3 and len(sent) == 3
    assert other.messages.get(role="assistant").public_id == in_other
    assert owners.messages.get(role="assistant").public_id == in_owners
    for client in (owner, client_for(team.outsider)):  # the first's conversation is its author's alone
        for name in ("send", "regenerate"):
            assert post(client, name, conversation).status_code == 404
    services.message_finish(message_id=first, text="Hello.", finish_reason="stop")
    teammate.post(url("delete", conversation))
    assert not Conversation.objects.filter(pk=conversation.pk).exists()
    assert post(teammate, "send", conversation).status_code == 404 and len(sent) == 3


def test_a_send_whose_first_sending_failed_is_taken_when_sent_again(team, client_for, base_model, sent):
    """A refused send (here: an answer still being written) gives its token up: the same send, once the answer
    ended, takes its turn rather than repeat the refusal."""
    conversation = conversation_of(team, client_for, base_model)
    client = client_for(team.teammate)
    streaming = client.post(url("send", conversation), {"content": "One", "submission_token": "a"}).json()["message"]
    refused = client.post(url("send", conversation), {"content": "Two", "submission_token": "b"})
    assert refused.status_code == 409 and "still being written" in refused.json()["error"]
    services.message_finish(message_id=streaming, text="1", finish_reason="stop")
    taken = client.post(url("send", conversation), {"content": "Two", "submission_token": "b"})
    assert taken.status_code == 200 and conversation.messages.count() == 4


def test_a_send_token_past_its_length_is_refused_naming_the_field(team, client_for, base_model, sent):
    conversation = conversation_of(team, client_for, base_model)
    response = client_for(team.teammate).post(url("send", conversation), {"content": "Hi",
                                                                          "submission_token": "x" * 201})
    assert response.status_code == 400
    assert response.json()["errors"] == {"submission_token": ["submission_token is 201 characters long; it may be "
                                                              "at most 200"]}
    assert not conversation.messages.exists() and not sent



def test_a_turn_whose_answer_failed_or_came_out_empty_leaves_the_history(team, client_for, base_model, sent,
                                                                       django_capture_on_commit_callbacks):
    """Such a user turn stayed in without its answer, two user turns in a row: chat templates that demand
    alternating roles (Gemma's, Llama 2's) then refused every later turn of the conversation."""
    conversation = conversation_of(team, client_for, base_model)
    client = client_for(team.teammate)
    outcomes = [("One?", {"text": "1", "finish_reason": "stop"}),
                ("Two?", {"error": "the serve worker could not load the model"}),
                ("Three?", {"text": "", "finish_reason": "cancelled"}),  # stopped before its first token
                ("Four?", {"text": "4 and", "finish_reason": "timeout"}),  # cut short, as a stopped one
                ("Five?", {"text": "5", "finish_reason": "cancelled"})]
    for content, outcome in outcomes:
        with django_capture_on_commit_callbacks(execute=True):
            answer = client.post(url("send", conversation), {"content": content}).json()["message"]
        services.message_finish(message_id=answer, **outcome)
    with django_capture_on_commit_callbacks(execute=True):
        client.post(url("send", conversation), {"content": "Six?"})
    turns = sent[-1][1][0]["messages"]
    assert [(turn["role"], turn["content"]) for turn in turns] == [
        ("system", "Be brief."), ("user", "One?"), ("assistant", "1"), ("user", "Four?"), ("assistant", "4 and"),
        ("user", "Five?"), ("assistant", "5"), ("user", "Six?")]
    # Regenerating the newest answer asks the newest turn again, whatever became of it.
    services.message_finish(message_id=Message.objects.filter(role="assistant").last().public_id,
                            error="the serve worker could not load the model")
    with django_capture_on_commit_callbacks(execute=True):
        client.post(url("regenerate", conversation))
    assert sent[-1][1][0]["messages"] == turns

def test_the_workers_outcome_sets_the_status(team, client_for, base_model, sent):
    conversation = conversation_of(team, client_for, base_model)
    client = client_for(team.teammate)
    for finish_reason, status in [("stop", "complete"), ("length", "complete"), ("cancelled", "stopped"),
                                  ("timeout", "timeout")]:
        answer = client.post(url("send", conversation), {"content": "Hi"}).json()["message"]
        services.message_finish(message_id=answer, text="partial", finish_reason=finish_reason)
        assert Message.objects.get(public_id=answer).status == status
    answer = client.post(url("send", conversation), {"content": "Hi"}).json()["message"]
    services.message_finish(message_id=answer, error="the prompt is too long")
    message = Message.objects.get(public_id=answer)
    assert message.status == "failed" and message.error == "the prompt is too long"
    assert b"the prompt is too long" in client.get(url("detail", conversation)).content



def test_a_timed_out_answer_says_what_cut_it_and_what_to_do(team, client_for, base_model, sent, settings):
    """QA: a first answer on a busy machine read "Model (timed out)" over one word, with nothing saying
    which limit it met, where it is set, or what to do."""
    settings.TEMPER_SERVE_TIMEOUT_SECONDS = 45
    conversation = conversation_of(team, client_for, base_model)
    client = client_for(team.teammate)
    answer = client.post(url("send", conversation), {"content": "Hi"}).json()["message"]
    services.message_finish(message_id=answer, text="How", finish_reason="timeout")
    note = ("Cut short at the serve worker's time limit for an answer, 45 s (TEMPER_SERVE_TIMEOUT_SECONDS): "
            "Regenerate to ask again. A model's first answers after the serve worker loads it are slower, "
            "while its programs compile.")
    for page in (client.get(url("detail", conversation)).content.decode(),
                 client.get(reverse("chat:message", args=[team.project.slug, conversation.public_id, answer]))
                 .content.decode()):
        assert note in re.sub(r"<[^>]+>", "", page)
    finished = client.post(url("send", conversation), {"content": "Hi again"}).json()["message"]
    services.message_finish(message_id=finished, text="Hello.", finish_reason="stop")
    page = client.get(reverse("chat:message", args=[team.project.slug, conversation.public_id, finished]))
    assert "time limit" not in page.content.decode()
    for page in (client.get(url("detail", conversation)).content.decode(),  # Regenerate asks the newest turn again
                 client.get(reverse("chat:message", args=[team.project.slug, conversation.public_id, answer]))
                 .content.decode()):
        text = re.sub(r"<[^>]+>", "", page)
        assert "45 s (TEMPER_SERVE_TIMEOUT_SECONDS). A model's first answers" in text
        assert "Regenerate to ask again" not in text


def test_a_timed_out_arena_answer_is_not_told_to_regenerate(team, client_for, sent, settings):
    """An arena battle's page has no Regenerate; its timed-out answer says the limit alone."""
    from tests.webapp.chat.test_arena import start_battle
    from webapp.chat import arena

    for name in ("falcon", "heron"):
        make_base_model(team.project, name=name, path=f"/models/{name}")
    battle = start_battle(team, client_for)
    answer = arena.battle_answer(battle.side_a)
    services.message_finish(message_id=answer.public_id, text="How", finish_reason="timeout")
    client = client_for(team.teammate)
    for page in (client.get(reverse("chat:battle", args=[team.project.slug, battle.public_id])).content.decode(),
                 client.get(reverse("chat:message", args=[team.project.slug, battle.side_a.public_id,
                                                          answer.public_id])).content.decode()):
        text = re.sub(r"<[^>]+>", "", page)
        assert "time limit for an answer, 30 s (TEMPER_SERVE_TIMEOUT_SECONDS). A model's first answers" in text
        assert "Regenerate" not in text

def test_it_requires_access(team, client_for, base_model, sent):
    conversation = conversation_of(team, client_for, base_model)
    answer = client_for(team.teammate).post(url("send", conversation), {"content": "Hi"}).json()["message"]
    outsider = client_for(team.outsider)
    assert outsider.get(reverse("chat:list", args=[team.project.slug])).status_code == 404
    for user in (team.outsider, team.owner):  # conversations are private: the owner gets 404 too
        client = client_for(user)
        assert client.get(url("detail", conversation)).status_code == 404
        assert client.post(url("send", conversation), {"content": "x"}).status_code == 404
        assert client.post(url("regenerate", conversation)).status_code == 404
        assert client.get(url("message", conversation, answer)).status_code == 404
        assert client.post(url("stop", conversation, answer)).status_code == 404
        assert client.get(url("events", conversation, answer)).status_code == 404
    viewer = client_for(team.viewer)  # chatting takes the member role
    assert viewer.get(reverse("chat:list", args=[team.project.slug])).status_code == 403
    assert viewer.get(url("detail", conversation)).status_code == 403
    assert conversation.messages.count() == 2  # only the teammate's turn and its answer


def test_model_output_is_escaped_text_with_safe_markdown(team, client_for, base_model, sent):
    conversation = conversation_of(team, client_for, base_model)
    client = client_for(team.teammate)
    answer = client.post(url("send", conversation), {"content": "<b>hi</b>"}).json()["message"]
    text = "**bold** <script>alert('x')</script> <img src=x onerror=\"alert(1)\"> [link](javascript:alert(2))"
    services.message_finish(message_id=answer, text=text, finish_reason="stop")
    for response in (client.get(url("detail", conversation)), client.get(url("message", conversation, answer))):
        html = response.content.decode()
        assert "<strong>bold</strong>" in html
        assert "<script>alert" not in html and "<img" not in html and "javascript:" not in html
        assert "&lt;img src=x onerror" in html  # raw HTML is shown as the text it is
    assert "&lt;b&gt;hi&lt;/b&gt;" in client.get(url("detail", conversation)).content.decode()  # the user's text


def test_stop_sets_the_flag_the_worker_reads(team, client_for, base_model, sent, redis_server, settings):
    settings.REDIS_URL = redis_server.url
    conversation = conversation_of(team, client_for, base_model)
    client = client_for(team.teammate)
    answer = client.post(url("send", conversation), {"content": "Hi"}).json()["message"]
    assert client.post(url("stop", conversation, answer)).status_code == 200
    assert redis_client().exists(channels.stop_key(answer))


def read_events(client, path):
    async def collect():
        response = await client.get(path)
        assert response.status_code == 200 and response["Content-Type"] == "text/event-stream"
        return [json.loads(chunk.decode().removeprefix("data: ")) async for chunk in response.streaming_content]
    return async_to_sync(collect)()


def test_the_event_stream_replays_stored_events_and_ends_with_done(team, client_for, base_model, sent, redis_server,
                                                                  settings):
    settings.REDIS_URL = redis_server.url
    conversation = conversation_of(team, client_for, base_model)
    answer = client_for(team.teammate).post(url("send", conversation), {"content": "Hi"}).json()["message"]
    redis = redis_client()
    for seq, event in enumerate([{"type": "token", "text": "Hel"}, {"type": "token", "text": "lo"},
                                 {"type": "done", "text": "Hello", "finish_reason": "stop"}]):
        channels.emit(redis, answer, {"seq": seq, **event})
    client = AsyncClient()
    client.force_login(team.teammate)
    events = read_events(client, url("events", conversation, answer))
    assert [event["type"] for event in events] == ["token", "token", "done"]
    assert "".join(event["text"] for event in events[:2]) == "Hello"
    # A finished answer is served from the database, without Redis.
    services.message_finish(message_id=answer, text="Hello", finish_reason="stop", completion_tokens=2)
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    [done] = read_events(client, url("events", conversation, answer))
    assert done["type"] == "done" and done["text"] == "Hello"


def test_stop_gives_up_an_answer_no_worker_will_finish(team, client_for, base_model, sent, redis_server, settings):
    """A serve worker that died (or a lost queue message) left the answer streaming for ever: the page
    waited in silence and every new turn was refused. Past the generation timeout and the queue's grace,
    Stop fails it at once, tells the page, and the conversation goes on; a recent answer is only asked to stop."""
    from datetime import timedelta

    from django.utils import timezone

    settings.REDIS_URL = redis_server.url
    settings.TEMPER_SERVE_TIMEOUT_SECONDS = 30
    conversation = conversation_of(team, client_for, base_model)
    client = client_for(team.teammate)
    answer = client.post(url("send", conversation), {"content": "Hi"}).json()["message"]
    assert client.post(url("stop", conversation, answer)).status_code == 200
    assert Message.objects.get(public_id=answer).status == MessageStatus.STREAMING  # the worker may be on it

    asked = timezone.now() - timedelta(seconds=services.generation_expiry_seconds() + 1)
    Message.objects.filter(public_id=answer).update(created_at=asked)
    channels.emit(redis_client(), answer, {"seq": 0, "type": "token", "text": "Hel"})
    assert client.post(url("stop", conversation, answer)).status_code == 200
    lost = Message.objects.get(public_id=answer)
    assert lost.status == MessageStatus.FAILED and "no serve worker finished this answer" in lost.error
    assert channels.stored_events(redis_client(), answer)[-1] == {"seq": 1, "type": "error", "message": lost.error}
    services.message_finish(message_id=answer, text="late", finish_reason="stop")  # a late worker changes nothing
    assert Message.objects.get(public_id=answer).status == MessageStatus.FAILED
    assert client.post(url("send", conversation), {"content": "Hi again"}).status_code == 200


def test_the_event_stream_of_an_answer_no_worker_will_finish_fails_it(team, client_for, base_model, sent, settings):
    """A page left open on a lost answer reconnected every MAX_STREAM_SECONDS to a stream that never ended;
    past the generation timeout and the queue's grace the stream fails the answer and sends its error."""
    from datetime import timedelta

    from django.utils import timezone

    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # the failure does not need Redis to be told
    settings.TEMPER_SERVE_TIMEOUT_SECONDS = 30
    conversation = conversation_of(team, client_for, base_model)
    answer = client_for(team.teammate).post(url("send", conversation), {"content": "Hi"}).json()["message"]
    Message.objects.filter(public_id=answer).update(
        created_at=timezone.now() - timedelta(seconds=services.generation_expiry_seconds() + 1))
    client = AsyncClient()
    client.force_login(team.teammate)
    [event] = read_events(client, url("events", conversation, answer))
    assert event["type"] == "error" and "no serve worker finished this answer" in event["message"]
    assert Message.objects.get(public_id=answer).status == MessageStatus.FAILED


def test_a_removed_models_name_is_isolated_where_the_page_and_the_error_say_so(team, client_for, sent):
    """The conversation keeps the label of a model since removed: an RLO in it reorders nothing of the
    sentence around it, on the page or in the send error (FSI…PDI)."""
    model = make_base_model(team.project, name="tiny\u202eevil", path="/models/tiny")
    conversation = conversation_of(team, client_for, model)
    label = conversation.model_label
    assert "\u202e" in label
    model.delete()
    client = client_for(team.teammate)
    page = client.get(url("detail", conversation)).content.decode()
    assert f"The model \u2068{label}\u202c\u2069 is no longer available in this project." in page
    response = client.post(url("send", conversation), {"content": "hi"})
    assert response.status_code == 409
    # the RLO closed (PDF) inside the isolate
    assert f"the model \u2068{label}\u202c\u2069 is no longer available" in response.json()["error"]
    assert not sent


def test_a_conversation_with_a_resumed_run_says_it_trains_again_not_that_it_is_gone(team, client_for, tmp_path,
                                                                                      sent):
    """QA: while a teammate resumed the run, its conversations read 'no longer available in this project',
    as if it had been deleted; it comes back when the run succeeds."""
    from webapp.runs.models import Artifact, ArtifactKind, Run, RunStatus

    run = Run.objects.create(project=team.project, name="tuned", task="sft", status=RunStatus.SUCCEEDED,
                             spec={"task": "sft"}, resolved_spec={"output_dir": str(tmp_path)}, created_by=team.owner)
    Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, step=12, path=str(tmp_path / "export"))
    conversation = conversation_of(team, client_for, run)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    client = client_for(team.teammate)
    page = client.get(url("detail", conversation)).content.decode()
    assert "is training again (its run was resumed): the conversation goes on once the run succeeds" in page
    assert "no longer available" not in page
    response = client.post(url("send", conversation), {"content": "hi"})
    assert response.status_code == 409 and "is training again" in response.json()["error"] and not sent


def test_an_empty_answer_says_so(team, client_for, base_model, sent):
    """A model that writes only white space (the demo model's '\\n\\n\\n') left an empty box under 'Model'."""
    conversation = conversation_of(team, client_for, base_model)
    client = client_for(team.teammate)
    answer = client.post(url("send", conversation), {"content": "Hi"}).json()["message"]
    services.message_finish(message_id=answer, text="\n\n\n", finish_reason="stop", completion_tokens=4)
    for response in (client.get(url("detail", conversation)), client.get(url("message", conversation, answer))):
        assert "The answer is empty: the model wrote no visible text." in response.content.decode()
    second = client.post(url("regenerate", conversation)).json()["message"]
    services.message_finish(message_id=second, text="Hello.", finish_reason="stop", completion_tokens=2)
    assert "The answer is empty" not in client.get(url("message", conversation, second)).content.decode()


def talked(team, base_model, title, *, user=None, messages=1, minutes_ago=0):
    """A conversation of the teammate (or ``user``) with ``messages`` messages, last active ``minutes_ago``."""
    conversation = Conversation.objects.create(project=team.project, user=user or team.teammate,
                                               model_ref=base_model.public_id, model_label="Base model: tiny",
                                               title=title)
    for _ in range(messages):
        Message.objects.create(conversation=conversation, role="user", content=title)
    moment = timezone.now() - timedelta(minutes=minutes_ago)
    Conversation.objects.filter(pk=conversation.pk).update(updated_at=moment, created_at=moment)
    return conversation


def listed(page: str) -> list[str]:
    return re.findall(r'<li><a href="/p/alpha/chat/conv_\w+/">([^<]*)</a>', page)


def test_the_list_pages_through_every_conversation_newest_first(team, client_for, base_model):
    for index in range(55):
        talked(team, base_model, f"talk {index}", minutes_ago=index)
    client = client_for(team.teammate)
    first = client.get("/p/alpha/chat/").content.decode()
    assert listed(first) == [f"talk {index}" for index in range(50)]
    assert "Page 1 of 2 · 55 in all" in first and 'href="/p/alpha/chat/?page=2"' in first
    second = client.get("/p/alpha/chat/?page=2").content.decode()
    assert listed(second) == [f"talk {index}" for index in range(50, 55)]  # the oldest, no longer cut off
    assert 'href="/p/alpha/chat/?page=1"' in second and "Next" not in second
    # Answered at chat/tokens/ (a new token's secret), the links still go to the list.
    with_token = client.post("/p/alpha/chat/tokens/", {"name": "ci"}).content.decode()
    assert 'href="/p/alpha/chat/?page=2"' in with_token and listed(with_token) == listed(first)


def test_a_conversation_started_without_a_message_is_not_listed_and_later_deleted(team, client_for, base_model, sent):
    client = client_for(team.teammate)
    started = conversation_of(team, client_for, base_model)
    assert client.get(url("detail", started)).status_code == 200  # its page opens, ready for a first message
    assert listed(client.get("/p/alpha/chat/").content.decode()) == []
    assert "No conversations yet." in client.get("/p/alpha/chat/").content.decode()
    Message.objects.create(conversation=started, role="user", content="Hello")
    Conversation.objects.filter(pk=started.pk).update(title="Hello")
    assert listed(client.get("/p/alpha/chat/").content.decode()) == ["Hello"]

    left_yesterday = talked(team, base_model, "", messages=0, minutes_ago=25 * 60)
    left_just_now = talked(team, base_model, "", messages=0, minutes_ago=5)  # perhaps open in another tab
    theirs = talked(team, base_model, "", user=team.owner, messages=0, minutes_ago=25 * 60)
    old_with_messages = talked(team, base_model, "kept", minutes_ago=30 * 24 * 60)
    client.post(reverse("chat:list", args=["alpha"]), {"model": base_model.public_id, "temperature": 0.7,
                                                       "top_p": 1.0, "top_k": 0, "max_tokens": 64})
    remaining = set(Conversation.objects.values_list("pk", flat=True))
    assert left_yesterday.pk not in remaining
    assert {left_just_now.pk, theirs.pk, old_with_messages.pk, started.pk} <= remaining
    assert Conversation.objects.filter(user=team.teammate).count() == 4  # and the one just started


def test_the_model_picker_lists_a_runs_final_model_before_its_checkpoints(team, base_model, tmp_path):
    from webapp.runs.models import Artifact, ArtifactKind, Run, RunStatus

    run = Run.objects.create(project=team.project, name="tuned", task="sft", status=RunStatus.SUCCEEDED,
                             spec={"task": "sft"}, resolved_spec={"output_dir": str(tmp_path)}, created_by=team.owner)
    for step in (3, 10):
        Artifact.objects.create(run=run, kind=ArtifactKind.CHECKPOINT, step=step, path=str(tmp_path / f"export-step-{step}"))
    Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, step=12, path=str(tmp_path / "export"))
    refs = [choice.ref for choice in selectors.model_choices(project=team.project)]
    assert refs == [base_model.public_id, run.public_id, f"{run.public_id}:step-10", f"{run.public_id}:step-3"]
    # A checkpoint is found by the spec's name for it too (run_…@N, as the launch form and REST API write it).
    assert selectors.model_choice(project=team.project, ref=f"{run.public_id}@10").ref == f"{run.public_id}:step-10"
    assert selectors.model_choice(project=team.project, ref=f"{run.public_id}@4") is None
    assert selectors.model_choice(project=team.project, ref=f"{run.public_id}@{'9' * 5000}") is None


def test_an_archived_runs_models_leave_the_pickers_and_still_answer_by_ref(team, base_model, tmp_path, client_for):
    """Archived runs were still offered in the chat, the arena (which draws models at random) and
    /v1/models. Conversations and API clients that name one go on working."""
    from webapp.runs.models import Artifact, ArtifactKind, Run, RunStatus

    run = Run.objects.create(project=team.project, name="put away", task="sft", status=RunStatus.SUCCEEDED,
                             spec={"task": "sft"}, resolved_spec={"output_dir": str(tmp_path)}, created_by=team.owner,
                             archived=True)
    Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, step=12, path=str(tmp_path / "export"))
    Artifact.objects.create(run=run, kind=ArtifactKind.CHECKPOINT, step=5, path=str(tmp_path / "export-step-5"))
    assert [choice.ref for choice in selectors.model_choices(project=team.project)] == [base_model.public_id]
    assert [choice.ref for choice in selectors.model_choices(project=team.project, archived=True)] == [
        base_model.public_id, run.public_id, f"{run.public_id}:step-5"]
    assert selectors.model_choice(project=team.project, ref=run.public_id).label == "Run: put away"
    page = client_for(team.teammate).get(reverse("chat:list", args=["alpha"])).content.decode()
    assert base_model.public_id in page and run.public_id not in page
    launch = client_for(team.teammate).get("/p/alpha/runs/new/?task=sft").content.decode()
    assert run.public_id not in launch
    # Duplicating a run that started from it keeps it chosen.
    copied = Run.objects.create(project=team.project, name="from it", task="sft", created_by=team.owner,
                                spec={"task": "sft", "model": f"{run.public_id}@5"}, resolved_spec={})
    duplicate = client_for(team.teammate).get(f"/p/alpha/runs/new/?from={copied.public_id}").content.decode()
    assert f'<option value="{run.public_id}@5" selected>' in duplicate


def test_one_model_is_chosen_as_the_picker_lists_it_in_two_queries_however_many_runs(team, base_model, tmp_path,
                                                                                    django_assert_num_queries):
    """``model_choice`` (every chat turn and ``/v1`` request) reads the project's models without their runs'
    JSON columns and looks at one model's directory; what it gives is the picker's entry for that ref, the
    label made distinct from a same-named run's and the serving copy named."""
    import json

    from webapp.runs.models import Artifact, ArtifactKind, Run, RunStatus

    runs = []
    for index in range(6):
        run = Run.objects.create(project=team.project, name="tuned" if index < 2 else f"run {index}", task="sft",
                                 status=RunStatus.SUCCEEDED, spec={"task": "sft"},
                                 resolved_spec={"output_dir": str(tmp_path / str(index))}, created_by=team.owner)
        Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, path=str(tmp_path / str(index) / "export"))
        Artifact.objects.create(run=run, kind=ArtifactKind.CHECKPOINT, step=5,
                                path=str(tmp_path / str(index) / "export-step-5"))
        runs.append(run)
    copy = tmp_path / "0" / "export" / "quantized"
    copy.mkdir(parents=True)
    (copy / "quantization.json").write_text(json.dumps({"scheme": "int8"}))
    listed = selectors.model_choices(project=team.project)
    assert len(listed) == 1 + 6 * 2
    for choice in listed:
        with django_assert_num_queries(2):
            assert selectors.model_choice(project=team.project, ref=choice.ref) == choice
    first = next(choice for choice in listed if choice.ref == runs[0].public_id)
    assert first.label == f"Run: tuned ({runs[0].public_id})" and first.quantization == "int8"
    assert first.path == str(copy) and "int8 serving copy" in first.option_label
    assert next(choice for choice in listed if choice.ref == runs[2].public_id).label == "Run: run 2"


def test_penalties_and_stop_sequences_are_kept_and_sent_with_each_turn(team, client_for, base_model, sent,
                                                                       django_capture_on_commit_callbacks):
    """The panel offered no penalties or stop sequences, which the serve worker and /v1 take."""
    conversation = conversation_of(team, client_for, base_model, presence_penalty="0.5", frequency_penalty="-1.25",
                                   stop="User:\r\n\r\n###  \r\n")
    assert (conversation.presence_penalty, conversation.frequency_penalty) == (0.5, -1.25)
    assert conversation.stop == ["User:", "###  "]  # one a line, blank lines left out, spaces kept
    client = client_for(team.teammate)
    page = client.get(url("detail", conversation)).content.decode()
    assert "presence penalty 0.5 · frequency penalty -1.25" in page and 'stop "<bdi>User:</bdi>" "<bdi>###  </bdi>"' in page
    with django_capture_on_commit_callbacks(execute=True):
        client.post(url("send", conversation), {"content": "Hi"})
    [(_, [request], _)] = sent
    assert (request["presence_penalty"], request["frequency_penalty"], request["stop"]) == (0.5, -1.25,
                                                                                        ["User:", "###  "])


def test_a_stop_sequence_holds_line_breaks_written_as_escapes(team, client_for, base_model, sent,
                                                             django_capture_on_commit_callbacks):
    """A line of the box is one stop sequence, so "\n\nUser:" (a chat transcript's next turn) could not be
    given: its line break started another sequence. Within one, \n is a line break (and \t, \r, \\)."""
    conversation = conversation_of(team, client_for, base_model,
                                   stop="\\n\\nUser:\r\n\r\nTab\\there\r\nC:\\\\new \\\\n\r\n\\n")
    assert conversation.stop == ["\n\nUser:", "Tab\there", "C:\\new \\n", "\n"]
    client = client_for(team.teammate)
    page = client.get(url("detail", conversation)).content.decode()
    # As typed, where the page would have shown each line break as a space.
    assert r'stop "<bdi>\n\nUser:</bdi>" "<bdi>Tab\there</bdi>" "<bdi>C:\\new \\n</bdi>" "<bdi>\n</bdi>"' in page
    with django_capture_on_commit_callbacks(execute=True):
        client.post(url("send", conversation), {"content": "Hi"})
    [(_, [request], _)] = sent
    assert request["stop"] == ["\n\nUser:", "Tab\there", "C:\\new \\n", "\n"]


@pytest.mark.parametrize("sequences", [
    ["\n\nUser:", "###"], ["\\n is not a line break", "ends in \\"], ["\t\r\n", " spaced "], ["\\\\n\\"]])
def test_a_conversations_stop_sequences_come_back_in_a_new_conversation_with_its_settings(
        team, client_for, base_model, sequences):
    """"New conversation with these settings" fills the form with the conversation's; sent as shown, its stop
    sequences are the same ones (each backslash, line break, tab and carriage return written as its escape)."""
    original = services.conversation_create(
        project=team.project, user=team.teammate, model=selectors.model_choice(project=team.project,
                                                                            ref=base_model.public_id),
        system_prompt="Be brief.\nVery.", temperature=0.3, top_p=0.8, top_k=7, max_tokens=99, presence_penalty=0.25,
        frequency_penalty=-0.5, stop=sequences)
    client = client_for(team.teammate)
    detail = client.get(url("detail", original)).content.decode()
    link = f'{reverse("chat:list", args=[team.project.slug])}?from={original.public_id}'
    assert f'href="{link}"' in detail
    response = client.get(link)
    assert response.status_code == 200
    form = response.context["form"]
    shown = {name: form[name].value() for name in form.fields}
    assert shown["stop"] == "\n".join(forms.stop_sequence_as_typed(sequence) for sequence in sequences)
    assert len(shown["stop"].split("\n")) == len(sequences)  # one line a sequence
    response = client.post(reverse("chat:list", args=[team.project.slug]),
                           {name: "" if value is None else value for name, value in shown.items()})
    assert response.status_code == 302
    copy = Conversation.objects.exclude(pk=original.pk).get()
    kept = ("model_ref", "system_prompt", "temperature", "top_p", "top_k", "max_tokens", "presence_penalty",
            "frequency_penalty", "stop")
    assert {name: getattr(copy, name) for name in kept} == {name: getattr(original, name) for name in kept}


def test_a_new_conversation_with_the_settings_of_another_ones_conversation_is_refused(team, client_for, base_model):
    original = services.conversation_create(
        project=team.project, user=team.teammate,
        model=selectors.model_choice(project=team.project, ref=base_model.public_id), stop=["\n\nUser:"])
    link = f'{reverse("chat:list", args=[team.project.slug])}?from={original.public_id}'
    assert client_for(team.owner).get(link).status_code == 404  # conversations are private to their author
    assert client_for(team.outsider).get(link).status_code == 404
    assert client_for(team.teammate).get(f"{link}x").status_code == 404


def test_a_new_conversation_with_the_settings_of_one_whose_model_is_gone_says_so(team, client_for, base_model):
    original = services.conversation_create(
        project=team.project, user=team.teammate,
        model=selectors.model_choice(project=team.project, ref=base_model.public_id))
    base_model.delete()
    response = client_for(team.teammate).get(f'{reverse("chat:list", args=[team.project.slug])}?from={original.public_id}')
    assert response.status_code == 200
    assert "the model of that conversation, is no longer available: choose another." in response.content.decode()


def test_a_conversation_without_penalties_or_stop_sequences_sends_none(team, client_for, base_model, sent,
                                                                       django_capture_on_commit_callbacks):
    conversation = conversation_of(team, client_for, base_model)
    with django_capture_on_commit_callbacks(execute=True):
        client_for(team.teammate).post(url("send", conversation), {"content": "Hi"})
    [(_, [request], _)] = sent
    assert (request["presence_penalty"], request["frequency_penalty"], request["stop"]) == (0.0, 0.0, [])


@pytest.mark.parametrize("field, value, message", [
    ("presence_penalty", "2.5", "Presence penalty must be a number from -2 to 2."),
    ("frequency_penalty", "-3", "Frequency penalty must be a number from -2 to 2."),
    ("frequency_penalty", "much", "Frequency penalty must be a number from -2 to 2."),
    ("stop", "a\nb\nc\nd\ne", "Stop sequences: 5 given; give at most 4 stop sequences, one a line."),
])
def test_it_rejects_a_penalty_or_stop_sequences_out_of_range(team, client_for, base_model, field, value, message):
    fields = {"model": base_model.public_id, "temperature": 0.7, "top_p": 1, "top_k": 0, "max_tokens": 256,
              field: value}
    response = client_for(team.teammate).post(reverse("chat:list", args=[team.project.slug]), fields)
    assert response.status_code == 400 and not Conversation.objects.exists()
    assert message in response.content.decode()


@pytest.mark.parametrize("typed, message", [
    ("User:\n\\x0a", 'Stop sequences, line 2: "\\x" is no escape; write \\n for a line break, \\t for a tab, '
                     '\\r for a carriage return, \\\\ for a backslash.'),
    ("\n\nends in one \\", 'Stop sequences, line 3: a lone "\\" ends the line; write \\n for a line break, \\t for a '
                           'tab, \\r for a carriage return, \\\\ for a backslash.'),
])
def test_it_rejects_a_stop_sequence_it_cannot_read(team, client_for, base_model, typed, message):
    fields = {"model": base_model.public_id, "temperature": 0.7, "top_p": 1, "top_k": 0, "max_tokens": 256,
              "stop": typed}
    response = client_for(team.teammate).post(reverse("chat:list", args=[team.project.slug]), fields)
    assert response.status_code == 400 and not Conversation.objects.exists()
    assert response.context["form"].errors["stop"] == [message]


@pytest.mark.parametrize("field, value, message", [
    ("temperature", "5", "Temperature must be a number from 0 to 2."),
    ("temperature", "-0.1", "Temperature must be a number from 0 to 2."),
    ("temperature", "warm", "Temperature must be a number from 0 to 2."),
    ("top_p", "0", "Top-p must be a number from 0.01 to 1."),
    ("top_p", "", "Top-p must be a number from 0.01 to 1."),
    ("top_k", "2.5", "Top-k must be a whole number from 0 to 1000."),
    ("top_k", "5000", "Top-k must be a whole number from 0 to 1000."),
    ("max_tokens", "0", "Max tokens must be a whole number from 1 to 8192."),
    ("max_tokens", "100000", "Max tokens must be a whole number from 1 to 8192."),
])
def test_a_setting_out_of_range_is_named_with_its_range(team, client_for, base_model, field, value, message):
    """The conversation form said Django's "Ensure this value is less than or equal to 2.0." (or "Enter a whole
    number."), naming neither the setting nor how low it may go."""
    fields = {"model": base_model.public_id, "temperature": 0.7, "top_p": 1, "top_k": 0, "max_tokens": 256,
              field: value}
    response = client_for(team.teammate).post(reverse("chat:list", args=[team.project.slug]), fields)
    assert response.status_code == 400 and not Conversation.objects.exists()
    page = response.content.decode()
    assert message in page and "Ensure this value" not in page and "Enter a" not in page


def test_an_open_event_stream_fails_an_answer_once_no_worker_will_finish_it(team, client_for, base_model, sent,
                                                                            redis_server, settings, monkeypatch):
    """A page open on an answer whose serve worker was killed saw the failure only when its stream ended and
    reconnected (MAX_STREAM_SECONDS, 5 minutes); the stream now gives the answer up at its next recheck once
    no worker will finish it (``answer_is_lost``), and relays the error, which says when it was asked."""
    import asyncio
    from datetime import timedelta

    from django.utils import timezone

    from webapp.core import sse
    from webapp.core.templatetags.temper import when

    settings.REDIS_URL = redis_server.url
    settings.TEMPER_SERVE_TIMEOUT_SECONDS = 30
    monkeypatch.setattr(sse, "ACCESS_RECHECK_SECONDS", 0.5)
    conversation = conversation_of(team, client_for, base_model)
    answer = client_for(team.teammate).post(url("send", conversation), {"content": "Hi"}).json()["message"]
    asked = timezone.now() - timedelta(seconds=services.generation_expiry_seconds() - 2)  # lost in 2 s
    Message.objects.filter(public_id=answer).update(created_at=asked)
    channels.emit(redis_client(), answer, {"seq": 0, "type": "token", "text": "Hel"})  # then its worker died
    client = AsyncClient()
    client.force_login(team.teammate)

    async def collect():
        async with asyncio.timeout(20):
            response = await client.get(url("events", conversation, answer))
            return [json.loads(chunk.decode().removeprefix("data: ")) async for chunk in response.streaming_content
                    if chunk.startswith(b"data: ")]
    token, error = async_to_sync(collect)()
    assert token["text"] == "Hel" and error["type"] == "error"
    assert error["message"].startswith(f"no serve worker finished this answer, asked at {when(asked)}")
    assert Message.objects.get(public_id=answer).status == MessageStatus.FAILED


def test_the_thinking_switch_is_offered_for_a_model_whose_template_reads_it_and_sent_with_each_turn(
        team, client_for, base_model, sent, tmp_path, django_capture_on_commit_callbacks):
    thinker = make_base_model(team.project, name="thinker", path=str(thinking_model_dir(tmp_path / "thinker")))
    trained_off = make_base_model(team.project, name="trained-off", path=str(
        thinking_model_dir(tmp_path / "off", own_variables={"enable_thinking": False})))
    client = client_for(team.teammate)
    page = client.get(reverse("chat:list", args=[team.project.slug])).content.decode()
    switch = re.search(r'<input type="checkbox" name="thinking"[^>]*>', page).group(0)
    # The models that read it, each with its default: off where the model's own variables turn it off.
    assert json.loads(re.search(r'data-thinking-defaults="([^"]*)"', switch).group(1).replace("&quot;", '"')) == {
        thinker.public_id: True, trained_off.public_id: False}

    with django_capture_on_commit_callbacks(execute=True):
        off = conversation_of(team, client_for, thinker)  # the box left unticked: thinking off
        client.post(url("send", off), {"content": "2+2?"})
    assert off.enable_thinking is False
    assert sent[-1][1][0]["chat_template_kwargs"] == {"enable_thinking": False}
    assert "thinking off" in client.get(url("detail", off)).content.decode()
    # "New conversation with these settings" keeps it.
    again = client.get(reverse("chat:list", args=[team.project.slug]) + f"?from={off.public_id}").content.decode()
    assert "checked" not in re.search(r'<input type="checkbox" name="thinking"[^>]*>', again).group(0)
    off.delete()

    with django_capture_on_commit_callbacks(execute=True):
        on = conversation_of(team, client_for, thinker, thinking="on")
        client.post(url("send", on), {"content": "2+2?"})
    assert on.enable_thinking is True and sent[-1][1][0]["chat_template_kwargs"] == {"enable_thinking": True}
    on.delete()

    # A model whose template does not read it: the switch is ignored, and nothing is sent.
    with django_capture_on_commit_callbacks(execute=True):
        plain = conversation_of(team, client_for, base_model, thinking="on")
        client.post(url("send", plain), {"content": "2+2?"})
    assert plain.enable_thinking is None and "chat_template_kwargs" not in sent[-1][1][0]
    assert "thinking" not in client.get(url("detail", plain)).content.decode().split('class="chat-settings"')[1][:400]


def test_an_export_made_before_exports_kept_their_variables_defaults_to_its_runs(team, client_for, tmp_path):
    """A run's export without chat_template_kwargs.json (written before exports kept it) of a run that trained with
    thinking off offered the switch on, and was served thinking: its run's spec.yaml says the variables."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "spec.yaml").write_text("task: sft\ndata:\n  chat_template_kwargs:\n    enable_thinking: false\n")
    old_export = make_base_model(team.project, name="old-export", path=str(thinking_model_dir(tmp_path / "run" / "export")))
    page = client_for(team.teammate).get(reverse("chat:list", args=[team.project.slug])).content.decode()
    switch = re.search(r'<input type="checkbox" name="thinking"[^>]*>', page).group(0)
    assert json.loads(re.search(r'data-thinking-defaults="([^"]*)"', switch).group(1).replace("&quot;", '"')) == {
        old_export.public_id: False}


def test_a_runs_model_is_chatted_with_its_run_rows_variables_whatever_its_directory_holds(
        team, client_for, sent, tmp_path, django_capture_on_commit_callbacks):
    """A run's export made before exports kept chat_template_kwargs.json took its run's variables from the run
    directory's spec.yaml: with that file gone (or written over) the chat rendered the model otherwise than it
    was trained. The Run row's data.chat_template_kwargs decide: the Thinking switch's default, and every turn's
    variables (under the switch's own)."""
    from webapp.runs.models import Artifact, ArtifactKind, Run, RunStatus

    variables = {"enable_thinking": False, "date_string": "01 Jan 2030"}
    run = Run.objects.create(project=team.project, name="trained off", task="sft", status=RunStatus.SUCCEEDED,
                             spec={"task": "sft", "data": {"chat_template_kwargs": variables}},
                             resolved_spec={"output_dir": str(tmp_path / "run"), "data": {"chat_template_kwargs": variables}},
                             created_by=team.owner)
    (tmp_path / "run").mkdir()
    export = thinking_model_dir(tmp_path / "run" / "export")  # no chat_template_kwargs.json, no spec.yaml beside it
    Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, path=str(export))
    client = client_for(team.teammate)
    page = client.get(reverse("chat:list", args=[team.project.slug])).content.decode()
    switch = re.search(r'<input type="checkbox" name="thinking"[^>]*>', page).group(0)
    assert json.loads(re.search(r'data-thinking-defaults="([^"]*)"', switch).group(1).replace("&quot;", '"')) == {
        run.public_id: False}
    with django_capture_on_commit_callbacks(execute=True):
        conversation = conversation_of(team, client_for, run, thinking="on")
        client.post(url("send", conversation), {"content": "2+2?"})
    assert sent[-1][1][0]["chat_template_kwargs"] == {"enable_thinking": True, "date_string": "01 Jan 2030"}


def test_no_thinking_switch_where_no_model_reads_it(team, client_for, base_model):
    page = client_for(team.teammate).get(reverse("chat:list", args=[team.project.slug])).content.decode()
    assert 'name="thinking"' not in page


def test_a_project_of_hundreds_of_models_reads_no_tokenizer_again_on_each_load(team, client_for, tmp_path):
    """Whether each model's template reads enable_thinking was kept for 256 models, and the chat page asks every model
    of the project in the same order on each load: with 300 (100 base models and 200 exported runs,
    bench/pages_at_scale.py) each entry had been evicted by the time it was asked again, and every load read every
    model's tokenizer files again. A second load reads none, in as many queries for 300 models as for 30, and the
    switch of the model that reads it is still offered."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from webapp.basemodels.models import BaseModel
    from webapp.core.name_case import name_key

    make_base_model(team.project, name="thinker", path=str(thinking_model_dir(tmp_path / "thinker")))
    chat_url = reverse("chat:list", args=[team.project.slug])
    client = client_for(team.teammate)
    counts = []
    for total in (30, 300):
        BaseModel.objects.bulk_create([
            BaseModel(project=team.project, name=f"model {index}", name_key=name_key(f"model {index}"),
                      path=str(tmp_path / f"model-{index}"), architecture="LlamaForCausalLM", parameter_count=1,
                      tokenizer_type="tokenizer.json", dtype="float32", size_bytes=1)
            for index in range(BaseModel.objects.filter(project=team.project).count(), total)])
        client.get(chat_url)
        read = selectors._thinking_default.cache_info().misses
        with CaptureQueriesContext(connection) as queries:
            page = client.get(chat_url).content.decode()
        assert selectors._thinking_default.cache_info().misses == read
        assert 'name="thinking"' in page and page.count('<option value="bm_') >= total
        counts.append(len(queries))
    assert counts[0] == counts[1]


@pytest.mark.parametrize("page", ["chat:list", "chat:arena"])
def test_a_load_of_hundreds_of_models_stats_none_of_their_files_while_their_stamps_are_fresh(team, client_for, tmp_path,
                                                                                           settings, monkeypatch, page):
    """The chat list and the arena looked at each model's tokenizer, template and serving copy files (four ``stat`` calls a model, on
    every load: 0.15 ms a model at 300, bench/pages_at_scale.py). Their stamps are kept per model directory for
    TEMPER_MODEL_FILES_RECHECK_SECONDS (webapp.core.file_stamps): a load within them stats none, for 300 models as for
    30, and one after them sees a model's files written anew."""
    from webapp.basemodels.models import BaseModel
    from webapp.core.name_case import name_key

    thinker = thinking_model_dir(tmp_path / "thinker")
    make_base_model(team.project, name="thinker", path=str(thinker))
    chat_url = reverse(page, args=[team.project.slug])
    client = client_for(team.teammate)
    roots = (str(tmp_path), str(settings.DATA_ROOT))
    looked_at = []
    real_stat = os.stat

    def counted_stat(path, *args, **kwargs):
        if str(path).startswith(roots):
            looked_at.append(str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", counted_stat)
    settings.TEMPER_MODEL_FILES_RECHECK_SECONDS = 600
    # The low-disk banner's look at the data directory's disk (kept 5 s: webapp.core.disk_free) is not the models'
    # files, and a slow first load of 300 models (PostgreSQL) outlasts it: off here, so only the models' count.
    settings.TEMPER_DISK_WARN_FREE_BYTES = 0
    for total in (30, 300):
        BaseModel.objects.bulk_create([
            BaseModel(project=team.project, name=f"model {index}", name_key=name_key(f"model {index}"),
                      path=str(tmp_path / f"model-{index}"), architecture="LlamaForCausalLM", parameter_count=1,
                      tokenizer_type="tokenizer.json", dtype="float32", size_bytes=1)
            for index in range(BaseModel.objects.filter(project=team.project).count(), total)])
        looked_at.clear()
        client.get(chat_url)
        assert len(looked_at) >= 4 * total  # the new models' stamps are taken
        looked_at.clear()
        page = client.get(chat_url).content.decode()
        assert looked_at == []
        assert 'name="thinking"' in page and page.count('<option value="bm_') >= total

    (thinker / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages[0].content }}"}))
    assert 'name="thinking"' in client.get(chat_url).content.decode()  # its stamp is still fresh
    settings.TEMPER_MODEL_FILES_RECHECK_SECONDS = 0
    assert 'name="thinking"' not in client.get(chat_url).content.decode()


def test_the_thinking_switch_follows_a_changed_tokenizer_config(team, client_for, tmp_path):
    """Whether a model's template reads enable_thinking is cached by its files' times and sizes: a
    tokenizer_config.json written anew was read anew only when one of them changed. A model directory brought up to
    date as rsync -a and download tools write (the new file renamed over the old, its source's time kept) could
    keep both, and the chat offered a switch its new template no longer read, or none for one that did."""
    path = thinking_model_dir(tmp_path / "falcon")
    make_base_model(team.project, name="falcon", path=str(path))
    chat_url = reverse("chat:list", args=[team.project.slug])
    client = client_for(team.teammate)
    assert 'name="thinking"' in client.get(chat_url).content.decode()

    config = path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}))
    assert 'name="thinking"' not in client.get(chat_url).content.decode(), "written in place, at another size"

    thinking_config = json.dumps({"chat_template": factories.QWEN3_LIKE})
    plain_config = json.dumps({"chat_template": factories.QWEN3_LIKE.replace("enable_thinking", "enable_reasoner")})
    assert len(plain_config) == len(thinking_config)
    config.write_text(thinking_config)
    assert 'name="thinking"' in client.get(chat_url).content.decode()
    kept = config.stat()
    replacement = path / ".tokenizer_config.json.partial"
    replacement.write_text(plain_config)
    os.utime(replacement, ns=(kept.st_atime_ns, kept.st_mtime_ns))
    os.replace(replacement, config)
    assert (config.stat().st_mtime_ns, config.stat().st_size) == (kept.st_mtime_ns, kept.st_size)
    assert 'name="thinking"' not in client.get(chat_url).content.decode(), "renamed over it, its time kept"


def test_a_checkpoint_is_taken_in_every_spelling_the_product_shows(team, base_model, tmp_path, client_for, sent):
    """A run's checkpoint row and the REST API write a checkpoint ``run_…@N``, the chat and ``/v1/models``
    ``run_…:step-N``: the chat's ``?model=`` and its form, the launch form's ``?model=`` and a spec take either."""
    from webapp.runs.models import Artifact, ArtifactKind, Run, RunStatus

    run = Run.objects.create(project=team.project, name="tuned", task="sft", status=RunStatus.SUCCEEDED,
                             spec={"task": "sft"}, resolved_spec={"output_dir": str(tmp_path)}, created_by=team.owner)
    Artifact.objects.create(run=run, kind=ArtifactKind.CHECKPOINT, step=10, path=str(tmp_path / "export-step-10"))
    client = client_for(team.teammate)
    for spelling in (f"{run.public_id}@10", f"{run.public_id}:step-10"):
        page = client.get(reverse("chat:list", args=["alpha"]), {"model": spelling}).content.decode()
        assert f'<option value="{run.public_id}:step-10" selected>' in page, spelling
        launch = client.get("/p/alpha/runs/new/", {"task": "sft", "model": spelling}).content.decode()
        assert f'<option value="{run.public_id}@10" selected>' in launch, spelling
    response = client.post(reverse("chat:list", args=["alpha"]), {
        "model": f"{run.public_id}@10", "temperature": 0.7, "top_p": 1.0, "top_k": 0, "max_tokens": 64})
    assert response.status_code == 302
    assert Conversation.objects.get(user=team.teammate).model_ref == f"{run.public_id}:step-10"
    # The workers page names the checkpoint a serve worker loads by its number, not "step-10".
    from webapp.workers.selectors import current_jobs_shown
    key = f"{run.public_id}:step-10@{tmp_path / 'export-step-10'}"
    [shown] = current_jobs_shown(jobs=[f"worker.tasks.serve.prepare {[key]!r}"], projects={team.project.pk})
    assert shown.doing == "loading checkpoint 10 of" and shown.name == "tuned"


def test_a_new_conversation_sent_while_its_twin_is_at_work_is_told_to_try_again(team, client_for, base_model, rf,
                                                                                  monkeypatch):
    """The same form sent twice, the first still at work when the second's wait ends: the page says so (it was a
    server error: the refusal was raised through a view that expected none)."""
    import html

    from webapp.core import submissions
    from webapp.core.models import Submission

    monkeypatch.setattr(submissions, "WAIT_FOR_FIRST_SECONDS", 0.1)
    address = reverse("chat:list", args=[team.project.slug])
    fields = {"model": base_model.public_id, "system_prompt": "Be brief.", "temperature": "0.5", "top_p": "0.9",
              "top_k": "40", "max_tokens": "64", submissions.TOKEN_FIELD: "clicked-twice"}
    key = submissions._form_key(address, "clicked-twice", submissions._form_fields(rf.post(address, fields)))
    Submission.objects.create(user=team.teammate, key=key, claimed_by="the-first-sending")
    response = client_for(team.teammate).post(address, fields)
    assert response.status_code == 400
    assert submissions.STILL_BEING_PROCESSED in html.unescape(response.content.decode())
    assert not Conversation.objects.filter(project=team.project).exists()


def test_the_chat_and_the_arena_say_when_no_serve_worker_runs(team, client_for, base_model, sent, settings):
    """QA: with the serve worker stopped, a message sat under "waiting for the model…" for minutes, until it was
    given up (TEMPER_SERVE_TIMEOUT_SECONDS plus the waits for a load and the queue), and nothing said why. The chat
    and a battle's page say so at once, with how to start one; a live serve worker's heartbeat takes it away, and
    with heartbeats off (nothing tells) it is not said."""
    from webapp.chat import arena
    from webapp.workers.models import Worker

    settings.TEMPER_HEARTBEAT_SECONDS = 10
    make_base_model(team.project, name="other", path="/models/other")
    conversation = conversation_of(team, client_for, base_model)
    battle = arena.battle_create(project=team.project, user=team.teammate, prompt="Hi.",
                                 choices=selectors.model_choices(project=team.project))
    client = client_for(team.teammate)
    pages = (url("detail", conversation), reverse("chat:battle", args=[team.project.slug, battle.public_id]))
    notice = "No serve worker is running, so no answer is being written"
    for page in pages:
        text = client.get(page).content.decode()
        assert notice in text and "celery -A worker.celery worker -Q serve" in text, page
    now = timezone.now()
    # A worker of other queues, and a serve worker silent for too long or stopped, answer nothing.
    Worker.objects.create(name="default@h0", host="h0", pid=1, queues=["default"], started_at=now, last_seen=now)
    Worker.objects.create(name="serve@h1", host="h1", pid=1, queues=["serve"], started_at=now,
                          last_seen=now - timedelta(minutes=5))
    Worker.objects.create(name="serve@h2", host="h2", pid=1, queues=["serve"], started_at=now, last_seen=now,
                          stopped_at=now)
    assert all(notice in client.get(page).content.decode() for page in pages)
    Worker.objects.create(name="serve@h3", host="h3", pid=1, queues=["serve", "serve@h3.dq2"], started_at=now,
                          last_seen=now)
    assert not any(notice in client.get(page).content.decode() for page in pages)
    Worker.objects.all().delete()
    settings.TEMPER_HEARTBEAT_SECONDS = 0
    assert not any(notice in client.get(page).content.decode() for page in pages)
