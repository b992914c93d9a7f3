"""Arena pages: start a battle (or, in compare mode, pick both models), watch both answers stream
side by side, anonymously in a battle, vote, see the names; the
project leaderboard; export of the decisive votes as a preference dataset. Member role, like the
chat; a battle is its voter's own (others get 404); the leaderboard is the project's."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from webapp.chat import arena, selectors
from webapp.chat.access import chat_access
from webapp.chat.models import Battle, BattleOutcome
from webapp.chat.services import ChatError


def _battle(request: HttpRequest, slug: str, battle_id: str):
    project, membership = chat_access(request.user, slug)
    battle = (Battle.objects.select_related("side_a", "side_b")
              .filter(project=project, user=request.user, public_id=battle_id).first())
    if battle is None:
        raise Http404("no such battle")
    return project, membership, battle


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
            battle = arena.battle_create(project=project, user=request.user, prompt=request.POST.get("prompt", ""),
                                         choices=choices, compare=None if None in picked else tuple(picked))
        except ChatError as problem:
            error = str(problem)
        else:
            return redirect("chat:battle", slug=project.slug, battle_id=battle.public_id)
    battles = Battle.objects.filter(project=project, user=request.user).select_related("side_a", "side_b")[:50]
    return render(request, "chat/arena.html", {"project": project, "membership": membership, "error": error,
                                               "battles": battles, "choices": choices,
                                               "pairs": len(arena.preference_pairs(project=project))},
                  status=400 if error else 200)


@login_required
@require_http_methods(["GET"])
def arena_battle(request: HttpRequest, slug: str, battle_id: str) -> HttpResponse:
    project, membership, battle = _battle(request, slug, battle_id)
    sides = []
    for name, conversation in (("A", battle.side_a), ("B", battle.side_b)):
        answer = arena.battle_answer(conversation)
        kwargs = {"slug": project.slug, "conversation_id": conversation.public_id, "message_id": answer.public_id}
        sides.append({"name": name, "answer": answer, "model": conversation.model_label if battle.outcome or not battle.blind else None,
                      "events": reverse("chat:events", kwargs=kwargs), "html": reverse("chat:message", kwargs=kwargs)})
    return render(request, "chat/battle.html", {"project": project, "membership": membership, "battle": battle,
                                                "sides": sides, "outcomes": BattleOutcome.choices})


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
    project, _membership = chat_access(request.user, slug)
    name = request.POST.get("dataset_name", "").strip() or "arena-preferences"
    try:
        version = arena.arena_export(project=project, user=request.user, dataset_name=name)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
        return redirect("chat:arena", slug=project.slug)
    messages.success(request, f"Exported {version.dataset.name} v{version.number}; it is being validated.")
    return redirect("datasets:version", slug=project.slug, public_id=version.dataset.public_id,
                    number=version.number)


@login_required
@require_http_methods(["GET"])
def arena_leaderboard(request: HttpRequest, slug: str) -> HttpResponse:
    project, membership = chat_access(request.user, slug)
    ratings, rates = arena.project_leaderboard(project=project)
    return render(request, "chat/leaderboard.html", {
        "project": project, "membership": membership, "ratings": ratings,
        "win_rates": [{"model": first, "opponent": second, "rate": rate, "games": games}
                      for (first, second), (rate, games) in sorted(rates.items())]})
