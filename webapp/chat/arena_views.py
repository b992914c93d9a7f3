"""Arena pages: start a battle (or, in compare mode, pick both models), watch both answers stream
side by side, anonymously in a battle, vote, see the names; the
project leaderboard; export of the decisive votes as a preference dataset. Member role, like the
chat; a battle is its voter's own (others get 404); the leaderboard is the project's. Owners, who
manage review campaigns, send battles to one (ticked ones of their own, or every decisive vote of
the project not yet in it) or start a campaign on the arena votes."""
from __future__ import annotations

import json

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from webapp.chat import arena, selectors, services
from webapp.chat.access import chat_access
from webapp.chat.forms import (THINKING_CHOICES, THINKING_HELP, VARIABLE_PREFIX, ArenaExportForm, as_typed_text,
                               template_variable_field, thinking_choice)
from webapp.chat.leaderboard import MIN_VOTES_FOR_INTERVAL
from webapp.chat.models import Battle, BattleOutcome, MessageStatus
from webapp.chat.services import ChatError
from webapp.chat.views import no_serve_worker_context
from webapp.core.bidi import isolated
from webapp.core.forms import add_service_errors
from webapp.core.numbers import whole_number
from webapp.core.submissions import form_send_once
from webapp.core.text import typed_text
from webapp.projects.access import get_project_for_user
from webapp.projects.models import Membership, Project
from webapp.projects.models import Role as ProjectRole
from webapp.review import selectors as review_selectors
from webapp.review.models import MAX_REQUIRED_REVIEWS

BATTLES_PER_PAGE = 50


def _battle(request: HttpRequest, slug: str, battle_id: str):
    project, membership = chat_access(request.user, slug)
    battle = (Battle.objects.select_related("side_a", "side_b")
              .filter(project=project, user=request.user, public_id=battle_id).first())
    if battle is None:
        raise Http404("no such battle")
    return project, membership, battle


def _review_context(project: Project, membership: Membership) -> dict:
    """What the arena pages need for sending battles to review (owners only)."""
    if not membership.can(ProjectRole.OWNER):
        return {"can_send_to_review": False}
    campaigns = review_selectors.campaigns_taking_battles(project=project)
    return {"can_send_to_review": True, "review_campaigns": campaigns,
            "arena_required_reviews": review_selectors.default_required_reviews(project=project),
            # Its reviewers are everyone who may review: more reviews per item than that are refused.
            "arena_reviewers_available": min(MAX_REQUIRED_REVIEWS,
                                             max(1, review_selectors.possible_reviewers(project=project).count()))}


@login_required
@require_http_methods(["GET", "POST"])
def arena_home(request: HttpRequest, slug: str) -> HttpResponse:
    project, membership = chat_access(request.user, slug)
    error = ""
    choices = selectors.model_choices(project=project)
    if request.method == "POST":
        picked = [next((c for c in choices if c.ref == request.POST.get(field)), None) for field in ("model_a", "model_b")]
        try:
            if any(request.POST.get(field) for field in ("model_a", "model_b")) and None in picked:
                raise ChatError("compare mode needs two models of this project; leave both empty for a blind battle")
            enable_thinking = thinking_choice(request.POST.get("thinking", ""))
            variables = {key[len(VARIABLE_PREFIX):]: typed_text(value) for key, value in request.POST.items()
                         if key.startswith(VARIABLE_PREFIX)}

            def start() -> str:
                battle = arena.battle_create(project=project, user=request.user,
                                             prompt=typed_text(request.POST.get("prompt", "")),
                                             choices=choices, compare=None if None in picked else tuple(picked),
                                             enable_thinking=enable_thinking, template_variables=variables)
                return reverse("chat:battle", kwargs={"slug": project.slug, "battle_id": battle.public_id})

            return redirect(form_send_once(request, create=start))
        except ValidationError as problem:  # the prompt (blank, a NUL, too long), the Thinking choice, a variable
            error = " ".join(problem.messages)
        except ChatError as problem:
            error = str(problem)
    # A refused battle shows its form again as it was sent, so the prompt need not be typed again.
    sent = {field: request.POST.get(field, "") for field in ("prompt", "model_a", "model_b", "thinking")} if error else {}
    if error:
        sent["variables"] = {key[len(VARIABLE_PREFIX):]: value for key, value in request.POST.items()
                             if key.startswith(VARIABLE_PREFIX)}
    return _arena_page(request, project, membership, choices=choices, error=error, sent=sent,
                       status=400 if error else 200)


def _arena_page(request: HttpRequest, project: Project, membership: Membership, *, choices=None, error: str = "",
                sent: dict | None = None, export_form: ArenaExportForm | None = None, status: int = 200) -> HttpResponse:
    page = Paginator(arena.battle_list(project=project, user=request.user), BATTLES_PER_PAGE).get_page(
        whole_number(request.GET.get("page")))
    choices = selectors.model_choices(project=project) if choices is None else choices
    rows = [{"battle": battle, "thinking": arena.battle_thinking(battle)} for battle in page.object_list]
    thinking_offered = bool(selectors.thinking_defaults(choices))
    variables = _compare_variables(choices, sent or {})
    return render(request, "chat/arena.html", {
        "project": project, "membership": membership, "error": error, "battles": rows, "page": page,
        # Also answered at arena/export/ (an export refused): the page links point at the arena itself.
        "page_base": reverse("chat:arena", kwargs={"slug": project.slug}),
        "choices": choices, "sent": sent or {},
        # The Thinking control, as the chat's switch, only where a model of the project reads enable_thinking.
        "thinking_choices": THINKING_CHOICES if thinking_offered else None,
        # The table's Thinking column, where a battle could have had it (or had it, from a model since removed).
        "thinking_column": thinking_offered or any(row["thinking"] is not None for row in rows),
        "thinking_help": THINKING_HELP, "template_variables": variables,
        "variables_shown": any(variable["shown"] for variable in variables),
        "decisive": arena.decisive_votes(project=project), "prompt_max_chars": services.MESSAGE_MAX_CHARS,
        "export_form": export_form or ArenaExportForm(), **_review_context(project, membership)}, status=status)


def _compare_variables(choices, sent: dict) -> list[dict]:
    """Compare mode's chat template variables: each that some model's template reads, with those models (``readers``,
    their refs as JSON for forms.js, which shows, enables and sends a variable only where model A's or B's template
    reads it, both being picked: a blind battle takes none; ``models``, their labels) and its field (``field``, the
    chat panel's ``template_variable_field``: a switch's is a select), holding the value sent. ``shown``: so on a
    refused battle's form, which comes back as it was sent (``sent``'s models and ``variables``)."""
    readers: dict[str, dict[str, selectors.TemplateVariable]] = {}
    for choice in choices:
        for name, variable in selectors.chat_template_variables(choice).items():
            readers.setdefault(name, {})[choice.ref] = variable
    labels = {choice.ref: choice.label for choice in choices}
    picked = {sent.get("model_a"), sent.get("model_b")}
    compared = "" not in picked and None not in picked
    values = sent.get("variables", {})
    fields = forms.Form(initial={f"{VARIABLE_PREFIX}{name}": value for name, value in values.items()})
    variables = []
    for name, models in sorted(readers.items()):
        field_name = f"{VARIABLE_PREFIX}{name}"
        shown = compared and any(ref in picked for ref in models)
        field = fields.fields[field_name] = template_variable_field(name=name, readers=models.values())
        field.widget.attrs.update({"aria-describedby": f"id_{field_name}_helptext",
                                   "data-template-variable": json.dumps({ref: "" for ref in models}),
                                   **({} if shown else {"disabled": True})})
        variables.append({"name": name, "field": fields[field_name], "models": [labels[ref] for ref in models],
                          "shown": shown})
    return variables


@login_required
@require_http_methods(["GET"])
def arena_battle(request: HttpRequest, slug: str, battle_id: str) -> HttpResponse:
    project, membership, battle = _battle(request, slug, battle_id)
    sides = []
    for name, conversation in (("A", battle.side_a), ("B", battle.side_b)):
        answer = arena.battle_answer(conversation)
        if services.message_give_up_if_lost(message=answer):  # else the vote would wait for it for ever
            answer.refresh_from_db()
        kwargs = {"slug": project.slug, "conversation_id": conversation.public_id, "message_id": answer.public_id}
        sides.append({"name": name, "answer": answer, "model": conversation.model_label if battle.outcome or not battle.blind else None,
                      "variables": conversation.template_variables,
                      "events": reverse("chat:events", kwargs=kwargs), "html": reverse("chat:message", kwargs=kwargs)})
    return render(request, "chat/battle.html", {
        "project": project, "membership": membership, "battle": battle, "sides": sides,
        "thinking": arena.battle_thinking(battle),
        # Compare mode's template variables as its form takes them, for another battle with the same settings.
        "variables_sent": {f"{VARIABLE_PREFIX}{name}": as_typed_text(value) for name, value in
                           {**battle.side_b.template_variables, **battle.side_a.template_variables}.items()},
        "outcomes": BattleOutcome.choices,
        # The vote opens once both answers are done (battle_vote refuses it before); the page enables it.
        "answering": any(side["answer"].status == MessageStatus.STREAMING for side in sides),
        # A failed answer (an error, not the model's text) rates nothing: no vote, the same prompt again.
        "failed_side": arena.failed_side(battle), **no_serve_worker_context()})


@login_required
@require_POST
def arena_vote(request: HttpRequest, slug: str, battle_id: str) -> HttpResponse:
    project, _membership, battle = _battle(request, slug, battle_id)
    try:
        arena.battle_vote(battle=battle, outcome=request.POST.get("outcome", ""))
    except ChatError as error:
        messages.error(request, str(error))
    return redirect("chat:battle", slug=project.slug, battle_id=battle.public_id)


@login_required
@require_POST
def arena_export(request: HttpRequest, slug: str) -> HttpResponse:
    """Export the decisive votes as the next version of a preference dataset; a refusal shows the arena page
    again with the error next to the name field and the name as typed."""
    project, membership = chat_access(request.user, slug)
    form = ArenaExportForm(request.POST)
    if form.is_valid():  # the field refuses a NUL; the service checks the rest of the name
        name = form.cleaned_data["dataset_name"] or ArenaExportForm.base_fields["dataset_name"].initial

        def export() -> str:
            version = arena.arena_export(project=project, user=request.user, dataset_name=name)
            messages.success(request, f"Exported {isolated(version.dataset.name)} v{version.number}; it is being "
                                      "validated.")
            return reverse("datasets:version", kwargs={"slug": project.slug, "public_id": version.dataset.public_id,
                                                       "number": version.number})

        try:
            return redirect(form_send_once(request, create=export))
        except ValidationError as error:
            add_service_errors(form, error)
    return _arena_page(request, project, membership, export_form=form, status=400)


@login_required
@require_http_methods(["GET"])
def arena_leaderboard(request: HttpRequest, slug: str) -> HttpResponse:
    """The ratings from every vote of the project: a read, so viewers see it too (battles and votes,
    which spend accelerator time, take the member role)."""
    project, membership = get_project_for_user(request.user, slug)
    ratings, rates = arena.project_leaderboard(project=project)
    return render(request, "chat/leaderboard.html", {
        "project": project, "membership": membership, "ratings": ratings, **_review_context(project, membership),
        "min_votes_for_interval": MIN_VOTES_FOR_INTERVAL,
        "compare_mode_votes": 0 if ratings else arena.compare_mode_votes(project=project),
        "win_rates": [{"model": first, "opponent": second, "rate": rate, "games": games}
                      for (first, second), (rate, games) in sorted(rates.items())]})


def _back(request: HttpRequest, project: Project) -> str:
    """Where the Team review forms go back to: the leaderboard, or the page of the arena's battles they were sent
    from (its ticks were that page's)."""
    if request.POST.get("back") == "leaderboard":
        return reverse("chat:leaderboard", kwargs={"slug": project.slug})
    arena_url = reverse("chat:arena", kwargs={"slug": project.slug})
    page = whole_number(request.POST.get("page"))
    return f"{arena_url}?page={page}" if page and page > 1 else arena_url


def _sent_message(send: arena.ReviewSend, campaign_name: str) -> str:
    parts = [f"{send.added} battle{'s' if send.added != 1 else ''} added to {isolated(campaign_name)}"]
    if send.already_sent:
        parts.append(f"{send.already_sent} already there")
    if send.unusable:
        parts.append(f"{send.unusable} without a vote or a usable answer left out")
    return "; ".join(parts) + "."


@login_required
@require_POST
def arena_to_review(request: HttpRequest, slug: str) -> HttpResponse:
    """Send the ticked battles (the owner's own, on one page of the arena's list), or every decisive battle of the
    project (``scope=all``), to a ready review campaign; battles already in it are not added again."""
    project, _membership = get_project_for_user(request.user, slug, min_role=ProjectRole.OWNER)
    back = _back(request, project)
    if not request.POST.get("campaign"):
        messages.error(request, "Pick the review campaign to send the battles to.")
        return redirect(back)
    campaign = review_selectors.campaign_get(project=project, public_id=request.POST["campaign"])
    if request.POST.get("scope") == "all":
        battles = arena.decisive_battles(project=project)
    else:
        ids = set(request.POST.getlist("battle"))
        if not ids:
            messages.error(request, "Tick the battles to send, or send all decisive battles.")
            return redirect(back)
        battles = list(Battle.objects.filter(project=project, user=request.user, public_id__in=ids)
                       .select_related("side_a", "side_b", "user").order_by("created_at", "id"))
        if len(battles) != len(ids):
            raise Http404("no such battle")
    try:
        send = arena.battles_to_review(campaign=campaign, battles=battles)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        messages.success(request, _sent_message(send, campaign.name))
    return redirect(back)


@login_required
@require_POST
def arena_review_create(request: HttpRequest, slug: str) -> HttpResponse:
    """A new review campaign on every decisive arena vote of the project."""
    project, _membership = get_project_for_user(request.user, slug, min_role=ProjectRole.OWNER)
    back = _back(request, project)

    def create() -> str:
        campaign, send = arena.arena_campaign_create(project=project, name=request.POST.get("name", ""),
                                                     required_reviews=required_reviews, user=request.user)
        messages.success(request, f"Campaign {isolated(campaign.name)} created: {_sent_message(send, campaign.name)} "
                                  "Its reviewers are every member and owner; change them in Settings.")
        return reverse("review:detail", args=[project.slug, campaign.public_id])

    # Typed by a person: ASCII digits only (int() took "1_0" as 10); the service checks the range.
    required_reviews = whole_number(request.POST.get("required_reviews", "2").strip())
    if required_reviews is None:
        messages.error(request, f"Reviews per item must be a whole number from 1 to {MAX_REQUIRED_REVIEWS}.")
        return redirect(back)
    try:
        return redirect(form_send_once(request, create=create))
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    return redirect(back)
