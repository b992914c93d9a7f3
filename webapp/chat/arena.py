"""Arena: blind battles between two models, votes, the preference pairs they make, the leaderboard.

A battle is two hidden conversations (``Conversation.in_arena``), one per model, each sent the same
prompt through the ordinary chat path, so the answers stream like any chat answer. Models are drawn
at random from the project's chat models and shown as A and B; their names appear once the user
has voted. Compare mode is the same with two models the user picks, named from the start; its votes
are preference pairs too but stay off the leaderboard, which rates blind votes only. A decisive vote (A or B) is a preference pair: the prompt, the chosen and rejected
answers, the two models and the voter. Pairs export as a ``preference`` dataset version, and any
battle can go to a review campaign (``webapp.review.services.item_add``).
"""
from __future__ import annotations

import json
import secrets
from typing import Any

from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import transaction
from django.utils import timezone

from webapp.chat import services
from webapp.chat.leaderboard import Rating, Vote, leaderboard, win_rates
from webapp.chat.models import Battle, BattleOutcome, Conversation, Message, MessageStatus, Role
from webapp.chat.selectors import ModelChoice
from webapp.projects.models import Project

DECISIVE = (BattleOutcome.A, BattleOutcome.B)


@transaction.atomic
def battle_create(*, project: Project, user, prompt: str, choices: list[ModelChoice],
                  compare: tuple[ModelChoice, ModelChoice] | None = None) -> Battle:
    """Send the prompt to two different models: drawn at random (a blind battle), or the two given
    (compare mode, names shown)."""
    if not prompt.strip():
        raise services.ChatError("the prompt is empty")
    if compare is not None:
        if compare[0].ref == compare[1].ref:
            raise services.ChatError("pick two different models to compare")
        model_a, model_b = compare
    elif len(choices) < 2:
        raise services.ChatError("the arena needs at least two models in the project (base models or finished runs)")
    else:
        model_a, model_b = secrets.SystemRandom().sample(choices, 2)
    sides = []
    for model in (model_a, model_b):
        conversation = services.conversation_create(project=project, user=user, model=model)
        Conversation.objects.filter(pk=conversation.pk).update(in_arena=True)
        services.message_send(conversation=conversation, model=model, content=prompt)
        sides.append(conversation)
    return Battle.objects.create(project=project, user=user, prompt=prompt, side_a=sides[0], side_b=sides[1],
                                 blind=compare is None)


def battle_answer(conversation: Conversation) -> Message | None:
    return conversation.messages.filter(role=Role.ASSISTANT).order_by("-created_at", "-id").first()


@transaction.atomic
def battle_vote(*, battle: Battle, outcome: str) -> Battle:
    """Record the user's vote (once, after both answers are done); returns the battle, names now shown."""
    battle = Battle.objects.select_for_update().get(pk=battle.pk)
    if outcome not in BattleOutcome.values:
        raise services.ChatError(f"vote {outcome!r} is not one of {', '.join(BattleOutcome.values)}")
    if battle.outcome:
        raise services.ChatError("this battle already has a vote")
    answers = [battle_answer(battle.side_a), battle_answer(battle.side_b)]
    if any(answer is None or answer.status == MessageStatus.STREAMING for answer in answers):
        raise services.ChatError("wait for both answers before voting")
    battle.outcome, battle.voted_at = outcome, timezone.now()
    battle.save(update_fields=["outcome", "voted_at"])
    return battle


def preference_pairs(*, project: Project) -> list[dict[str, Any]]:
    """The decisive votes of the project as preference rows (``prompt``, ``chosen``, ``rejected``) with an
    ``arena`` column naming the battle, the two models and the voter."""
    rows = []
    battles = (Battle.objects.filter(project=project, outcome__in=DECISIVE)
               .select_related("side_a", "side_b", "user").order_by("voted_at", "id"))
    for battle in battles:
        sides = [battle.side_a, battle.side_b]
        winner, loser = sides if battle.outcome == BattleOutcome.A else sides[::-1]
        rows.append({"prompt": battle.prompt, "chosen": battle_answer(winner).content,
                     "rejected": battle_answer(loser).content,
                     "arena": {"battle": battle.public_id, "chosen_model": winner.model_ref,
                               "rejected_model": loser.model_ref, "voter": battle.user.get_username()}})
    return rows


def arena_export(*, project: Project, user, dataset_name: str):
    """The project's preference pairs as the next version of ``preference`` dataset ``dataset_name``
    (created when new), validated like any upload. Returns the version."""
    from webapp.datasets import services as dataset_services
    from webapp.datasets.models import Dataset

    rows = preference_pairs(project=project)
    if not rows:
        raise ValidationError({"dataset_name": "no decisive votes yet: vote A or B in some battles first"})
    content = "".join(json.dumps(row) + "\n" for row in rows).encode()
    with transaction.atomic():
        dataset = Dataset.objects.filter(project=project, name=dataset_name).first()
        if dataset is not None and dataset.kind != "preference":
            raise ValidationError({"dataset_name": f"{dataset_name} is a {dataset.kind} dataset; pick another name"})
        if dataset is None:
            dataset = dataset_services.dataset_create(project=project, name=dataset_name, kind="preference", user=user)
        return dataset_services.dataset_version_create(
            dataset=dataset, upload=SimpleUploadedFile("arena.jsonl", content), file_format="jsonl",
            column_mapping={}, user=user)


def battle_to_review(*, battle: Battle, campaign):
    """Send a battle to a review campaign: A and B as shown, a decisive vote as the original label."""
    from webapp.review.services import item_add

    label = battle.outcome if battle.outcome in DECISIVE else ""  # review labels a source's pick: a or b only
    return item_add(campaign=campaign, prompt=battle.prompt, response_a=battle_answer(battle.side_a).content,
                    response_b=battle_answer(battle.side_b).content, source="arena",
                    metadata={"battle": battle.public_id, "model_a": battle.side_a.model_ref,
                              "model_b": battle.side_b.model_ref, "voter": battle.user.get_username()},
                    original_label=label)


def project_leaderboard(*, project: Project) -> tuple[list[Rating], dict]:
    """Ratings (by model label) and pairwise win rates from every blind vote in the project."""
    votes = [Vote(model_a=battle.side_a.model_label, model_b=battle.side_b.model_label, outcome=battle.outcome)
             for battle in (Battle.objects.filter(project=project, blind=True).exclude(outcome="")
                            .select_related("side_a", "side_b"))
             if battle.side_a.model_label != battle.side_b.model_label]
    return leaderboard(votes), win_rates(votes)
