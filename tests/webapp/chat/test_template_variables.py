"""A conversation's chat template variables: the new conversation form offers those the picked model's template reads
(with the model's own values), the conversation keeps them and sends them with every turn and regenerate, the prompt
the model reads holds them (a real tokenizer renders it), bad values are refused before anything is sent, compare mode
gives each side those its template reads, and a stored value is shown as escaped text."""
import html
import json
import re
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from jaxengine.data.pipeline import encode_prompt
from jaxengine.tokenizer import load_tokenizer
from tests.factories import build_bpe_tokenizer_dir
from tests.webapp.factories import make_base_model
from webapp.chat import arena, selectors, services
from webapp.chat.models import Battle, Conversation, Message

# ChatML with a persona (text), a terse switch (boolean) and a style the template itself checks.
PERSONA_TEMPLATE = (
    "{% if persona %}<|im_start|>system\nYou are {{ persona }}.<|im_end|>\n{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
    "{% if style is defined and style not in ['plain', 'rhyme'] %}"
    "{{ raise_exception('style must be plain or rhyme, not ' + style) }}{% endif %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if terse %}Briefly: {% endif %}{% endif %}")


@pytest.fixture
def persona_model(team, tmp_path):
    """A base model with a real byte-level BPE tokenizer whose chat template reads persona, terse and style."""
    path = build_bpe_tokenizer_dir(tmp_path / "persona", chat_template=PERSONA_TEMPLATE)
    return make_base_model(team.project, name="persona", path=str(path))


def start(client, team, model, **fields):
    return client.post(reverse("chat:list", args=[team.project.slug]),
                       {"model": model.public_id, "temperature": 0.7, "top_p": 1.0, "top_k": 0, "max_tokens": 64,
                        **fields})


def url(name, conversation):
    return reverse(f"chat:{name}", args=[conversation.project.slug, conversation.public_id])


def said(response) -> str:
    """A response's text as a person reads it: entities decoded, the bidi isolates around names dropped."""
    return html.unescape(response.content.decode()).replace("\u2068", "").replace("\u2069", "")


def field_tag(page: str, name: str) -> str:
    return re.search(rf'<(?:input|select)[^>]*name="var_{name}"[^>]*>', page).group(0)


def test_the_form_offers_the_variables_the_picked_models_template_reads_with_the_models_own_values(
        team, client_for, persona_model, tmp_path):
    from webapp.runs.models import Artifact, ArtifactKind, Run, RunStatus

    run = Run.objects.create(project=team.project, name="sailor", task="sft", status=RunStatus.SUCCEEDED,
                             spec={"task": "sft"}, created_by=team.owner,
                             resolved_spec={"data": {"chat_template_kwargs": {"persona": "a sailor", "terse": True}}})
    export = build_bpe_tokenizer_dir(tmp_path / "run" / "export", chat_template=PERSONA_TEMPLATE)
    Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, path=str(export))
    plain = make_base_model(team.project, name="a-plain", path=str(build_bpe_tokenizer_dir(tmp_path / "plain")))
    client = client_for(team.teammate)

    page = client.get(reverse("chat:list", args=[team.project.slug])).content.decode()  # a-plain is picked first
    persona = field_tag(page, "persona")
    assert "disabled" in persona  # a-plain's ChatML template reads none: hidden, and not sent
    assert json.loads(html.unescape(re.search(r'data-template-variable="([^"]*)"', persona).group(1))) == {
        persona_model.public_id: "", run.public_id: "a sailor"}  # each model's own value: the run's from its Run row
    assert field_tag(page, "terse").startswith("<select")  # the template only asks whether it holds
    for passed in ("bos_token", "eos_token", "tools", "messages", "add_generation_prompt", "raise_exception"):
        assert f'name="var_{passed}"' not in page
    assert plain.public_id in page

    page = client.get(reverse("chat:list", args=[team.project.slug]) + f"?model={run.public_id}").content.decode()
    persona = field_tag(page, "persona")
    assert "disabled" not in persona and 'value="a sailor"' in persona
    assert 'value="true" selected' in page.split('name="var_terse"', 1)[1].split("</select>", 1)[0]


def test_llama3s_tool_lists_are_not_offered_as_text(team, client_for, sent, tmp_path):
    """Llama 3.3's real template iterates custom_tools and joins builtin_tools: a text box would hand it a string
    (tools reach it through /v1's tools). Only tools_in_user_message, a switch, is offered; a list variable sent
    anyway is refused by name, saying why."""
    template = (Path(__file__).parents[2] / "jaxengine" / "tokenizer" / "real_templates" / "llama3_3.jinja").read_text()
    model = make_base_model(team.project, name="llama", path=str(
        build_bpe_tokenizer_dir(tmp_path / "llama", style="llama3", chat_template=template)))
    client = client_for(team.teammate)
    page = client.get(reverse("chat:list", args=[team.project.slug]) + f"?model={model.public_id}").content.decode()
    assert field_tag(page, "tools_in_user_message").startswith("<select")
    assert 'name="var_custom_tools"' not in page and 'name="var_builtin_tools"' not in page

    why = ("builtin_tools: the chat template of Base model: llama reads it as a list or mapping, which a chat does not "
           "set (tools reach it through a /v1 request's tools); leave it")
    response = start(client, team, model, var_builtin_tools="brave_search")
    assert response.status_code == 400 and f"Template variable {why} empty" in said(response)
    assert not Conversation.objects.filter(project=team.project).exists()
    with pytest.raises(ValidationError) as refused:
        services.checked_template_variables(model=selectors.model_choice(project=team.project, ref=model.public_id),
                                            variables={"builtin_tools": "brave_search"})
    assert [message.replace("\u2068", "").replace("\u2069", "") for message in refused.value.messages] == [why + " out"]


def test_enable_thinking_stays_the_thinking_switch(team, client_for, tmp_path):
    from tests.webapp.factories import thinking_model_dir

    make_base_model(team.project, name="thinker", path=str(thinking_model_dir(tmp_path / "thinker")))
    page = client_for(team.teammate).get(reverse("chat:list", args=[team.project.slug])).content.decode()
    assert 'name="thinking"' in page and 'name="var_enable_thinking"' not in page


def test_the_conversation_keeps_its_variables_and_every_turn_renders_them(
        team, client_for, persona_model, sent, django_capture_on_commit_callbacks):
    client = client_for(team.teammate)
    response = start(client, team, persona_model, var_persona="a pirate <b>bold</b>", var_terse="true",
                     var_style="rhyme")
    assert response.status_code == 302
    conversation = Conversation.objects.get(project=team.project, user=team.teammate)
    assert conversation.template_variables == {"persona": "a pirate <b>bold</b>", "terse": True, "style": "rhyme"}

    with django_capture_on_commit_callbacks(execute=True):
        answer = client.post(url("send", conversation), {"content": "Hello"}).json()["message"]
    [(_name, [request], _queue)] = sent
    assert request["chat_template_kwargs"] == {"persona": "a pirate <b>bold</b>", "terse": True, "style": "rhyme"}
    # The prompt the serve worker encodes (encode_prompt, as worker.tasks.serve does) holds them.
    tokenizer = load_tokenizer(persona_model.path)
    prompt = tokenizer.decode(encode_prompt(tokenizer, request["messages"], **request["chat_template_kwargs"]),
                              skip_special_tokens=False)
    assert prompt == ("<|im_start|>system\nYou are a pirate <b>bold</b>.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
                      "<|im_start|>assistant\nBriefly: ")

    services.message_finish(message_id=answer, text="Arr.", finish_reason="stop")
    with django_capture_on_commit_callbacks(execute=True):
        assert client.post(url("regenerate", conversation)).status_code == 200
    assert sent[-1][1][0]["chat_template_kwargs"] == request["chat_template_kwargs"]

    page = client.get(url("detail", conversation)).content.decode()
    assert "<b>bold</b>" not in page  # shown as the text it is, in the settings and in the prompt
    assert 'persona = <bdi>&quot;a pirate &lt;b&gt;bold&lt;/b&gt;&quot;</bdi>' in page
    assert "terse = <bdi>true</bdi>" in page
    shown = html.unescape(page.split('id="chat-prompt"', 1)[1].split("<pre", 1)[1].split(">", 1)[1].split("</pre>")[0])
    assert shown.startswith("<|im_start|>system\nYou are a pirate <b>bold</b>.<|im_end|>")

    # "New conversation with these settings" brings them back.
    again = client.get(reverse("chat:list", args=[team.project.slug]) + f"?from={conversation.public_id}").content.decode()
    assert 'value="a pirate &lt;b&gt;bold&lt;/b&gt;"' in field_tag(again, "persona")


def test_the_prompt_shown_is_what_the_serve_worker_encodes(team, client_for, sent, tmp_path,
                                                           django_capture_on_commit_callbacks):
    """The *Prompt* section shows the tokens the serve worker encodes for the next answer, decoded: the BOS token it
    adds where the template writes none, and without the oldest turns that a long conversation leaves out to fit the
    model's context (worker.tasks.serve.fit_to_context)."""
    from worker.tasks import serve

    path = build_bpe_tokenizer_dir(tmp_path / "short", style="llama3", chat_template=PERSONA_TEMPLATE)
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 400}))
    model = make_base_model(team.project, name="short", path=str(path))
    client = client_for(team.teammate)
    start(client, team, model, system_prompt="Be kind.", var_persona="a poet")
    conversation = Conversation.objects.get(project=team.project)
    for turn in range(6):
        Message.objects.create(conversation=conversation, role="user", content=f"question {turn}: " + "why " * 8)
        Message.objects.create(conversation=conversation, role="assistant", content=f"answer {turn}: " + "so " * 8)
    with django_capture_on_commit_callbacks(execute=True):
        client.post(url("send", conversation), {"content": "And now?"})
    [(_name, [request], _queue)] = sent

    tokenizer = load_tokenizer(model.path)
    ids, _max_new_tokens = serve.fit_to_context(serve.GenerateRequest.model_validate(request), tokenizer, 400)
    encoded = tokenizer.decode(list(ids), skip_special_tokens=False)
    assert encoded.startswith("<|begin_of_text|><|im_start|>system\nYou are a poet.")  # the worker's BOS
    assert "question 5" in encoded and "question 4" not in encoded  # the oldest 5 pairs left out
    page = client.get(url("detail", conversation)).content.decode()
    shown = html.unescape(page.split('id="chat-prompt"', 1)[1].split("<pre", 1)[1].split(">", 1)[1].split("</pre>")[0])
    assert shown == encoded
    assert "the oldest 10 messages are left out" in said(page_section(page, "chat-prompt"))


def test_the_prompt_shown_is_what_regenerate_sends(team, client_for, sent, tmp_path, django_capture_on_commit_callbacks):
    """The *Prompt* section rendered the whole conversation and then the model's answer cue, right after the last
    answer: a prompt nothing sends (a message sent adds its turn first; Regenerate leaves out the answer it replaces).
    It shows what Regenerate sends, the newest answer's own prompt, and says so."""
    from worker.tasks import serve

    path = build_bpe_tokenizer_dir(tmp_path / "chatml", style="llama3", chat_template=PERSONA_TEMPLATE)
    model = make_base_model(team.project, name="chatml", path=str(path))
    client = client_for(team.teammate)
    start(client, team, model, system_prompt="Be kind.", var_persona="a poet")
    conversation = Conversation.objects.get(project=team.project)
    Message.objects.create(conversation=conversation, role="user", content="Name a river.")
    Message.objects.create(conversation=conversation, role="assistant", content="The Rhine.")
    page = client.get(url("detail", conversation)).content.decode()
    shown = html.unescape(page.split('id="chat-prompt"', 1)[1].split("<pre", 1)[1].split(">", 1)[1].split("</pre>")[0])

    with django_capture_on_commit_callbacks(execute=True):
        assert client.post(url("regenerate", conversation)).status_code == 200
    [(_name, [request], _queue)] = sent
    tokenizer = load_tokenizer(model.path)
    ids, _max_new_tokens = serve.fit_to_context(serve.GenerateRequest.model_validate(request), tokenizer, 4096)
    assert shown == tokenizer.decode(list(ids), skip_special_tokens=False)
    assert shown.endswith("<|im_start|>user\nName a river.<|im_end|>\n<|im_start|>assistant\n")
    assert "The Rhine." not in shown
    assert "<summary>Prompt of the newest answer (what Regenerate sends)</summary>" in page


def test_a_conversation_with_no_answer_yet_shows_no_prompt(team, client_for, persona_model):
    """No answer, nothing to regenerate: no prompt is shown (a system prompt alone rendered it, with the answer cue
    after it, which nothing sends either)."""
    client = client_for(team.teammate)
    start(client, team, persona_model, system_prompt="Be kind.", var_persona="a poet")
    page = client.get(url("detail", Conversation.objects.get(project=team.project))).content.decode()
    assert 'id="chat-prompt"' not in page and 'id="chat-prompt-error"' not in page


def page_section(page: str, element_id: str):
    class Section:
        content = page.split(f'id="{element_id}"', 1)[1].split("</details>", 1)[0].encode()

    return Section()


@pytest.mark.parametrize(("fields", "message"), [
    ({"var_style": "jazz"}, "the chat template of Base model: persona fails with the template variables "
                            'style = "jazz": chat template line 5: style must be plain or rhyme, not jazz'),
    ({"var_colour": "red"}, "Template variable colour: the chat template of Base model: persona does not read it "
                            "(it reads persona, style, terse)"),
    ({"var_persona": "x" * 4_001}, "at most 4000 characters"),
    ({"var_persona": "a\x00b"}, "Null characters are not allowed"),
    ({"var_terse": "maybe"}, "Select a valid choice"),
])
def test_it_rejects_a_variable_the_template_fails_on_does_not_read_or_cannot_hold(
        team, client_for, persona_model, sent, fields, message):
    response = start(client_for(team.teammate), team, persona_model, **fields)
    assert response.status_code == 400
    assert message in said(response)
    assert not Conversation.objects.filter(project=team.project).exists() and not sent


def test_it_rejects_more_variables_than_a_conversation_keeps(team, client_for, sent, tmp_path):
    names = [f"v{index:02}" for index in range(services.TEMPLATE_VARIABLES_MAX + 1)]
    template = "".join(f"{{{{ {name} }}}}" for name in names) + "{% for m in messages %}{{ m.content }}{% endfor %}"
    model = make_base_model(team.project, name="many", path=str(build_bpe_tokenizer_dir(tmp_path / "many",
                                                                                      chat_template=template)))
    client = client_for(team.teammate)
    response = start(client, team, model, **{f"var_{name}": "x" for name in names})
    assert response.status_code == 400
    assert "17 template variables given; set at most 16" in said(response)
    assert start(client, team, model, **{f"var_{name}": "x" for name in names[:16]}).status_code == 302
    assert Conversation.objects.get(project=team.project).template_variables == {name: "x" for name in names[:16]}


def test_a_turn_the_template_fails_on_with_the_conversations_variables_sends_nothing(
        team, client_for, persona_model, sent, tmp_path):
    """The model's template changed since (a style it took is now refused): the message is refused with the
    template's line and message, and neither the turn nor an answer is saved or sent."""
    client = client_for(team.teammate)
    start(client, team, persona_model, var_style="rhyme")
    conversation = Conversation.objects.get(project=team.project)
    (tmp_path / "persona" / "tokenizer_config.json").write_text(json.dumps({
        **json.loads((tmp_path / "persona" / "tokenizer_config.json").read_text()),
        "chat_template": PERSONA_TEMPLATE.replace("'rhyme'", "'verse'")}))
    response = client.post(url("send", conversation), {"content": "Hello"})
    assert response.status_code == 400
    assert response.json()["error"].replace("\u2068", "").replace("\u2069", "").startswith(
        'template_variables: the chat template of Base model: persona fails with the template variables style = "rhyme": '
        "chat template line 5: style must be plain or rhyme, not rhyme. Nothing was sent")
    assert not Message.objects.filter(conversation=conversation).exists() and not sent


def test_a_turn_the_template_now_fails_on_is_refused_in_a_conversation_without_variables(
        team, client_for, persona_model, sent, tmp_path, django_capture_on_commit_callbacks):
    """The check of each turn is not only for conversations that set variables: a model whose template now refuses
    the conversation (a system turn, here) gets the same refusal, for a sent message and a regenerated answer, before
    anything is saved or sent; the serve worker would only fail the answer."""
    client = client_for(team.teammate)
    start(client, team, persona_model, system_prompt="Be kind.")
    conversation = Conversation.objects.get(project=team.project)
    assert conversation.template_variables == {}
    with django_capture_on_commit_callbacks(execute=True):
        answer = client.post(url("send", conversation), {"content": "Hello"}).json()["message"]
    services.message_finish(message_id=answer, text="Hi.", finish_reason="stop")
    config = tmp_path / "persona" / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "chat_template": (
        "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
        + PERSONA_TEMPLATE)}))
    sent.clear()

    for response in (client.post(url("send", conversation), {"content": "Again"}),
                     client.post(url("regenerate", conversation))):
        assert response.status_code == 400
        assert response.json()["error"].replace("\u2068", "").replace("\u2069", "").startswith(
            "chat_template: the chat template of Base model: persona fails on this conversation: chat template line 1: "
            "System role not supported. Nothing was sent")
    assert [message.content for message in Message.objects.filter(conversation=conversation)] == ["Hello", "Hi."]
    assert not sent


def test_an_outsider_still_gets_404(team, client_for, persona_model, sent):
    start(client_for(team.teammate), team, persona_model, var_persona="a secret persona")
    conversation = Conversation.objects.get(project=team.project)
    for user in (team.outsider, team.owner):
        response = client_for(user).get(url("detail", conversation))
        assert response.status_code == 404 and b"a secret persona" not in response.content


def test_compare_mode_offers_a_switch_as_the_chat_panel_does(team, client_for, persona_model, sent, tmp_path):
    """QA: compare mode showed terse, which the template only asks whether it holds, as a text box where the chat panel
    shows a true/false select. It is the chat panel's field (forms.template_variable_field), kept as sent on a refused
    battle."""
    twin = make_base_model(team.project, name="twin", path=str(
        build_bpe_tokenizer_dir(tmp_path / "twin", chat_template=PERSONA_TEMPLATE)))
    client = client_for(team.teammate)
    arena_url = reverse("chat:arena", args=[team.project.slug])
    page = client.get(arena_url).content.decode()
    assert field_tag(page, "terse").startswith("<select") and field_tag(page, "persona").startswith("<input")
    assert "disabled" in field_tag(page, "terse")  # a blind battle (the default) takes none

    pair = {"prompt": "Hi", "model_a": persona_model.public_id, "model_b": twin.public_id}
    response = client.post(arena_url, {**pair, "var_terse": "true", "var_style": "jazz"})
    assert response.status_code == 400 and "style must be plain or rhyme, not jazz" in said(response)
    again = response.content.decode()
    assert "disabled" not in field_tag(again, "terse")
    assert 'value="true" selected' in again.split('name="var_terse"', 1)[1].split("</select>", 1)[0]
    assert 'value="jazz"' in field_tag(again, "style")

    assert client.post(arena_url, {**pair, "var_terse": "false", "var_style": ""}).status_code == 302
    battle = Battle.objects.get(project=team.project)
    assert battle.side_a.template_variables == battle.side_b.template_variables == {"terse": False}


def test_compare_mode_sends_each_side_the_variables_its_template_reads(team, client_for, persona_model, sent,
                                                                       tmp_path):
    plain = make_base_model(team.project, name="plain", path=str(build_bpe_tokenizer_dir(tmp_path / "plain")))
    twin = make_base_model(team.project, name="twin", path=str(
        build_bpe_tokenizer_dir(tmp_path / "twin", chat_template=PERSONA_TEMPLATE)))
    client = client_for(team.teammate)
    page = client.get(reverse("chat:arena", args=[team.project.slug])).content.decode()
    assert 'name="var_persona"' in page and 'name="var_bos_token"' not in page
    arena_url = reverse("chat:arena", args=[team.project.slug])

    response = client.post(arena_url, {"prompt": "Hi", "model_a": persona_model.public_id, "model_b": plain.public_id,
                                       "var_persona": "a poet", "var_terse": "true", "var_style": ""})
    assert response.status_code == 302
    battle = Battle.objects.get(project=team.project)
    assert battle.side_a.template_variables == {"persona": "a poet", "terse": True}
    assert battle.side_b.template_variables == {}  # plain's template reads neither
    battle_page = client.get(reverse("chat:battle", args=[team.project.slug, battle.public_id])).content.decode()
    assert 'persona = <bdi>&quot;a poet&quot;</bdi>' in battle_page and battle_page.count("persona = ") == 1
    for side in (battle.side_a, battle.side_b):  # voted: "Another battle with this prompt" sends them again
        services.message_finish(message_id=arena.battle_answer(side).public_id, text="Hi.", finish_reason="stop")
    arena.battle_vote(battle=battle, outcome="a")
    battle_page = client.get(reverse("chat:battle", args=[team.project.slug, battle.public_id])).content.decode()
    again = battle_page.split('class="arena-vote arena-next"', 1)[1].split("</form>", 1)[0]
    assert '<input type="hidden" name="var_persona" value="a poet">' in again
    assert '<input type="hidden" name="var_terse" value="true">' in again

    for fields, message in (({"var_colour": "red"}, "colour: neither model's chat template reads it"),
                            ({"var_style": "jazz"}, "style must be plain or rhyme, not jazz")):
        response = client.post(arena_url, {"prompt": "Hi", "model_a": persona_model.public_id,
                                           "model_b": twin.public_id, **fields})
        assert response.status_code == 400 and message in said(response)
    response = client.post(arena_url, {"prompt": "Hi", "var_persona": "a poet"})  # blind: the models are secret
    assert response.status_code == 400 and "template variables are for compare mode" in said(response)
    assert Battle.objects.filter(project=team.project).count() == 1

    pair = tuple(selectors.model_choice(project=team.project, ref=model.public_id) for model in (persona_model, twin))
    both = arena.battle_create(project=team.project, user=team.teammate, prompt="Hi", choices=list(pair),
                               compare=pair, template_variables={"persona": "a poet"})
    assert both.side_a.template_variables == both.side_b.template_variables == {"persona": "a poet"}
