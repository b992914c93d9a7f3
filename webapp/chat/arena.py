"""Arena: blind battles between two models, votes, the preference pairs they make, the leaderboard.

A battle is two hidden conversations (``Conversation.in_arena``), one per model, each sent the same
prompt through the ordinary chat path, so the answers stream like any chat answer. Models are drawn
at random from the project's chat models and shown as A and B; their names appear once the user
has voted. Compare mode is the same with two models the user picks, named from the start; its votes
are preference pairs too but stay off the leaderboard, which rates blind votes only. A decisive vote (A or B) is a preference pair: the prompt, the chosen and rejected
answers, the two models and the voter. Pairs export as a ``preference`` dataset version, and voted
battles go to a review campaign (``battles_to_review``, each battle once per campaign).
"""
from __future__ import annotations

import dataclasses
import json
import secrets
from dataclasses import dataclass
from typing import Any

from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import transaction
from django.db.models import Count, Max, Q
from django.utils import timezone

from jaxengine.words import counted, with_article
from webapp.chat import services
from webapp.chat.leaderboard import Rating, Vote, leaderboard, win_rates
from webapp.chat.models import Battle, BattleOutcome, Conversation, Message, MessageStatus, Role
from webapp.chat.selectors import ModelChoice, chat_template_variables, distinct_labels, thinking_defaults
from webapp.core.bidi import isolated
from webapp.core.text import checked_name
from webapp.projects.models import Project
from webapp.review import selectors as review_selectors
from webapp.review import services as review_services
from webapp.review.models import Campaign, CampaignStatus, ItemSource
from webapp.review.services import Pair

DECISIVE = (BattleOutcome.A, BattleOutcome.B)


@transaction.atomic
def battle_create(*, project: Project, user, prompt: str, choices: list[ModelChoice],
                  compare: tuple[ModelChoice, ModelChoice] | None = None, enable_thinking: bool | None = None,
                  template_variables: dict[str, str] | None = None) -> Battle:
    """Send the prompt to two different models: drawn at random (a blind battle), or the two given
    (compare mode, names shown). ``enable_thinking``: the chat's Thinking switch for both (None: each model's own
    default), kept by each side whose model's chat template reads it, as a chat conversation keeps it, and sent with
    its answer's request. ``template_variables`` (compare mode only): values as typed of chat template variables, each
    kept by the side whose template reads it, as that model's own value is typed (``side_template_variables``)."""
    services.check_turn_text(prompt, field="prompt", what="prompt")
    template_variables = {name: value for name, value in (template_variables or {}).items() if value != ""}
    if template_variables and compare is None:
        raise ValidationError({"template_variables": "template variables are for compare mode, where you pick both "
                                                     "models; leave them empty for a blind battle"})
    if compare is not None:
        if compare[0].ref == compare[1].ref:
            raise services.ChatError("pick two different models to compare")
        model_a, model_b = compare
    elif len(choices := [choice for choice in choices if not choice.refused]) < 2:  # a blind draw skips refused ones
        raise services.ChatError("the arena needs at least two models in the project (base models or finished runs)")
    else:
        model_a, model_b = secrets.SystemRandom().sample(choices, 2)
    # Both models (and the project) before the battle's first row, as a chat turn locks its model: a deletion and
    # the battle are taken one after the other, and either is refused in words; the battle's refusal names the
    # battle, not the message each side's turn sends (which locks them again, at no cost).
    for model in (model_a, model_b):
        services.chat_model_lock(project=project, model=model, doing="as the battle was being started")
    reads_thinking = thinking_defaults([model_a, model_b])
    side_variables = side_template_variables(template_variables, (model_a, model_b))
    sides = []
    for model, variables in zip((model_a, model_b), side_variables):
        conversation = services.conversation_create(
            project=project, user=user, model=model,
            enable_thinking=enable_thinking if model.ref in reads_thinking else None, template_variables=variables)
        Conversation.objects.filter(pk=conversation.pk).update(in_arena=True)
        services.message_send(conversation=conversation, model=model, content=prompt)
        sides.append(conversation)
    return Battle.objects.create(project=project, user=user, prompt=prompt, side_a=sides[0], side_b=sides[1],
                                 blind=compare is None)


def side_template_variables(values: dict[str, str], models: tuple[ModelChoice, ModelChoice]
                            ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Compare mode's ``values`` (as typed) for each of ``models``: the variables its chat template reads, each as
    the chat's form types it for that model (``forms.typed_template_value``). A name neither template reads, or a
    value one cannot take, is a ``ValidationError`` keyed ``template_variables`` naming it."""
    from webapp.chat.forms import typed_template_value  # the forms import this module's services

    reads = [chat_template_variables(model) for model in models]
    problems, sides = [], ({}, {})
    for name, text in values.items():
        if not any(name in variables for variables in reads):
            problems.append(f"{isolated(name)}: neither model's chat template reads it; leave it empty")
            continue
        for variables, side in zip(reads, sides):
            if name in variables:
                try:
                    side[name] = typed_template_value(text, variables[name])
                except ValueError as error:
                    problems.append(f"{name}: {error}")
    if problems:
        raise ValidationError({"template_variables": problems})
    return sides


def battle_thinking(battle: Battle) -> bool | None:
    """The Thinking switch the battle was started with, as its sides keep it: None where it was each model's
    default, or where neither model's template reads it (it changed nothing)."""
    return next((side.enable_thinking for side in (battle.side_a, battle.side_b) if side.enable_thinking is not None),
                None)


def battle_answer(conversation: Conversation) -> Message | None:
    return conversation.messages.filter(role=Role.ASSISTANT).order_by("-created_at", "-id").first()


@transaction.atomic
def battle_vote(*, battle: Battle, outcome: str) -> Battle:
    """Record the user's vote (once, after both answers are done); returns the battle, names now shown."""
    battle = Battle.objects.select_for_update(of=("self",)).get(pk=battle.pk)
    if outcome not in BattleOutcome.values:
        raise services.ChatError(f"vote {outcome!r} is not one of {', '.join(BattleOutcome.values)}")
    if battle.outcome:
        raise services.ChatError("this battle already has a vote")
    answers = [battle_answer(battle.side_a), battle_answer(battle.side_b)]
    if any(answer is None or answer.status == MessageStatus.STREAMING for answer in answers):
        raise services.ChatError("wait for both answers before voting")
    if failed := failed_side(battle):
        raise services.ChatError(f"answer {failed} failed, so this battle cannot be rated: start a new battle "
                                 "with the same prompt")
    battle.outcome, battle.voted_at = outcome, timezone.now()
    battle.save(update_fields=["outcome", "voted_at"])
    return battle


def failed_side(battle: Battle) -> str:
    """"A" or "B" when that side's answer failed (an error, not the model's text: such a battle
    rates nothing and cannot be voted on), else ""."""
    for name, side in (("A", battle.side_a), ("B", battle.side_b)):
        answer = battle_answer(side)
        if answer is not None and answer.status == MessageStatus.FAILED:
            return name
    return ""


def _usable_answers(battle: Battle) -> tuple[Message, Message] | None:
    """Both answers of a voted battle when both can be one side of a preference pair: finished with
    some text (an empty or whitespace-only answer can be voted down, but a pair needs two texts, and
    the export's check refuses a blank one: the whole export failed)."""
    answers = battle_answer(battle.side_a), battle_answer(battle.side_b)
    if not battle.outcome or any(answer is None or not answer.content.strip() or answer.status in
                                 (MessageStatus.FAILED, MessageStatus.STREAMING) for answer in answers):
        return None
    return answers


def preference_pairs(*, project: Project) -> list[dict[str, Any]]:
    """The decisive votes of the project with two usable answers as preference rows (``prompt``,
    ``chosen``, ``rejected``) with an ``arena`` column naming the battle, the two models and the voter."""
    rows = []
    for battle in decisive_battles(project=project):
        if (answers := _usable_answers(battle)) is None:
            continue
        sides = [(battle.side_a, answers[0]), (battle.side_b, answers[1])]
        (winner, chosen), (loser, rejected) = sides if battle.outcome == BattleOutcome.A else sides[::-1]
        rows.append({"prompt": battle.prompt, "chosen": chosen.content, "rejected": rejected.content,
                     "arena": {"battle": battle.public_id, "chosen_model": winner.model_ref,
                               "rejected_model": loser.model_ref, "voter": battle.user.get_username()}})
    return rows


def arena_export(*, project: Project, user, dataset_name: str):
    """The project's preference pairs as the next version of ``preference`` dataset ``dataset_name``
    (created when new), validated like any upload. Returns the version. Every refusal is keyed by
    ``dataset_name``, the arena form's field, so the page shows it next to the name typed."""
    from webapp.datasets import services as dataset_services
    from webapp.datasets.selectors import dataset_named

    # Checked here under the form's field: the datasets service names its own argument, "name".
    dataset_name = checked_name(dataset_name, field="dataset_name", max_length=dataset_services.DATASET_NAME_MAX)
    if not dataset_name:
        raise ValidationError({"dataset_name": "name the dataset the preference pairs go to, e.g. "
                                               "'arena-preferences'"})
    rows = preference_pairs(project=project)
    if not rows:
        raise ValidationError({"dataset_name": "no decisive vote with two usable answers yet: vote A or B in some "
                                               "battles first"})
    content = "".join(json.dumps(row) + "\n" for row in rows).encode()
    with transaction.atomic():
        dataset = dataset_named(project=project, name=dataset_name)
        if dataset is not None and dataset.kind != "preference":
            raise ValidationError({"dataset_name": f"{isolated(dataset_name)} is {with_article(dataset.kind)} dataset; pick another "
                                                   "name"})
        if dataset is None:
            try:
                dataset = dataset_services.dataset_create(project=project, name=dataset_name, kind="preference",
                                                          user=user)
            except ValidationError as error:  # only the name can be refused now: taken by a dataset made
                # at the same moment
                raise ValidationError({"dataset_name": error.messages}) from error
        return dataset_services.dataset_version_create(
            dataset=dataset, upload=SimpleUploadedFile("arena.jsonl", content), file_format="jsonl",
            column_mapping={}, user=user)


@dataclass(frozen=True, kw_only=True)
class ReviewSend:
    """What sending battles to a review campaign did: items ``added``; battles ``already_sent`` to it
    (never added twice) and ``unusable`` ones (no vote yet, or an answer that failed or is empty)."""

    added: int
    already_sent: int
    unusable: int


def _battle_pair(battle: Battle) -> Pair | None:
    """A voted battle as a review pair: A and B as shown, a decisive vote as the original label."""
    if (answers := _usable_answers(battle)) is None:
        return None
    return Pair(prompt=battle.prompt, response_a=answers[0].content, response_b=answers[1].content,
                source=ItemSource.ARENA,
                metadata={"battle": battle.public_id, "model_a": battle.side_a.model_ref,
                          "model_a_label": battle.side_a.model_label, "model_b": battle.side_b.model_ref,
                          "model_b_label": battle.side_b.model_label, "voter": battle.user.get_username(),
                          "vote": battle.outcome},
                # review labels a source's pick: a or b only
                original_label=battle.outcome if battle.outcome in DECISIVE else "")


def battle_list(*, project: Project, user):
    """``user``'s battles in ``project``, newest first (ties of creation time by id, so a battle keeps its page), with
    both sides: the arena page's list, a page at a time, read through the (project, user, newest first) index, not by
    sorting every battle of theirs."""
    return (Battle.objects.filter(project=project, user=user).select_related("side_a", "side_b")
            .order_by("-created_at", "-id"))


def rated_battles(*, project: Project):
    """The project's voted battles whose answers both finished (a vote recorded on a failed answer, as
    once possible, rates nothing).

    The arena counts its decisive votes on each load: the failed answers' conversations are found once, through the
    messages' (status, conversation) index (there are few), and the battles through their (project, outcome, blind,
    side_a, side_b) index, which holds all a count asks; two ``EXISTS`` on every battle's messages took 18 ms at
    5,000 battles (bench/pages_at_scale.py)."""
    failed = Message.objects.filter(status=MessageStatus.FAILED).values("conversation_id")
    return (Battle.objects.filter(project=project).exclude(outcome="")
            .exclude(side_a_id__in=failed).exclude(side_b_id__in=failed))


def decisive_battles(*, project: Project):
    """The project's rated battles with a decisive vote (every voter's), oldest vote first."""
    return (rated_battles(project=project).filter(outcome__in=DECISIVE)
            .select_related("side_a", "side_b", "user").order_by("voted_at", "id"))


@dataclass(frozen=True, kw_only=True)
class DecisiveVotes:
    """The project's decisive votes as the arena page counts them: ``pairs``, those ``preference_pairs`` writes (and
    review takes); ``left_out``, those on an empty answer, which make no pair."""

    pairs: int
    left_out: int


def empty_answer_conversations():
    """The ids of the arena conversations holding an answer with no text (empty, whitespace only) or not finished (a
    streaming answer has none until ``message_finish`` writes it): the sides whose votes may make no preference pair.
    Every project's, as few as they are, read from the partial index of the messages without text alone: a project's
    battles name only its own conversations, and narrowing it to the project's conversations first read them all
    (4.5 ms at 20,000); matching every arena answer's text against a pattern took 31 ms (bench/arena_empty_answers.py)."""
    return (Message.objects.filter(has_text=False, role=Role.ASSISTANT, conversation__in_arena=True)
            .order_by().values("conversation_id"))


def decisive_votes(*, project: Project) -> DecisiveVotes:
    """How many decisive votes make a preference pair, and how many do not (``_usable_answers``: an answer empty).

    Counted on each load of the arena: the decisive battles by one count from the ``chat_battle_rated`` index; the few
    whose side holds an empty (or unfinished) answer found once through the messages' index of those without text
    (``empty_answer_conversations``), then judged one by one as the export judges them. A voted battle always has both answers (``battle_vote`` waits for them)."""
    decisive = decisive_battles(project=project)
    empty = empty_answer_conversations()
    suspects = decisive.filter(Q(side_a_id__in=empty) | Q(side_b_id__in=empty))
    left_out = sum(1 for battle in suspects if _usable_answers(battle) is None)
    return DecisiveVotes(pairs=decisive.count() - left_out, left_out=left_out)


@transaction.atomic
def battles_to_review(*, campaign: Campaign, battles) -> ReviewSend:
    """Add ``battles`` (of the campaign's project) to a ready review campaign, each once: a battle
    already in the campaign is left out, as are battles without a vote or a usable answer. A campaign on two models'
    answers is refused: its page, model preference and export speak of those two models on its prompts only."""
    if campaign.status != CampaignStatus.READY:
        raise ValidationError({"campaign": f"campaign {campaign.name} is {campaign.get_status_display().lower()}; "
                                           "send battles once it is ready"})
    if campaign.generation:
        models = " and ".join(isolated(campaign.generation[side]["label"]) for side in ("model_a", "model_b"))
        raise ValidationError({"campaign": f"campaign {isolated(campaign.name)} compares the answers of {models} to the "
                                           "same prompts; arena battles go to a campaign on arena votes or on a "
                                           "dataset"})
    # Lock the campaign first, so that two sends at once cannot both find a battle new.
    campaign = Campaign.objects.select_for_update(of=("self",)).get(pk=campaign.pk)
    sent = review_selectors.arena_battle_ids(campaign=campaign)
    pairs, already_sent, unusable = [], 0, 0
    for battle in battles:
        if battle.project_id != campaign.project_id:
            raise ValidationError({"battle": f"battle {battle.public_id} is not of this campaign's project"})
        if battle.public_id in sent:
            already_sent += 1
            continue
        pair = _battle_pair(battle)
        if pair is None:
            unusable += 1
            continue
        sent.add(battle.public_id)
        pairs.append(pair)
    review_services.items_add(campaign=campaign, pairs=pairs)
    return ReviewSend(added=len(pairs), already_sent=already_sent, unusable=unusable)


@transaction.atomic
def arena_campaign_create(*, project: Project, name: str, required_reviews: int, user) -> tuple[Campaign, ReviewSend]:
    """A new review campaign on every decisive vote of the project, reviewed by all its members and
    owners (the owner can change them in the campaign's settings). Reviews per item above their number are refused:
    no item could ever be complete (a campaign whose reviewers are ticked may get more later; these are everyone)."""
    reviewers = review_selectors.possible_reviewers(project=project)
    if required_reviews > (available := reviewers.count()):
        raise ValidationError({"required_reviews": (
            f"reviews per item is {required_reviews}, but {counted(available, 'person', 'people')} of this project "
            f"may review (its members and owners): ask for at most {available}, or add members first")})
    campaign = review_services.campaign_create(
        project=project, name=name, required_reviews=required_reviews, reviewers=reviewers, source_version=None,
        guidelines="Pairs from arena votes: the voter's pick is the original label.", user=user)
    send = battles_to_review(campaign=campaign, battles=decisive_battles(project=project))
    if not send.added:
        raise ValidationError({"name": "no decisive vote has usable answers yet: vote A or B in some battles first"})
    return campaign, send


def compare_mode_votes(*, project: Project) -> int:
    """The rated votes of ``project`` cast in compare mode (both models picked, their names shown), which the
    leaderboard leaves out: what its empty page counts, so that such a vote does not look lost."""
    return rated_battles(project=project).filter(blind=False).count()


# The leaderboard of 5,000 votes takes 70 ms to read and fit (bench/pages_at_scale.py), on every load of the
# leaderboard page; its input changes only when a vote is cast, so it is cached per vote state.
LEADERBOARD_CACHE_SECONDS = 24 * 3600


def project_leaderboard(*, project: Project) -> tuple[list[Rating], dict]:
    """Ratings and pairwise win rates from every rated blind vote in the project, by model (its ref:
    two runs may share a name), shown by label; a label two models share is followed by the ref. Cached until
    a vote is cast or one stops counting (its battle deleted, an answer failed)."""
    votes = rated_battles(project=project).filter(blind=True)
    state = votes.aggregate(count=Count("pk"), last=Max("pk"), last_vote=Max("voted_at"))
    last_vote = state["last_vote"].isoformat() if state["last_vote"] else ""
    key = f"arena-leaderboard:{project.pk}:{state['count']}:{state['last']}:{last_vote}"
    board = cache.get(key)
    if board is None:
        board = _fitted_leaderboard(votes)
        cache.set(key, board, LEADERBOARD_CACHE_SECONDS)
    return board


def _fitted_leaderboard(rated) -> tuple[list[Rating], dict]:
    # Five columns, not two Conversation rows per battle: building those objects was most of the page's time
    # (10,000 votes: 0.39 s against 0.02 s).
    battles = (rated.order_by("id")
               .values_list("side_a__model_ref", "side_a__model_label", "side_b__model_ref", "side_b__model_label",
                            "outcome"))
    votes, labels = [], {}
    for ref_a, label_a, ref_b, label_b, outcome in battles:
        labels[ref_a], labels[ref_b] = label_a, label_b  # the latest battle's label of each model
        if ref_a != ref_b:
            votes.append(Vote(model_a=ref_a, model_b=ref_b, outcome=outcome))
    shown = distinct_labels(labels)
    ratings = [dataclasses.replace(rating, model=shown[rating.model]) for rating in leaderboard(votes)]
    rates = {(shown[first], shown[second]): rate for (first, second), rate in win_rates(votes).items()}
    return ratings, rates
