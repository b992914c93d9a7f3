"""Chat in a browser, against the real ASGI server and a real serve worker: start a conversation with
a base model, send a message, and see the answer arrive part by part (the tokens of one decode call at a
time) before the finished answer replaces them (rendered as sanitized Markdown)."""
from __future__ import annotations

import pytest

from tests.browser.test_runs import asgi_server, log_in  # noqa: F401  (the module's uvicorn fixture)
from tests.factories import build_tiny_model_dir
from tests.webapp.factories import make_base_model, make_team
from webapp.chat.models import Message

pytestmark = pytest.mark.browser

# Records the streaming answer's text at every change, before the page swaps in the finished answer.
RECORD_STREAM = """() => {
    window.streamSnapshots = [];
    new MutationObserver(() => {
        const streaming = document.querySelector('.chat-streaming');
        if (streaming) window.streamSnapshots.push(streaming.textContent);
    }).observe(document.getElementById('chat-log'), {subtree: true, childList: true, characterData: true});
}"""


def test_tokens_arrive_before_the_answer_is_complete(page, asgi_server, celery_workers, transactional_db,  # noqa: F811
                                                     settings):
    celery_workers.ensure("serve")
    team = make_team()
    model_dir = build_tiny_model_dir(settings.MODELS_ROOT / "tiny-chat")
    base_model = make_base_model(team.project, name="tiny", path=str(model_dir))
    log_in(page, asgi_server, team.teammate.username)
    page.goto(f"{asgi_server}/p/{team.project.slug}/chat/")
    page.select_option("#id_model", base_model.public_id)
    page.fill("#id_temperature", "0")
    # 64 tokens stream as 9 events: the prefill's token, then 8 of each decode call (one event a call)
    page.fill("#id_max_tokens", "64")
    page.get_by_role("button", name="Start").click()
    page.wait_for_selector("#chat-form")
    # chat.js (end of the body) binds Enter: the form is on the page before it has run, and a key pressed
    # then only adds a line (seen once in a full, loaded suite run).
    page.wait_for_load_state("load")
    page.evaluate(RECORD_STREAM)
    page.fill("#chat-form textarea", "Hello <b>model</b>")
    page.get_by_role("button", name="Send").click()
    page.wait_for_selector(".chat-assistant .chat-markdown", timeout=90_000)
    answer = Message.objects.get(conversation__user=team.teammate, role="assistant")
    assert answer.status == "complete" and answer.completion_tokens == 64
    snapshots = [text for text in page.evaluate("window.streamSnapshots") if text]
    # Many partial texts, each extending the previous one, the last being the whole answer.
    assert len(set(snapshots)) >= 5
    assert all(later.startswith(earlier) for earlier, later in zip(snapshots, snapshots[1:]))
    assert snapshots[-1] == answer.content
    assert not page.get_by_role("button", name="Stop").is_visible()  # shown only while an answer streams
    assert page.locator(".chat-user .chat-text").inner_text() == "Hello <b>model</b>"  # shown as text


def conversation_with_an_answer(**answer):
    """A teammate's conversation with the tiny base model: 'hello', then an assistant message of ``answer``'s fields."""
    from webapp.chat.models import Conversation, Role

    team = make_team()
    base_model = make_base_model(team.project, name="tiny")
    conversation = Conversation.objects.create(project=team.project, user=team.teammate,
                                               model_ref=base_model.public_id, model_label="Base model: tiny",
                                               title="hello")
    Message.objects.create(conversation=conversation, role=Role.USER, content="hello")
    Message.objects.create(conversation=conversation, role=Role.ASSISTANT, **answer)
    return team, conversation


def test_a_markdown_table_in_an_answer_has_borders_and_padded_cells(page, asgi_server, transactional_db):  # noqa: F811
    """A table in an answer came out as bare text in columns: no rule between its cells, nor room around their text
    (the browser's 1 px). Its cells are ruled and padded, its header set apart, and a table wider than the answer
    scrolls inside it rather than past it."""
    from webapp.chat.models import MessageStatus

    wide = " | ".join(f"column{index}" for index in range(30))
    team, conversation = conversation_with_an_answer(
        content=f"| River | Length |\n| --- | --- |\n| Rhine | 1,233 km |\n\n| {wide} |\n|{' --- |' * 30}\n",
        status=MessageStatus.COMPLETE)
    log_in(page, asgi_server, team.teammate.username)
    page.goto(f"{asgi_server}/p/{team.project.slug}/chat/{conversation.public_id}/")
    style = """cell => { const s = getComputedStyle(cell);
        return [s.borderTopWidth, s.borderTopStyle, s.borderLeftWidth, s.paddingTop, s.paddingLeft, s.fontWeight,
                s.backgroundColor]; }"""
    header = page.locator(".chat-markdown table").first.locator("th").first.evaluate(style)
    cell = page.locator(".chat-markdown table").first.locator("td").first.evaluate(style)
    for width, line, left, top, side, _weight, _background in (header, cell):
        assert width == left == "1px" and line == "solid"
        assert float(top.removesuffix("px")) >= 4 and float(side.removesuffix("px")) >= 8
    assert header[6] != cell[6], "the header row is set apart"
    answer = page.locator(".chat-assistant").bounding_box()
    second = page.locator(".chat-markdown table").nth(1)
    box = second.bounding_box()
    assert box["x"] + box["width"] <= answer["x"] + answer["width"] + 0.5
    assert second.evaluate("table => table.scrollWidth > table.clientWidth")


def test_a_finished_conversation_offers_no_stop_button(page, asgi_server, transactional_db):  # noqa: F811
    """The Stop button carries `hidden` until an answer streams; the site's `button { display: inline-block }`
    overrode the attribute, so a Stop that does nothing stood beside Send on every chat page."""
    from webapp.chat.models import MessageStatus

    team, conversation = conversation_with_an_answer(content="hi", status=MessageStatus.COMPLETE)
    log_in(page, asgi_server, team.teammate.username)
    page.goto(f"{asgi_server}/p/{team.project.slug}/chat/{conversation.public_id}/")
    assert page.get_by_role("button", name="Send").is_visible()
    assert page.get_by_role("button", name="Regenerate").is_visible()
    assert page.locator("#chat-stop").count() == 1 and not page.locator("#chat-stop").is_visible()


def test_the_arena_vote_opens_when_both_answers_are_done(page, asgi_server, redis_url, transactional_db,  # noqa: F811
                                                         settings, monkeypatch):
    """The vote buttons were live while the answers streamed; a click reloaded the page with 'wait for both
    answers before voting'. They are disabled until the last answer's done event, then open in place."""
    from webapp.chat import arena, channels, selectors, services
    from webapp.chat.models import Battle
    from webapp.runs.channels import redis_client

    settings.REDIS_URL = redis_url
    monkeypatch.setattr(services.celery_app, "send_task", lambda name, args, queue, **options: None)  # answers written here
    team = make_team()
    for name in ("falcon", "heron"):
        make_base_model(team.project, name=name, path=f"/models/{name}")
    battle = arena.battle_create(project=team.project, user=team.teammate, prompt="Name a colour.",
                                 choices=selectors.model_choices(project=team.project))
    log_in(page, asgi_server, team.teammate.username)
    page.goto(f"{asgi_server}/p/{team.project.slug}/arena/{battle.public_id}/")
    vote = page.get_by_role("button", name="A is better")
    assert vote.is_disabled() and page.locator(".arena-vote-wait").is_visible()

    for side, text in ((battle.side_a, "Blue."), (battle.side_b, "Red.")):
        answer = arena.battle_answer(side)
        assert vote.is_disabled()  # until the last answer is done
        services.message_finish(message_id=answer.public_id, text=text, finish_reason="stop")
        channels.emit(redis_client(), answer.public_id, {"seq": 0, "type": "done", "text": text, "finish_reason": "stop"})
        page.locator(f".arena-side:has-text('{text}') .chat-markdown").wait_for()
    page.wait_for_function("() => !document.querySelector('.arena-vote button').disabled")
    assert not page.locator(".arena-vote-wait").is_visible()
    vote.click()
    page.get_by_text("Your vote:").wait_for()
    assert Battle.objects.get(pk=battle.pk).outcome == "a"


def start_a_conversation(page, server_url: str) -> None:
    """A teammate of a new team starts a conversation with its base model; no serve worker runs, so an
    answer stays queued."""
    team = make_team()
    base_model = make_base_model(team.project, name="tiny")
    log_in(page, server_url, team.teammate.username)
    page.goto(f"{server_url}/p/{team.project.slug}/chat/")
    page.select_option("#id_model", base_model.public_id)
    page.get_by_role("button", name="Start").click()
    page.wait_for_selector("#chat-form")
    # chat.js (end of the body) binds Enter: the form is on the page before it has run, and a key pressed
    # then only adds a line (seen once in a full, loaded suite run).
    page.wait_for_load_state("load")


def test_the_first_message_names_the_conversation_on_the_page(page, asgi_server, transactional_db):  # noqa: F811
    """The heading said 'New conversation' until a reload, though the first turn had named it. No serve
    worker runs here: the answer stays queued, which is enough for the heading."""
    start_a_conversation(page, asgi_server)
    assert page.locator("#chat-title").inner_text() == "New conversation"
    page.fill("#chat-form textarea", "Name <b>three</b> rivers\nin Europe")
    page.get_by_role("button", name="Send").click()
    page.locator(".chat-user").wait_for()
    assert page.locator("#chat-title").inner_text() == "Name <b>three</b> rivers"  # its first line, as text
    assert page.title() == "\u2068Name <b>three</b> rivers\u2069 · \u2068Project alpha\u2069 · Temper"  # the tab


def test_enter_sends_and_shift_enter_starts_a_new_line(page, asgi_server, transactional_db):  # noqa: F811
    """Enter only added a line: a message was sent with the mouse or by tabbing to Send."""
    start_a_conversation(page, asgi_server)
    page.focus("#chat-form textarea")
    page.keyboard.type("first line")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("second line")
    assert page.locator(".chat-user").count() == 0
    page.keyboard.press("Enter")
    page.locator(".chat-user").wait_for()
    assert page.locator(".chat-user .chat-text").inner_text() == "first line\nsecond line"
    assert page.locator("#chat-form textarea").input_value() == ""
    assert Message.objects.get(role="user").content == "first line\nsecond line"  # as typed, not as the form sends it


@pytest.mark.parametrize("how", ["click", "enter"])
def test_send_with_an_empty_box_takes_away_an_earlier_error(page, asgi_server, transactional_db, how):  # noqa: F811
    """Send with nothing in the box is stopped by the browser (the box is required: "Please fill out this field"),
    before the page's own handler, which clears the error beside the buttons: an earlier error (Regenerate's here)
    stayed there, as if it were why nothing was sent. It is taken away, as every send does, and the box says why."""
    start_a_conversation(page, asgi_server)
    page.get_by_role("button", name="Regenerate").click()
    error = page.locator("#chat-error")
    error.filter(has_text="there is no answer to regenerate").wait_for()
    if how == "click":
        page.get_by_role("button", name="Send").click()
    else:
        page.focus("#chat-form textarea")
        page.keyboard.press("Enter")
    page.wait_for_function("() => document.getElementById('chat-error').textContent === ''")
    box = page.locator("#chat-form textarea")
    assert box.evaluate("box => box.validity.valueMissing") and box.get_attribute("aria-invalid") is None
    assert page.locator(".chat-user").count() == 0 and not Message.objects.exists()


def test_a_double_click_on_send_takes_one_turn_with_one_answer(page, asgi_server, transactional_db):  # noqa: F811
    """A double click sent the turn twice: the second was refused "an answer is still being written" beside the
    first's answer (or, had the first ended, took a second turn). Both sendings carry one token: the second is
    answered with the first's answer, which the page shows once. Whether or not a serve worker takes the answer,
    there is one of each."""
    start_a_conversation(page, asgi_server)
    answered = []
    page.on("response", lambda response: answered.append(response) if response.url.endswith("/send/") else None)
    page.fill("#chat-form textarea", "Name a river.")
    page.dblclick("#chat-send")
    for _ in range(100):  # the second sending waits for the first's to be done (submissions.WAIT_FOR_FIRST_SECONDS)
        if len(answered) == 2:
            break
        page.wait_for_timeout(100)
    page.wait_for_timeout(300)  # time for the page to handle the second answer
    assert [response.status for response in answered] == [200, 200]
    assert answered[0].json()["message"] == answered[1].json()["message"]  # the second attached to the first
    assert page.locator("#chat-error").inner_text() == ""
    assert page.locator(".chat-user").count() == 1 and page.locator(".chat-assistant").count() == 1
    assert page.locator(".chat-assistant").get_attribute("id") == answered[0].json()["message"]
    assert [message.role for message in Message.objects.order_by("id")] == ["user", "assistant"]


def test_an_answer_waiting_for_its_first_token_says_so(page, asgi_server, transactional_db):  # noqa: F811
    """The answer's box was empty until the first token, seconds on a cold serve worker (9 s for the
    demo model on CPU), with nothing to say that the model was being asked. No serve worker here: the
    answer stays queued."""
    from webapp.chat.models import MessageStatus

    team, conversation = conversation_with_an_answer(status=MessageStatus.STREAMING)
    log_in(page, asgi_server, team.teammate.username)
    page.goto(f"{asgi_server}/p/{team.project.slug}/chat/{conversation.public_id}/")
    waiting = page.locator(".chat-assistant .chat-streaming")
    assert waiting.evaluate("e => getComputedStyle(e, '::after').content") == '"waiting for the model…"'
    waiting.evaluate("e => { e.textContent = 'Hel'; }")  # what the first token event does
    assert waiting.evaluate("e => getComputedStyle(e, '::after').content") == "none"


def test_an_answer_waiting_for_its_model_to_load_says_so(page, asgi_server, redis_url, transactional_db,  # noqa: F811
                                                         settings):
    """A cold serve worker loads the model before the first token (minutes for a real model on CPU): its
    'status' event replaces 'waiting for the model…' until the first token, as text."""
    from webapp.chat import channels
    from webapp.chat.models import MessageStatus
    from webapp.runs.channels import redis_client

    settings.REDIS_URL = redis_url
    team, conversation = conversation_with_an_answer(status=MessageStatus.STREAMING)
    answer = conversation.messages.get(role="assistant")
    log_in(page, asgi_server, team.teammate.username)
    page.goto(f"{asgi_server}/p/{team.project.slug}/chat/{conversation.public_id}/")
    waiting = page.locator(".chat-assistant .chat-streaming")
    assert waiting.evaluate("e => getComputedStyle(e, '::after').content") == '"waiting for the model…"'
    client = redis_client()
    channels.emit(client, answer.public_id, {"seq": 0, "type": "status", "message": "loading the <b>model</b>"})
    page.wait_for_function("() => document.querySelector('.chat-assistant .chat-streaming').dataset.status")
    assert waiting.evaluate("e => getComputedStyle(e, '::after').content") == '"loading the <b>model</b>…"'
    assert waiting.locator("b").count() == 0
    channels.emit(client, answer.public_id, {"seq": 1, "type": "token", "text": "Hel"})
    page.wait_for_function("() => document.querySelector('.chat-assistant .chat-streaming').textContent === 'Hel'")
    assert waiting.evaluate("e => getComputedStyle(e, '::after').content") == "none"


def _relayed_until(generation_id: str, seconds: float) -> str:
    """What the events view sends of an answer's stream that ends before its terminal event (its
    ``MAX_STREAM_SECONDS`` passed, a proxy or the network cut it): the real relay, for ``seconds``."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from webapp.chat import channels
    from webapp.core.sse import relay_channel

    async def lines() -> str:
        stream = relay_channel(channels.channel(generation_id), backlog_key=channels.events_key(generation_id),
                               is_terminal=lambda event: event["type"] in channels.TERMINAL_TYPES,
                               max_seconds=seconds, label="test")
        return "".join([line async for line in stream])

    with ThreadPoolExecutor(1) as thread:  # Playwright's event loop runs in this one
        return thread.submit(asyncio.run, lines()).result()


def _an_answer_streaming(where: str, monkeypatch):
    """(team, answer, page path) of an answer being written, shown on its chat page or on an arena battle's."""
    from webapp.chat import arena, selectors, services
    from webapp.chat.models import MessageStatus

    if where == "chat":
        team, conversation = conversation_with_an_answer(status=MessageStatus.STREAMING)
        return (team, conversation.messages.get(role="assistant"),
                f"/p/{team.project.slug}/chat/{conversation.public_id}/")
    monkeypatch.setattr(services.celery_app, "send_task", lambda name, args, queue, **options: None)
    team = make_team()
    for name in ("falcon", "heron"):
        make_base_model(team.project, name=name, path=f"/models/{name}")
    battle = arena.battle_create(project=team.project, user=team.teammate, prompt="Greet.",
                                 choices=selectors.model_choices(project=team.project))
    return team, arena.battle_answer(battle.side_a), f"/p/{team.project.slug}/arena/{battle.public_id}/"


@pytest.mark.parametrize("where", ["chat", "arena"])
def test_a_stream_that_reconnects_shows_each_token_once(page, asgi_server, redis_url, transactional_db,  # noqa: F811
                                                        settings, monkeypatch, where):
    """An answer's stream ends without its last event after MAX_STREAM_SECONDS (or when the network or a proxy
    cuts it); the browser's EventSource reconnects by itself, and the relay replays the answer's events from its
    first: the page appended them again, showing "HelloHello world" until the answer was done."""
    from webapp.chat import channels
    from webapp.runs.channels import redis_client

    settings.REDIS_URL = redis_url
    team, answer, path = _an_answer_streaming(where, monkeypatch)
    client = redis_client()
    channels.emit(client, answer.public_id, {"seq": 0, "type": "token", "text": "Hel"})
    channels.emit(client, answer.public_id, {"seq": 1, "type": "token", "text": "lo"})
    connections = []

    def cut_short(route):
        connections.append(route.request.url)
        # retry: the browser reconnects after 50 ms rather than its default 3 s
        route.fulfill(status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
                      body="retry: 50\n\n" + _relayed_until(answer.public_id, 0.2))

    page.route(f"**/messages/{answer.public_id}/events/", cut_short)
    log_in(page, asgi_server, team.teammate.username)
    page.goto(asgi_server + path)
    streaming = page.locator(f"#{answer.public_id} .chat-streaming")
    streaming.filter(has_text="Hello").wait_for()
    channels.emit(client, answer.public_id, {"seq": 2, "type": "token", "text": " world"})
    streaming.filter(has_text="world").wait_for()
    assert len(connections) >= 2 and streaming.text_content() == "Hello world"


@pytest.mark.parametrize("where", ["chat", "arena"])
def test_an_answer_whose_stream_lost_redis_is_followed_again(page, asgi_server, redis_url, transactional_db,  # noqa: F811
                                                            settings, monkeypatch, where):
    """The events view ends a stream with 'unavailable' when its Redis connection fails (or the page read too
    slowly); the page closed its EventSource then, and the answer, still being written, stayed an empty box
    (the arena's vote closed) until a reload, while Send met 'an answer is still being written'."""
    from webapp.chat import channels, services
    from webapp.core.sse import sse_message
    from webapp.runs.channels import redis_client

    settings.REDIS_URL = redis_url
    team, answer, path = _an_answer_streaming(where, monkeypatch)
    client = redis_client()
    channels.emit(client, answer.public_id, {"seq": 0, "type": "token", "text": "Hel"})
    connections = []

    def cut_by_redis_first(route):
        connections.append(route.request.url)
        body = (_relayed_until(answer.public_id, 0.2) + sse_message({"type": "unavailable"}) if len(connections) == 1
                else _relayed_until(answer.public_id, 0.2))
        route.fulfill(status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
                      body="retry: 50\n\n" + body)

    page.route(f"**/messages/{answer.public_id}/events/", cut_by_redis_first)
    log_in(page, asgi_server, team.teammate.username)
    page.goto(asgi_server + path)
    page.locator(f"#{answer.public_id} .chat-streaming").filter(has_text="Hel").wait_for()
    channels.emit(client, answer.public_id, {"seq": 1, "type": "token", "text": "lo"})
    services.message_finish(message_id=answer.public_id, text="Hello", finish_reason="stop", completion_tokens=2)
    channels.emit(client, answer.public_id, {"seq": 2, "type": "done", "text": "Hello", "finish_reason": "stop"})
    page.locator(f"#{answer.public_id} .chat-markdown").filter(has_text="Hello").wait_for()
    assert len(connections) >= 2


def _answers_done_at_their_stream(page, team) -> list[str]:
    """The public ids of ``team``'s answers being written; the page's stream of each (routed) finds it done: the
    answer is finished in the database, as a serve worker does, and its stream says so."""
    from webapp.chat import services
    from webapp.chat.models import MessageStatus
    from webapp.core.sse import sse_message

    ids = list(Message.objects.filter(conversation__project=team.project, status=MessageStatus.STREAMING)
               .values_list("public_id", flat=True))

    def done(route):
        message_id = route.request.url.rstrip("/").split("/")[-2]
        services.message_finish(message_id=message_id, text=f"Answer **{message_id[-4:]}**.", finish_reason="stop")
        route.fulfill(status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
                      body=sse_message({"seq": 0, "type": "done", "text": "", "finish_reason": "stop"}))

    for message_id in ids:
        page.route(f"**/messages/{message_id}/events/", done)
    return ids


def _failing(failure: str, loads: list[str], *, times: int):
    """A route handler that fails the first ``times`` loads (``failure``: "network", the connection cut; or "503")
    and lets the others through, counting each in ``loads``."""
    def handle(route):
        loads.append(route.request.url)
        if len(loads) > times:
            route.continue_()
        elif failure == "network":
            route.abort("connectionreset")
        else:
            route.fulfill(status=503, body="Service Unavailable")
    return handle


@pytest.mark.parametrize("failure", ["network", "503"])
@pytest.mark.parametrize("where", ["chat", "arena"])
def test_a_done_answer_whose_load_fails_once_is_loaded_again(page, asgi_server, transactional_db,  # noqa: F811
                                                             monkeypatch, where, failure):
    """Once an answer is done the page loads the server's rendering of it; a network error or a 5xx on that one load
    left the arena's vote closed for good (the other side's answer found this one still "streaming"), and the chat's
    answer unrendered (a network error: Send and Regenerate disabled) until a reload. The load is tried again."""
    team, answer, path = _an_answer_streaming(where, monkeypatch)
    _answers_done_at_their_stream(page, team)
    loads = []
    page.route(f"**/messages/{answer.public_id}/", _failing(failure, loads, times=1))
    log_in(page, asgi_server, team.teammate.username)
    page.goto(asgi_server + path)
    page.locator(f"#{answer.public_id} .chat-markdown strong").filter(has_text=answer.public_id[-4:]).wait_for()
    assert len(loads) == 2
    if where == "arena":
        page.wait_for_function("() => !document.querySelector('.arena-vote button').disabled")
        assert page.locator("#arena-vote-status").inner_text() == "Both answers are done: the vote is open."
    else:
        page.wait_for_function("() => !document.getElementById('chat-send').disabled")
        assert page.locator("#chat-error").inner_text() == ""
    assert page.locator("[role=alert].answer-not-loaded").count() == 0


@pytest.mark.parametrize("where", ["chat", "arena"])
def test_a_done_answer_that_keeps_failing_to_load_says_so(page, asgi_server, transactional_db,  # noqa: F811
                                                          monkeypatch, where):
    """A load of the finished answer tried again and again, and failing each time, is given up, and the page says
    so (with what to do) rather than wait for ever without a word."""
    from webapp.chat.models import MessageStatus

    team, answer, path = _an_answer_streaming(where, monkeypatch)
    _answers_done_at_their_stream(page, team)
    loads = []
    page.route(f"**/messages/{answer.public_id}/", _failing("503", loads, times=1000))
    page.clock.install()  # the waits between tries are skipped below
    log_in(page, asgi_server, team.teammate.username)
    page.goto(asgi_server + path)
    said = page.locator(".answer-not-loaded")
    for _ in range(40):
        if said.count():
            break
        page.clock.fast_forward(20_000)
        page.wait_for_timeout(100)
    expected = ("Answer A is done, but it could not be loaded (the server answered 503): reload the page to see it and "
                "vote." if where == "arena" else
                "The answer is done, but it could not be loaded (the server answered 503): reload the page to see it.")
    assert said.inner_text() == expected and said.get_attribute("role") == "alert"
    assert len(loads) == 6  # the first and five more, then no more
    page.clock.fast_forward(600_000)
    page.wait_for_timeout(300)
    assert len(loads) == 6
    assert Message.objects.get(public_id=answer.public_id).status == MessageStatus.COMPLETE
    if where == "arena":
        assert page.get_by_role("button", name="A is better").is_disabled()
    else:
        assert page.get_by_role("button", name="Send").is_enabled()


def test_a_tab_left_behind_by_another_shows_the_conversation_as_it_is(page, asgi_server, transactional_db):  # noqa: F811
    """Two tabs on one conversation: the first takes a turn; the second, still showing the conversation as it was,
    regenerates (the server replaces the newest answer, the first tab's). It removed its own last answer, still
    stored, and showed the new answer under the turn it had shown last, which that answer did not answer."""
    from webapp.chat.models import MessageStatus, Role

    team, conversation = conversation_with_an_answer(content="Hi there.", status=MessageStatus.COMPLETE)
    log_in(page, asgi_server, team.teammate.username)
    page.goto(f"{asgi_server}/p/{team.project.slug}/chat/{conversation.public_id}/")
    page.wait_for_load_state("load")
    # The other tab's turn, answered
    Message.objects.create(conversation=conversation, role=Role.USER, content="Name a river.")
    Message.objects.create(conversation=conversation, role=Role.ASSISTANT, content="The Rhine.",
                           status=MessageStatus.COMPLETE)

    page.get_by_role("button", name="Regenerate").click()
    page.locator(".chat-user", has_text="Name a river.").wait_for()  # loaded again, as the conversation now is
    assert page.locator(".chat-markdown", has_text="Hi there.").count() == 1  # the answer still stored
    assert page.locator(".chat-message").evaluate_all("messages => messages.map(message => message.id)") == [
        *conversation.messages.order_by("created_at", "id").values_list("public_id", flat=True)]
    assert page.locator(".chat-markdown", has_text="The Rhine.").count() == 0  # the answer replaced


def test_a_member_made_a_viewer_is_told_why_a_message_is_refused(page, asgi_server, transactional_db):  # noqa: F811
    """QA: bob, demoted to viewer while his conversation was open, read 'the server answered 403'."""
    from webapp.projects.models import Membership

    start_a_conversation(page, asgi_server)
    Membership.objects.filter(user__username__endswith="teammate").update(role="viewer")
    page.fill("#chat-form textarea", "still there?")
    page.keyboard.press("Enter")
    error = page.locator("#chat-error")
    error.filter(has_text="role").wait_for(timeout=10_000)
    assert "this needs the member role in" in error.inner_text() and "you are a viewer" in error.inner_text()
    assert page.locator("#chat-form textarea").input_value() == "still there?"  # what was typed is kept


def test_its_author_deletes_a_conversation_from_the_list(page, asgi_server, transactional_db):  # noqa: F811
    """Each row of the list has its own confirmation; the one opened deletes its conversation only."""
    from webapp.chat.models import Conversation, MessageStatus, Role

    team, kept = conversation_with_an_answer(content="hi", status=MessageStatus.COMPLETE)
    gone = Conversation.objects.create(project=team.project, user=team.teammate, model_ref=kept.model_ref,
                                       model_label=kept.model_label, title="to forget")
    Message.objects.create(conversation=gone, role=Role.USER, content="to forget")
    log_in(page, asgi_server, team.teammate.username)
    page.goto(f"{asgi_server}/p/{team.project.slug}/chat/")
    row = page.locator(".chat-conversations li", has_text="to forget")
    row.get_by_text("Delete…").click()
    row.get_by_role("button", name="Delete to forget").click()
    page.wait_for_url(f"**/p/{team.project.slug}/chat/")
    assert "Deleted the conversation \u2068to forget\u2069." in page.locator(".messages").inner_text()
    assert page.locator(".chat-conversations li").count() == 1
    assert list(Conversation.objects.all()) == [kept]


def test_a_stop_sequence_with_line_breaks_is_typed_and_comes_back(page, asgi_server, transactional_db):  # noqa: F811
    """Each line of the stop sequences box is one sequence, so "\\n\\nUser:" (where a transcript's next turn
    starts) could not be typed: its line breaks ended it. Written with \\n, it is one sequence holding two line
    breaks, shown so on the conversation's page, and "New conversation with these settings" gives it back."""
    from webapp.chat.models import Conversation

    team = make_team()
    base_model = make_base_model(team.project, name="tiny")
    log_in(page, asgi_server, team.teammate.username)
    page.goto(f"{asgi_server}/p/{team.project.slug}/chat/")
    page.select_option("#id_model", base_model.public_id)
    stop_box = page.locator("#id_stop")
    stop_box.press_sequentially("\\n\\nUser:")
    stop_box.press("Enter")
    stop_box.press_sequentially("###")
    page.get_by_role("button", name="Start").click()
    page.wait_for_selector("#chat-form")
    first = Conversation.objects.get(user=team.teammate)
    assert first.stop == ["\n\nUser:", "###"]
    assert page.locator(".chat-settings").inner_text().endswith('stop "\\n\\nUser:" "###"')

    page.get_by_role("link", name="New conversation with these settings").click()
    page.wait_for_selector("#new-conversation")
    assert page.input_value("#id_stop") == "\\n\\nUser:\n###"
    assert page.input_value("#id_model") == base_model.public_id
    page.get_by_role("button", name="Start").click()
    page.wait_for_selector("#chat-form")
    second = Conversation.objects.exclude(pk=first.pk).get(user=team.teammate)
    assert second.stop == ["\n\nUser:", "###"]


def test_the_thinking_switch_shows_for_a_model_whose_template_reads_it(page, asgi_server, transactional_db,  # noqa: F811
                                                                     settings):
    """Qwen3's chat template reads enable_thinking: the new conversation form shows a Thinking switch when such a
    model is chosen (the server read each model's template), at that model's default, and none for another; the
    conversation keeps it, its page says so, and "New conversation with these settings" gives it back."""
    import json

    from webapp.chat.models import Conversation

    team = make_team()
    plain = make_base_model(team.project, name="plain")  # its directory holds no template: ChatML, no switch
    thinker_dir = settings.MODELS_ROOT / "thinker"
    thinker_dir.mkdir(parents=True, exist_ok=True)
    (thinker_dir / "tokenizer_config.json").write_text(json.dumps({"chat_template": (
        "{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}assistant"
        "{% if enable_thinking is defined and enable_thinking is false %} <think></think>{% endif %}{% endif %}")}))
    thinker = make_base_model(team.project, name="thinker", path=str(thinker_dir))
    log_in(page, asgi_server, team.teammate.username)
    page.goto(f"{asgi_server}/p/{team.project.slug}/chat/")
    switch = page.get_by_label("Thinking")
    page.select_option("#id_model", plain.public_id)
    assert not switch.is_visible()
    page.select_option("#id_model", thinker.public_id)
    assert switch.is_visible() and switch.is_checked()  # the template's own default: it thinks
    switch.uncheck()
    page.select_option("#id_model", plain.public_id)
    assert not switch.is_visible()
    page.select_option("#id_model", thinker.public_id)
    switch.uncheck()
    page.get_by_role("button", name="Start").click()
    page.wait_for_selector("#chat-form")
    assert Conversation.objects.get(user=team.teammate).enable_thinking is False
    assert "thinking off" in page.locator(".chat-settings").inner_text()

    page.get_by_role("link", name="New conversation with these settings").click()
    page.wait_for_selector("#new-conversation")
    assert page.get_by_label("Thinking").is_visible() and not page.get_by_label("Thinking").is_checked()


def test_the_chat_list_lays_out_its_two_columns(page, asgi_server, transactional_db):  # noqa: F811
    """chat.css holds the list page's two-column layout and was loaded only by the conversation, arena and battle
    pages: the list stacked its conversations above the new conversation form."""
    team, _conversation = conversation_with_an_answer(content="hi", status="complete")
    log_in(page, asgi_server, team.teammate.username)
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(f"{asgi_server}/p/{team.project.slug}/chat/")
    assert page.locator(".chat-columns").evaluate("element => getComputedStyle(element).display") == "grid"
    conversations, new_conversation = (box for box in page.locator(".chat-columns > section").evaluate_all(
        "sections => sections.map(section => section.getBoundingClientRect().toJSON())")[:2])
    assert new_conversation["left"] > conversations["right"] - 1 and new_conversation["top"] == conversations["top"]
    assert page.locator(".chat-conversations small").first.evaluate(
        "element => getComputedStyle(element).display") == "block"


def test_a_template_variable_set_for_a_conversation_reaches_the_prompt_and_the_model(
        page, asgi_server, celery_workers, transactional_db, settings):  # noqa: F811
    """The new conversation form shows the picked model's chat template variables (none for a model whose template
    reads none), refuses a value the template fails on with its line, and keeps the one given: the conversation's
    prompt holds it and the real serve worker answers with it."""
    from tests.webapp.chat.test_template_variables import PERSONA_TEMPLATE

    celery_workers.ensure("serve")
    team = make_team()
    model_dir = build_tiny_model_dir(settings.MODELS_ROOT / "tiny-persona")
    (model_dir / "chat_template.jinja").write_text(PERSONA_TEMPLATE)
    persona = make_base_model(team.project, name="tiny-persona", path=str(model_dir))
    make_base_model(team.project, name="a-plain")  # listed first: its template (none here) reads no variable
    log_in(page, asgi_server, team.teammate.username)
    page.goto(f"{asgi_server}/p/{team.project.slug}/chat/")
    box = page.locator("#id_var_persona")
    assert not box.is_visible() and box.is_disabled()
    page.select_option("#id_model", persona.public_id)
    assert box.is_visible() and box.is_enabled() and box.input_value() == ""
    page.fill("#id_temperature", "0")
    page.fill("#id_max_tokens", "8")
    box.fill("a pirate <b>captain</b>")
    page.fill("#id_var_style", "jazz")
    page.get_by_role("button", name="Start").click()
    assert "style must be plain or rhyme, not jazz" in page.locator(".errors").inner_text()
    assert "chat template line 5" in page.locator(".errors").inner_text()
    page.fill("#id_var_style", "rhyme")
    page.get_by_role("button", name="Start").click()
    page.wait_for_selector("#chat-form")
    page.wait_for_load_state("load")
    assert 'persona = "a pirate <b>captain</b>"' in page.locator(".chat-settings").inner_text()
    page.fill("#chat-form textarea", "Hello")
    page.get_by_role("button", name="Send").click()
    page.wait_for_selector(".chat-assistant.status-complete", timeout=90_000)
    page.reload()
    page.locator("#chat-prompt summary").click()
    shown = page.locator("#chat-prompt pre").inner_text()
    assert shown.startswith("<|im_start|>system\nYou are a pirate <b>captain</b>.<|im_end|>\n<|im_start|>user\nHello")
    assert page.locator("#chat-prompt b").count() == 0  # the value is text, not markup


def test_the_arena_offers_the_template_variables_of_the_two_models_picked(page, asgi_server, transactional_db,  # noqa: F811
                                                                          tmp_path):
    """Compare mode's variables, as the chat form's: only those the template of model A or B reads, shown and sent
    once both are picked; the others (and all of them for a blind battle, which takes none) hidden and disabled."""
    from tests.factories import build_bpe_tokenizer_dir
    from tests.webapp.chat.test_template_variables import PERSONA_TEMPLATE

    team = make_team()
    persona = make_base_model(team.project, name="persona", path=str(
        build_bpe_tokenizer_dir(tmp_path / "persona", chat_template=PERSONA_TEMPLATE)))
    toned = make_base_model(team.project, name="toned", path=str(build_bpe_tokenizer_dir(
        tmp_path / "toned", chat_template="{% for m in messages %}{{ tone }}{{ m.content }}{% endfor %}")))
    plain = make_base_model(team.project, name="plain", path=str(build_bpe_tokenizer_dir(tmp_path / "plain")))
    log_in(page, asgi_server, team.teammate.username)
    page.goto(f"{asgi_server}/p/{team.project.slug}/arena/")
    persona_box, tone_box = page.locator("#id_var_persona"), page.locator("#id_var_tone")
    assert not page.locator("#arena-variables").is_visible()  # random models: a blind battle takes none
    assert persona_box.is_disabled() and tone_box.is_disabled()

    page.select_option("#id_model_a", persona.public_id)
    page.select_option("#id_model_b", plain.public_id)
    page.locator("#arena-variables summary").click()
    assert persona_box.is_visible() and persona_box.is_enabled()
    assert page.locator("#id_var_terse").is_visible()
    assert not tone_box.is_visible() and tone_box.is_disabled()

    page.select_option("#id_model_a", toned.public_id)
    assert tone_box.is_visible() and tone_box.is_enabled()
    assert not persona_box.is_visible() and persona_box.is_disabled()
    page.select_option("#id_model_b", "")  # one side random: blind again
    assert not page.locator("#arena-variables").is_visible() and tone_box.is_disabled()
