"""Chat pages: a project's conversations (each private to its author), one conversation with its
composer, and the JSON endpoints its script calls (send, stop, regenerate, one rendered message). Send and
regenerate are taken once per one-time token (``_turn_once``): a double click or a retry attaches to the first's answer.

Chatting spends accelerator time, so it takes the member role: viewers get 403, outsiders 404, and
another member's conversation is a 404 too. Model output is only ever put in a page as text
(``textContent`` while streaming) or as ``render_markdown``'s sanitized HTML.
"""
from __future__ import annotations

from collections.abc import Callable
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from jaxengine.chat_template import ChatTemplateError
from jaxengine.prompts import PromptError
from webapp.chat import selectors, services
from webapp.chat.forms import ConversationForm, MessageForm
from webapp.chat.models import Message
from webapp.chat.tokens import project_token_create, project_token_list, project_token_revoke
from webapp.chat.access import chat_access, get_conversation_for_user, get_message_for_user
from webapp.core.auth_header import DEFAULT_TOKEN_LIFETIME, TOKEN_LIFETIME_CHOICES, token_expiry
from webapp.core.bidi import isolated
from webapp.core.numbers import whole_number
from webapp.core.submissions import (SendingInProgress, deleted_once_or_refused, form_send_once, form_send_once_secret,
                                     note_secret_already_shown, posted_once)
from webapp.core.views import post_answered_with_a_page
from webapp.workers.selectors import queue_unserved


CONVERSATIONS_PER_PAGE = 50


def _list_page(request: HttpRequest, project, membership, form, *, status: int = 200, new_secret: str = ""):
    page = Paginator(selectors.conversation_list(project=project, user=request.user),
                     CONVERSATIONS_PER_PAGE).get_page(whole_number(request.GET.get("page")))
    return render(request, "chat/list.html", {
        "project": project, "membership": membership, "form": form,
        "has_models": bool(form.fields["model"].choices), "new_secret": new_secret,
        # A new token is shown with commands that use it: its address, and the newest run's model (else the first).
        "v1_models_url": request.build_absolute_uri(reverse("chat:v1_models")),
        "v1_chat_url": request.build_absolute_uri(reverse("chat:v1_chat_completions")), "example_model": _example_model(form),
        "conversations": page.object_list, "page": page,
        # Also answered at chat/tokens/ (a new token's secret): the page links point at the list itself.
        "page_base": reverse("chat:list", kwargs={"slug": project.slug}),
        "tokens": project_token_list(user=request.user, project=project),
        "lifetimes": TOKEN_LIFETIME_CHOICES, "lifetime": DEFAULT_TOKEN_LIFETIME, "now": timezone.now()}, status=status)


def _example_model(form: ConversationForm) -> str:
    refs = [ref for ref, _label in form.fields["model"].choices]
    return next((ref for ref in refs if ref.startswith("run_")), refs[0] if refs else "MODEL_ID")


@login_required
@require_http_methods(["GET", "POST"])
def chat_list(request: HttpRequest, slug: str) -> HttpResponse:
    project, membership = chat_access(request.user, slug)
    choices = selectors.model_choices(project=project)
    # A run page's "Chat with it" names its model (?model=run_…): the form starts with it chosen. A
    # conversation's "New conversation with these settings" names the conversation (?from=conv_…).
    initial = {"model": request.GET.get("model")}
    if request.method == "GET" and request.GET.get("from"):
        _project, _membership, original = _chat_conversation(request, slug, request.GET["from"])
        initial = ConversationForm.settings_of(original)
        if not any(choice.ref == original.model_ref for choice in choices):
            messages.warning(request, f"{isolated(original.model_label)}, the model of that conversation, is no longer "
                                      "available: choose another.")
    form = ConversationForm(request.POST or None, choices=choices, initial=initial,
                            thinking=selectors.thinking_defaults(choices), variables=_variables(choices))
    if request.method == "POST" and form.is_valid():
        model = next(choice for choice in choices if choice.ref == form.cleaned_data["model"])

        def start() -> str:
            conversation = services.conversation_create(
                project=project, user=request.user, model=model, system_prompt=form.cleaned_data["system_prompt"],
                temperature=form.cleaned_data["temperature"], top_p=form.cleaned_data["top_p"],
                top_k=form.cleaned_data["top_k"], max_tokens=form.cleaned_data["max_tokens"],
                presence_penalty=form.cleaned_data["presence_penalty"],
                frequency_penalty=form.cleaned_data["frequency_penalty"], stop=form.cleaned_data["stop"],
                enable_thinking=form.enable_thinking(), template_variables=form.template_variables())
            return reverse("chat:detail", kwargs={"slug": project.slug, "conversation_id": conversation.public_id})

        try:
            return redirect(form_send_once(request, create=start))
        except SendingInProgress as error:  # the same form sent twice, the first still at work
            form.add_error(None, error)
        except ValidationError as error:  # the service's refusal (a model whose folder is gone), at its field
            for field, problems in error.message_dict.items():
                form.add_error(field if field in form.fields else None, problems)
    return _list_page(request, project, membership, form, status=400 if request.method == "POST" else 200)


def _variables(choices) -> dict:
    """Each model's chat template variables a conversation may set (``selectors.chat_template_variables``), by ref."""
    return {choice.ref: variables for choice in choices if (variables := selectors.chat_template_variables(choice))}


@login_required
@post_answered_with_a_page("chat:list")
def chat_token_create(request: HttpRequest, slug: str) -> HttpResponse:
    """A new token of the OpenAI-compatible API for this project; its secret is shown on this response only.
    Once per sending (``form_send_once_secret``): a repeat makes no second token and says so."""
    project, membership = chat_access(request.user, slug)
    name = request.POST.get("name", "")

    def create() -> tuple[str, str]:
        token, secret = project_token_create(
            user=request.user, project=project, name=name,
            expires_at=token_expiry(request.POST.get("expires", DEFAULT_TOKEN_LIFETIME)))
        return str(token.pk), secret

    try:
        token_id, secret = form_send_once_secret(request, create=create)
    except ValidationError as error:
        messages.error(request, f"No token made: {error.messages[0]}")
        return redirect("chat:list", project.slug)
    if not secret:
        note_secret_already_shown(request, tokens=project_token_list(user=request.user, project=project),
                                  token_id=token_id)
    choices = selectors.model_choices(project=project)
    form = ConversationForm(choices=choices, thinking=selectors.thinking_defaults(choices), variables=_variables(choices))
    return _list_page(request, project, membership, form, new_secret=secret)


@login_required
@require_POST
def chat_token_revoke(request: HttpRequest, slug: str, token_id: int) -> HttpResponse:
    project, _membership = chat_access(request.user, slug)
    token = project_token_revoke(user=request.user, project=project, token_id=token_id)
    if token is not None:
        messages.success(request, f"Token {isolated(token.name)} revoked: programs using it are refused from now on.")
    else:  # a second click, or an id that is not one of yours: the same answer, nothing changed
        messages.info(request, "That token is not among yours in this project (revoked already?); nothing was revoked.")
    return redirect("chat:list", slug=project.slug)


def _chat_conversation(request: HttpRequest, slug: str, conversation_id: str):
    """A conversation of the chat, not a side of an arena battle: its page would name the battle's
    model, and a further turn would change the answer voted on."""
    project, membership, conversation = get_conversation_for_user(request.user, slug, conversation_id)
    if conversation.in_arena:
        raise Http404("no such conversation")
    return project, membership, conversation


@login_required
@require_http_methods(["GET"])
def chat_detail(request: HttpRequest, slug: str, conversation_id: str) -> HttpResponse:
    project, membership, conversation = _chat_conversation(request, slug, conversation_id)
    model = selectors.model_choice(project=project, ref=conversation.model_ref)
    if model is not None:  # loaded and compiling while the person reads and writes
        services.model_prepare(model=model, project_slug=project.slug)
    unavailable = (model.refused if model is not None
                   else selectors.unavailable_reason(project=project, conversation=conversation))
    return render(request, "chat/detail.html", {
        "project": project, "membership": membership, "conversation": conversation,
        **_prompt(conversation, model),
        "chat_messages": list(conversation.messages.all()), "form": MessageForm(), "model_available": not unavailable,
        "unavailable": unavailable, **no_serve_worker_context()})


def no_serve_worker_context() -> dict:
    """What the chat and battle pages say when no serve worker runs (``chat/_no_serve_worker.html``): an answer
    would wait under "waiting for the model…" until it is given up, with nothing saying why."""
    return {"no_serve_worker": queue_unserved("serve"),
            "answer_given_up_after": services.generation_expiry_seconds()}


def _prompt(conversation, model) -> dict:
    """The newest answer's prompt, what Regenerate sends (``services.regenerate_history``), as the serve worker encodes
    it (``selectors.encoded_prompt``) with the conversation's template variables (``prompt``), or why it cannot be
    (``prompt_error``). Not the whole conversation with the answer cue after its last answer, which nothing sends: a
    message sent adds its turn first, and Regenerate leaves out the answer it replaces."""
    messages = services.regenerate_history(conversation) if model is not None else None
    if not messages:
        return {}
    try:
        return {"prompt": selectors.encoded_prompt(model=model, messages=messages,
                                                   variables=services.template_kwargs_of(conversation, model),
                                                   max_new_tokens=conversation.max_tokens)}
    except (ChatTemplateError, PromptError) as error:
        return {"prompt_error": str(error)}


@login_required
@require_POST
def chat_delete(request: HttpRequest, slug: str, conversation_id: str) -> HttpResponse:
    """Delete a conversation, from its page or the list; refused back on its page (where Stop is) while an
    answer is being written. An arena battle's side is a 404 here, as on every chat page."""
    project, _membership = chat_access(request.user, slug)

    def delete() -> str:  # looked up here: a second click finds it gone and lands where the first did
        _project, membership, conversation = _chat_conversation(request, slug, conversation_id)
        if not selectors.may_delete_conversation(membership=membership, conversation=conversation):
            raise PermissionDenied("only its author may delete a conversation")
        services.conversation_delete(conversation=conversation)
        messages.success(request, f"Deleted the conversation {isolated(conversation.title or '(untitled)')}.")
        return reverse("chat:list", kwargs={"slug": project.slug})

    return redirect(deleted_once_or_refused(request, delete=delete, back=reverse(
        "chat:detail", kwargs={"slug": project.slug, "conversation_id": conversation_id})))


def _answer_json(request: HttpRequest, project, conversation, answer: Message, *, sent: bool) -> JsonResponse:
    """The new answer's addresses, with the messages the page must show above it: ``previous``, the one before
    this turn (a sent message's, "" for the first; a regenerated answer's user turn), and ``user_message``, the
    sent one. A page whose last message is another (a second tab took a turn meanwhile) loads the conversation
    again rather than show the answer under a turn it did not answer."""
    kwargs = {"slug": project.slug, "conversation_id": conversation.public_id, "message_id": answer.public_id}
    conversation.refresh_from_db(fields=["title"])  # the first turn names the conversation
    before = selectors.messages_before(conversation=conversation, answer=answer, count=2 if sent else 1)
    turn = {"user_message": before[0], "previous": before[1] if len(before) > 1 else ""} if sent else {
        "previous": before[0] if before else ""}
    return JsonResponse({"message": answer.public_id, "events": reverse("chat:events", kwargs=kwargs),
                         "html": reverse("chat:message", kwargs=kwargs), "stop": reverse("chat:stop", kwargs=kwargs),
                         "title": conversation.title, **turn})


def _model_or_error(project, conversation):
    model = selectors.model_choice(project=project, ref=conversation.model_ref)
    if model is None:
        raise services.ChatError(selectors.unavailable_reason(project=project, conversation=conversation))
    if model.refused:
        raise services.ChatError(model.refused)
    return model


@login_required
@require_POST
def chat_send(request: HttpRequest, slug: str, conversation_id: str) -> HttpResponse:
    project, _membership, conversation = _chat_conversation(request, slug, conversation_id)
    form = MessageForm(request.POST)
    if not form.is_valid():
        return _invalid(form.errors)
    return _turn_once(request, project, conversation, sent=True, take_turn=lambda: services.message_send(
        conversation=conversation, model=_model_or_error(project, conversation), content=form.cleaned_data["content"]))


# A repeated send or regenerate whose answer is gone: a later regenerate replaced it, or the conversation moved on.
REPEAT_ANSWER_GONE = ("This was sent already, and the answer it asked for has been replaced since (regenerated); "
                      "reload the page to see the conversation as it is now.")


def _turn_once(request: HttpRequest, project, conversation, *, take_turn: Callable[[], Message],
               sent: bool) -> JsonResponse:
    """Take a turn (``take_turn``: a send, or a regenerate, which returns the new answer) once per one-time token
    (``submissions.posted_once``, keyed by the page's token and the fields): the same sending again — a double
    click, a browser's or proxy's retry — is answered with the first's answer to follow (its stream, which Redis
    keeps), instead of a 409 "still being written" or a second turn once the first had ended. A sending
    without a token (older scripts) takes a turn every time."""
    try:
        once = posted_once(request, create=lambda: take_turn().public_id)
    except SendingInProgress as error:  # the first still at work after WAIT_FOR_FIRST_SECONDS
        return JsonResponse({"error": error.messages[0]}, status=409)
    except ValidationError as error:  # the text itself (blank, a NUL), the token, or the chat template fails on it
        return _invalid(error.message_dict)
    except services.ChatError as error:  # the conversation's state (an answer still streaming)
        return JsonResponse({"error": str(error)}, status=409)
    answer = conversation.messages.filter(public_id=once.result).first()
    if answer is None:
        return JsonResponse({"error": REPEAT_ANSWER_GONE}, status=409)
    return _answer_json(request, project, conversation, answer, sent=sent)


def _invalid(errors: dict[str, list[str]]) -> JsonResponse:
    """400 for bad fields: ``error`` one line naming each field (what the page shows), ``errors`` by field."""
    return JsonResponse({"error": "; ".join(f"{field}: {' '.join(texts)}" for field, texts in errors.items()),
                         "errors": {field: list(texts) for field, texts in errors.items()}}, status=400)


@login_required
@require_POST
def chat_regenerate(request: HttpRequest, slug: str, conversation_id: str) -> HttpResponse:
    project, _membership, conversation = _chat_conversation(request, slug, conversation_id)
    return _turn_once(request, project, conversation, sent=False, take_turn=lambda: services.message_regenerate(
        conversation=conversation, model=_model_or_error(project, conversation)))


@login_required
@require_POST
def chat_stop(request: HttpRequest, slug: str, conversation_id: str, message_id: str) -> HttpResponse:
    _project, _conversation_row, message = get_message_for_user(request.user, slug, conversation_id, message_id)
    try:
        services.message_stop(message=message)
    except services.ChatError as error:
        return JsonResponse({"error": str(error)}, status=503)
    return JsonResponse({"stopping": message.public_id})


@login_required
@require_http_methods(["GET"])
def chat_message(request: HttpRequest, slug: str, conversation_id: str, message_id: str) -> HttpResponse:
    """One message rendered (the page swaps it in when an answer is done)."""
    _project, conversation, message = get_message_for_user(request.user, slug, conversation_id, message_id)
    # Regenerate asks the newest turn again: an older answer's timeout note does not offer it.
    newest = not conversation.messages.filter(pk__gt=message.pk).exists()
    return HttpResponse(render_to_string("chat/_message.html", {
        "message": message, "in_arena": conversation.in_arena, "newest": newest}, request=request))
