"""Generations on a real serve worker (thread pool) over a real Redis: concurrent chats stream their
tokens as events and complete; a stop flag ends a generation."""
from __future__ import annotations

import pytest

from tests.factories import build_tiny_model_dir
from tests.live import wait_for
from webapp.celery import app
from webapp.chat import channels
from webapp.runs.channels import redis_client
from worker.tasks.serve import COMPILING, LOADING

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny-serve-worker"))


@pytest.fixture
def serve_worker(celery_workers, settings, redis_url):
    settings.REDIS_URL = redis_url
    celery_workers.ensure("serve")
    client = redis_client()
    return celery_workers, client


def send(model_dir, generation_id, **fields):
    app.send_task("worker.tasks.serve.generate", args=[{
        "id": generation_id, "model_key": "tiny", "model_path": str(model_dir), "project_slug": "alpha",
        "messages": [{"role": "user", "content": f"Hello {generation_id}"}], "temperature": 0.0} | fields])


def finished(client, generation_id):
    events = channels.stored_events(client, generation_id)
    return events if events and events[-1]["type"] in channels.TERMINAL_TYPES else None


def test_concurrent_chats_stream_and_complete(serve_worker, tiny_model_dir):
    workers, client = serve_worker
    ids = [f"chat-{i}" for i in range(4)]
    for generation_id in ids:
        send(tiny_model_dir, generation_id, max_new_tokens=16)
    for generation_id in ids:
        events = wait_for(lambda: finished(client, generation_id), timeout=90, workers=workers,
                          what=f"generation {generation_id}")
        types = [event["type"] for event in events]
        # Those that came before the model was loaded say so first, and those before its programs were compiled.
        loading = types.count("status")
        # the prefill's token, then each decode call's 8 (the last call's 7 reach the budget)
        assert types == ["status"] * loading + ["token"] * 3 + ["done"] and loading <= 2
        assert [event["tokens"] for event in events[loading:-1]] == [1, 8, 7]
        assert "".join(event["text"] for event in events[loading:-1]) == events[-1]["text"]


def test_the_first_answer_from_a_model_says_it_waits_for_the_model_to_load(serve_worker, tiny_model_dir):
    workers, client = serve_worker
    for generation_id in ("first-from-fresh", "second-from-fresh"):  # one after the other
        send(tiny_model_dir, generation_id, max_new_tokens=4, model_key="tiny-fresh")
        wait_for(lambda: finished(client, generation_id), timeout=90, workers=workers, what=generation_id)
    first, second = (channels.stored_events(client, generation_id)
                     for generation_id in ("first-from-fresh", "second-from-fresh"))
    assert first[0] == {"seq": 0, "type": "status",
                        "message": "loading the model: its first answer since the serve worker started"}
    # Its programs compile before its first token (the test workers have no warm-up); the second's are compiled.
    assert first[1] == {"seq": 1, "type": "status", "message": COMPILING}
    assert [event["type"] for event in first[2:]] == ["token"] * 2 + ["done"]  # 1 token, then 3 of a call
    assert [event["type"] for event in second] == ["token"] * 2 + ["done"]


def test_a_first_answers_time_limit_starts_once_its_programs_are_compiled(serve_worker, tmp_path):
    """A first chat answer could time out while its model compiled on a loaded machine: the 30 s counted from the
    request's submission, compiles included. Here a model whose programs no earlier answer compiled answers with a
    time limit shorter than its compile: the answer says it is compiling, then runs its whole budget."""
    workers, client = serve_worker
    model_dir = build_tiny_model_dir(tmp_path / "tiny-llama-fresh", preset_name="tiny-llama",
                                     tokenizer_style="sentencepiece")
    app.send_task("worker.tasks.serve.generate", args=[{
        "id": "limited-first", "model_key": "tiny-llama-fresh", "model_path": str(model_dir), "temperature": 0.0,
        "project_slug": "alpha", "messages": [{"role": "user", "content": "Hello"}], "max_new_tokens": 4, "timeout_seconds": 0.05}],
        queue="serve")
    events = wait_for(lambda: finished(client, "limited-first"), timeout=120, workers=workers, what="the answer")
    assert [event.get("message") for event in events[:2]] == [LOADING, COMPILING]
    done = events[-1]
    assert done["type"] == "done" and done["finish_reason"] == "length" and done["completion_tokens"] == 4, done
    # The load and compile took longer than the answer's time limit (0.2 s was too close: a clean-clone CI compiled
    # in 0.197 s); the limit's clock starts at the 3-token decode call's dispatch, read back before it is looked at.
    assert done["first_token_seconds"] > 0.05


def test_a_stopped_generation_ends_as_cancelled(serve_worker, tiny_model_dir):
    # Mid-answer stops are timed in tests/worker/test_serve.py; the tiny model here answers 150 tokens
    # faster than a test can react, so the flag is raised before the worker reads it.
    workers, client = serve_worker
    channels.request_stop(client, "stopped")
    send(tiny_model_dir, "stopped", max_new_tokens=150)
    events = wait_for(lambda: finished(client, "stopped"), timeout=90, workers=workers, what="the stopped answer")
    assert events[-1].get("finish_reason") == "cancelled", events[-1]
    assert events[-1]["completion_tokens"] == 0


def test_a_serving_copy_asked_for_is_written_by_the_serve_worker_then_served(serve_worker, transactional_db):
    """A base model's copy asked for as the page asks (the service, its message on the serve queue): the
    serve worker writes it, the model's ref then resolves to the copy, and a chat through it answers."""
    from django.conf import settings

    from tests.webapp.factories import make_base_model, make_ready_version, make_team
    from webapp.chat.selectors import model_choice
    from webapp.runs import serving_copies
    from webapp.runs.models import ServingCopy, ServingCopyStatus

    workers, client = serve_worker
    team = make_team()
    model_dir = build_tiny_model_dir(settings.MODELS_ROOT / "tiny-serving-copy")
    base_model = make_base_model(team.project, name="tiny", path=str(model_dir))
    questions = make_ready_version(team.project, name="questions", kind="prompts",
                                   rows=[{"prompt": "Hello there", "answer": "general"}, {"prompt": "a b c", "answer": "d"}])
    unquantized = model_choice(project=team.project, ref=base_model.public_id)
    assert unquantized.path == str(model_dir) and unquantized.quantization == ""
    copy, queued = serving_copies.serving_copy_request(project=team.project, user=team.teammate,
                                                       base_model=base_model, scheme="int4", eval_version=questions)
    assert queued
    _, queued_again = serving_copies.serving_copy_request(project=team.project, user=team.teammate,
                                                          base_model=base_model, scheme="int4")
    assert not queued_again  # while the worker writes it
    wait_for(lambda: ServingCopy.objects.get(pk=copy.pk).status != ServingCopyStatus.WRITING, timeout=120,
             workers=workers, what="the serving copy")
    copy.refresh_from_db()
    assert copy.status == ServingCopyStatus.READY, copy.error_message
    state = serving_copies.base_model_serving_copy(base_model=base_model)
    assert state["state"] == "ready" and state["scheme"] == "int4" and state["eval_prompts"] == 2
    assert state["ratio_to_bfloat16"] < 0.6 and 0 <= state["greedy_agreement"] <= 1
    served = model_choice(project=team.project, ref=base_model.public_id)
    assert served.path == str(serving_copies.base_model_copy_dir(base_model)) and served.quantization == "int4"
    app.send_task("worker.tasks.serve.generate", args=[{
        "id": "through-the-copy", "model_key": served.cache_key, "model_path": served.path,
        "project_slug": team.project.slug, "messages": [{"role": "user", "content": "Hello"}], "temperature": 0.0,
        "max_new_tokens": 6}], queue="serve")
    events = wait_for(lambda: finished(client, "through-the-copy"), timeout=90, workers=workers, what="the answer")
    assert events[-1]["type"] == "done" and events[-1]["completion_tokens"] == 6


def test_an_arena_battle_with_thinking_off_is_rendered_so_by_the_serve_worker(serve_worker, transactional_db):
    """An arena battle's Thinking switch (off) reaches the serve worker for both sides: each side's prompt is rendered
    with Qwen3's empty think block after the generation prompt (its done event counts those prompt tokens), where
    the battle without it is rendered as the model's template does by default (thinking on)."""
    import json
    from pathlib import Path

    from django.conf import settings

    from jaxengine.data.pipeline import encode_prompt
    from jaxengine.tokenizer import load_tokenizer
    from tests.webapp.factories import make_base_model, make_team
    from webapp.chat import arena, selectors

    workers, client = serve_worker
    team = make_team()
    template = (Path(__file__).parents[1] / "jaxengine/tokenizer/real_templates/qwen3.jinja").read_text(encoding="utf-8")
    for name in ("thinker-a", "thinker-b"):
        model_dir = build_tiny_model_dir(settings.MODELS_ROOT / f"tiny-arena-{name}")
        config = json.loads((model_dir / "tokenizer_config.json").read_text())
        config["chat_template"] = template
        (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
        make_base_model(team.project, name=name, path=str(model_dir))
    tokenizer = load_tokenizer(model_dir)
    asked = [{"role": "user", "content": "Name a colour."}]
    off, default = len(encode_prompt(tokenizer, asked, enable_thinking=False)), len(encode_prompt(tokenizer, asked))
    assert off > default

    for enable_thinking, prompt_tokens in ((False, off), (None, default)):
        battle = arena.battle_create(project=team.project, user=team.teammate, prompt="Name a colour.",
                                     choices=selectors.model_choices(project=team.project),
                                     enable_thinking=enable_thinking)
        for side in (battle.side_a, battle.side_b):
            answer = arena.battle_answer(side).public_id
            events = wait_for(lambda: finished(client, answer), timeout=120, workers=workers, what="a side's answer")
            assert events[-1]["type"] == "done", events[-1]
            assert events[-1]["prompt_tokens"] == prompt_tokens, (enable_thinking, events[-1])


def test_requests_queued_before_the_project_was_named_are_answered_or_end_saying_why(serve_worker, transactional_db,
                                                                                   tiny_model_dir):
    """Requests a web queued before the upgrade that made ``project_slug`` required (answers waiting in the serve queue
    through a deploy) ended with pydantic's "1 validation error for GenerateRequest ... Field required" and the
    request itself. A chat answer, whose row names its conversation's project, is written as asked; an API
    completion, whose project nothing names, ends with an error event that says what to do."""
    from tests.webapp.factories import make_team
    from webapp.chat.models import Conversation, Message, MessageStatus, Role
    from worker.tasks.serve import PROJECT_NOT_NAMED

    workers, client = serve_worker
    team = make_team()
    conversation = Conversation.objects.create(project=team.project, user=team.teammate, model_ref="base_tiny",
                                               model_label="Base model: tiny", title="Hello")
    Message.objects.create(conversation=conversation, role=Role.USER, content="Hello")
    answer = Message.objects.create(conversation=conversation, role=Role.ASSISTANT, status=MessageStatus.STREAMING)
    for generation_id, message in ((answer.public_id, answer.public_id), ("api-from-before", None)):
        app.send_task("worker.tasks.serve.generate", queue="serve", args=[{  # as the web sent it before the upgrade
            "id": generation_id, "message": message, "model_key": "tiny", "model_path": str(tiny_model_dir),
            "messages": [{"role": "user", "content": "Hello"}], "temperature": 0.0, "max_new_tokens": 4}])
    chat = wait_for(lambda: finished(client, answer.public_id), timeout=90, workers=workers, what="the chat answer")
    assert chat[-1]["type"] == "done" and chat[-1]["completion_tokens"] == 4, chat[-1]
    answer.refresh_from_db()
    assert answer.status == MessageStatus.COMPLETE and answer.content == chat[-1]["text"] and not answer.error
    api = wait_for(lambda: finished(client, "api-from-before"), timeout=90, workers=workers, what="the API completion")
    assert api == [{"seq": 0, "type": "error", "message": PROJECT_NOT_NAMED}]
