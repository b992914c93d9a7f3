"""A model's chat template is its author's code: each of ``factories.HOSTILE_CHAT_TEMPLATES`` (a syntax error, its
own raise_exception, 1/0, a sandbox escape, a recursion without end, a loop without end, ...) registered as a base
model, then driven through every web entry point that renders a model's template. Each answers with the template's
file and error, in seconds: never a 500 page, a traceback, a hung request or a task that dies leaving a page
waiting. (The serve worker's side, which the chat panel, /v1 and review generation share, is in
tests/worker/test_serve.py.)"""
import html
import json
import time

import pytest

from jaxengine import chat_template
from tests import factories
from tests.webapp.factories import make_base_model, make_ready_version
from webapp.datasets import services as dataset_services
from webapp.runs import services as run_services

HOSTILE = pytest.mark.parametrize("template,message", factories.HOSTILE_CHAT_TEMPLATES.values(),
                                  ids=factories.HOSTILE_CHAT_TEMPLATES.keys())
# Each entry point may render the template a few times; none may take long past one rendering's bound.
SECONDS_ALLOWED = 4 * chat_template.MAX_RENDER_SECONDS

CHATS = [{"messages": [{"role": "user", "content": f"question {index}"},
                       {"role": "assistant", "content": f"answer {index}"}]} for index in range(4)]


def hostile_model(team, tmp_path, template):
    model_dir = factories.build_bpe_tokenizer_dir(tmp_path / "hostile", chat_template=template)
    return make_base_model(team.project, name="hostile", path=str(model_dir)), model_dir / "tokenizer_config.json"


@HOSTILE
def test_a_launch_on_a_model_whose_template_fails_is_refused_naming_its_file_and_error(
        team, tmp_path, client_for, template, message):
    """Only a data shape's refusal was checked (and only a ValueError caught): a template that failed on every chat
    launched runs that stopped at their start, or answered the launch page with a 500 (1/0, RecursionError)."""
    model, template_file = hostile_model(team, tmp_path, template)
    version = make_ready_version(team.project, rows=CHATS, user=team.teammate)
    spec = {"task": "sft", "model": model.public_id, "data": {"train": version.public_id}, "train": {"max_steps": 2}}
    started = time.monotonic()
    answer = client_for(team.teammate).post(f"/p/{team.project.slug}/runs/new/check/", {
        "mode": "yaml", "task": "sft", "spec_yaml": json.dumps(spec)})
    assert time.monotonic() - started < SECONDS_ALLOWED
    assert answer.status_code == 200
    [refusal] = answer.json()["errors"]["model"]
    assert refusal.startswith(f"{template_file}: chat template")
    assert message in refusal and "Traceback" not in refusal
    assert "It fails on a plain chat of a user turn and an assistant turn, as the run renders every row" in refusal
    assert refusal.endswith(("fix the template in that file, or choose another model",
                             "fix it or choose a model with another. It fails on a plain chat of a user turn and an "
                             "assistant turn, as the run renders every row, so the run would stop at its start"))
    assert refusal.count("fix ") == 1
    with pytest.raises(run_services.ValidationError):
        run_services.run_create(project=team.project, spec=spec, user=team.teammate)


@HOSTILE
def test_token_counts_with_a_model_whose_template_fails_say_its_file_and_error(
        team, tmp_path, client_for, template, message):
    model, template_file = hostile_model(team, tmp_path, template)
    version = make_ready_version(team.project, rows=CHATS, user=team.teammate)
    started = time.monotonic()
    version = dataset_services.token_statistics_compute(version_id=version.pk, base_model_id=model.pk)
    assert time.monotonic() - started < SECONDS_ALLOWED
    assert version.token_statistics["status"] == "failed"
    error = version.token_statistics["error"]
    assert error.startswith(f"row 1, field messages: {template_file}: chat template") and message in error
    page = client_for(team.teammate).get(f"/p/{team.project.slug}/datasets/{version.dataset.public_id}/v/1/")
    assert page.status_code == 200
    assert f"Counting tokens with <bdi>hostile</bdi> failed: {error}" in html.unescape(page.content.decode())


@HOSTILE
def test_the_chat_pages_thinking_probe_takes_a_model_whose_template_fails(team, tmp_path, client_for, template,
                                                                           message):
    hostile_model(team, tmp_path, template)
    client = client_for(team.teammate)
    for page in ("chat", "arena"):
        answer = client.get(f"/p/{team.project.slug}/{page}/")
        assert answer.status_code == 200
        assert "data-thinking-defaults" not in answer.content.decode() or '"hostile' not in answer.content.decode()


@HOSTILE
def test_a_conversation_page_shows_the_error_of_a_model_whose_template_fails_in_place_of_its_prompt(
        team, tmp_path, client_for, template, message):
    """The conversation page renders the prompt of its newest answer, what Regenerate sends (with the conversation's
    template variables): a template that fails says so there, in seconds, and the page still offers its message box."""
    from webapp.chat.models import Conversation, Message, MessageStatus, Role

    model, _config = hostile_model(team, tmp_path, template)
    conversation = Conversation.objects.create(project=team.project, user=team.teammate, model_ref=model.public_id,
                                               model_label="Base model: hostile", title="hello")
    Message.objects.create(conversation=conversation, role=Role.USER, content="hello")
    Message.objects.create(conversation=conversation, role=Role.ASSISTANT, content="hi", status=MessageStatus.COMPLETE)
    started = time.monotonic()
    page = client_for(team.teammate).get(f"/p/{team.project.slug}/chat/{conversation.public_id}/")
    assert time.monotonic() - started < SECONDS_ALLOWED
    assert page.status_code == 200
    said = html.unescape(page.content.decode())
    assert 'id="chat-prompt-error"' in said and message in said and 'id="chat-form"' in said
