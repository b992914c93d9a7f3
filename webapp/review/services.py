"""Writes of review campaigns: campaigns, items, the reviewer queue, reviews, conflict resolution
and exports. Callers check project access first (``get_project_for_user``; the owner role for
campaign management); these functions keep the invariants whoever calls them.

Queue design (``queue_next_item``), measured by ``bench/review_queue.py``: an item needs reviews
exactly while it is pending or in review, so the queue walks the (campaign, status, sequence) index
once per open status, in ``sequence`` order from the reviewer's cursor, keeping items this reviewer
has not answered (a probe of the (item, reviewer) unique index), and takes the earlier of the two.
Complete and conflicting items are never read. The cursor moves up lazily to just before the first
item still open to the reviewer, so the walk never re-reads what a reviewer has finished.
A served item is leased to its reviewer for ``LEASE_SECONDS`` (a ``Lease`` row); while the lease lasts
it holds one of the item's places, so reviewers working at the same time are given different items
and share one only while it has room: an item is handed over only while its answers and the live
leases of others are fewer than ``required_reviews``. That is decided under the item's row lock
(``_lease``), so two reviewers asking at once cannot both take its last place.

A conflict whose reviews an owner read on the conflicts page (``ConflictRead``) is served to them no more than one
they answered: raising reviews per item sends conflicts back to review for another answer, and that answer must be
blind to the others (the page shows them, their comments and the models).
"""
from __future__ import annotations

import collections
import hashlib
import itertools
import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.files.uploadedfile import TemporaryUploadedFile
from django.db import IntegrityError, transaction
from django.db.models import Exists, F, OuterRef, QuerySet
from django.db.models.lookups import LessThan
from django.template.defaultfilters import pluralize
from django.utils import timezone
from kombu.exceptions import OperationalError

from jaxengine.data import formats
from jaxengine.data.formats import is_same_response
from jaxengine.words import with_article
from webapp.activity.models import Verb
from webapp.activity.services import activity_record
from webapp.celery import app as celery_app
from webapp.chat.selectors import model_choice
from webapp.chat.services import model_lock
from webapp.core.bidi import isolated
from webapp.core.templatetags.temper import when
from webapp.core.text import LONG_TEXT_MAX_CHARS, checked_name, checked_text, storable_model_text
from webapp.datasets import services as dataset_services
from webapp.datasets.models import Dataset, DatasetVersion, VersionStatus
from webapp.datasets.selectors import dataset_named
from webapp.projects.models import Membership, Project, Role
from webapp.projects.services import project_lock
from webapp.review import agreement, selectors
from webapp.review.models import (
    MAX_REQUIRED_REVIEWS, Campaign, CampaignReviewer, CampaignStatus, Choice, ConflictRead, Export, ExportStatus, Item,
    ItemSource, ItemStatus, Label, Lease, Review,
)
from webapp.runs.services import held_task_messages
from webapp.webhooks import services as webhooks
from webapp.workers.deliveries import LostWorker, task_deliveries

logger = logging.getLogger(__name__)

LOAD_TASK = "worker.tasks.review.load_campaign_items"
EXPORT_TASK = "worker.tasks.review.write_export"
GENERATE_TASK = "worker.tasks.review.generate_campaign_answers"
GENERATE_QUEUE = "serve"
LEASE_SECONDS = 600
ITEM_BATCH = 2000
# A generation that has reported answers (or was asked for) within this long is taken to be under
# way without asking Redis; answers come a slice of prompts at a time, seconds apart.
GENERATION_QUIET_SECONDS = 60


# --- Pure rules --------------------------------------------------------------------------------------

def shown_first_for(*, item_public_id: str, user_id: int) -> str:
    """Which response (``"a"`` or ``"b"``) a reviewer sees first: a fair coin drawn per (reviewer, item),
    the same on every visit so a reload does not reshuffle the page."""
    digest = hashlib.sha256(f"{item_public_id}:{user_id}".encode()).digest()
    return "a" if digest[0] & 1 else "b"


def label_for_choice(choice: str, *, shown_first: str) -> str:
    """A choice as clicked (first/second/...) in item terms (a/b/...)."""
    if choice == Choice.FIRST:
        return shown_first
    if choice == Choice.SECOND:
        return "b" if shown_first == "a" else "a"
    return {Choice.TIE: Label.TIE, Choice.BOTH_BAD: Label.BOTH_BAD, Choice.SKIP: Label.SKIP}[choice]


def majority_label(labels: list[str]) -> str | None:
    """The label more than half of ``labels`` agree on, if any."""
    if not labels:
        return None
    top, count = max(((label, labels.count(label)) for label in set(labels)), key=lambda pair: pair[1])
    return top if count * 2 > len(labels) else None


def final_label(item: Item, reviews: Iterable[Review]) -> str | None:
    """The label ``item`` is exported with: the owner's resolution, else the majority of its reviews
    (skips left out); None while it has neither."""
    return item.resolved_label or majority_label([review.label for review in reviews if review.label != Label.SKIP])


def is_conflict(labels: list[str]) -> bool:
    """Reviewers disagree: someone chose A and someone B, or no label has a majority."""
    return (Label.A in labels and Label.B in labels) or majority_label(labels) is None


def item_status(labels: list[str], *, required: int, resolved_label: str, edits_differ: bool = False) -> str:
    """An item's status from its reviews' labels (skips left out) and whether their edits of a response differ
    with no final text for it (``edits_differ``: ``open_edit_sides``). An owner's resolution is final: the item
    stays complete if the campaign later asks for more reviews per item; a resolved item whose edits disagree
    without a final text (resolved before edits were compared) is a conflict again."""
    if resolved_label:
        return ItemStatus.CONFLICT if edits_differ else ItemStatus.COMPLETE
    if not labels:
        return ItemStatus.PENDING
    if len(labels) < required:
        return ItemStatus.IN_REVIEW
    if is_conflict(labels) or edits_differ:
        return ItemStatus.CONFLICT
    return ItemStatus.COMPLETE


def item_answers(item: Item) -> list[tuple[str, str | None, str | None]]:
    """``item``'s answers (skips left out) as ``(label, edited_a, edited_b)``, oldest first: what ``open_edit_sides``
    and ``item_status`` read."""
    return list(item.reviews.exclude(label=Label.SKIP).order_by("created_at", "pk")
                .values_list("label", "edited_a", "edited_b"))


def same_edit(first: str, second: str) -> bool:
    """Two edits of one response say the same: equal once stripped (a trailing newline is no disagreement)."""
    return first.strip() == second.strip()


def distinct_edits(answers: Iterable[tuple[str, str | None, str | None]], side: str) -> list[str]:
    """The different edits of response ``side`` (a/b) in ``answers`` ((label, edited_a, edited_b) in the order
    given), skips left out: a skip carries no edit. Edits that say the same count once, as the first."""
    found: list[str] = []
    for label, edited_a, edited_b in answers:
        text = edited_a if side == "a" else edited_b
        if label != Label.SKIP and text is not None and not any(same_edit(text, seen) for seen in found):
            found.append(text)
    return found


def open_edit_sides(answers: Iterable[tuple[str, str | None, str | None]], *, resolved_a: str | None = None,
                    resolved_b: str | None = None) -> set[str]:
    """The responses (``{"a", "b"}`` or fewer) whose reviewers' edits differ with no final text from an owner:
    what they decided is not one text, so the item is a conflict until an owner picks or writes it."""
    answers = list(answers)
    return {side for side, resolved in (("a", resolved_a), ("b", resolved_b))
            if resolved is None and len(distinct_edits(answers, side)) > 1}


def editable_text(response: Any) -> str:
    """The text a reviewer edits: the response itself, or the last turn of a message list."""
    if isinstance(response, list):
        return str(response[-1].get("content", "")) if response else ""
    return str(response)


def is_blank(response: Any) -> bool:
    """Whether ``response`` has no text to judge or train on: a string of only whitespace, or a message
    list that is empty or has a turn without text. The ``preference`` validator refuses such a row."""
    if isinstance(response, list):
        return not response or any(not str(turn.get("content") or "").strip() for turn in response)
    return not str(response or "").strip()


def with_text(response: Any, text: str) -> Any:
    """``response`` with its editable text replaced by ``text`` (a new value; ``response`` is kept)."""
    if isinstance(response, list) and response:
        return [*response[:-1], {**response[-1], "content": text}]
    return text


# --- Campaigns -----------------------------------------------------------------------------------------

def _check_reviewers(project: Project, reviewers: Iterable[AbstractBaseUser]) -> list[AbstractBaseUser]:
    reviewers = list(reviewers)
    roles = dict(Membership.objects.filter(project=project, user__in=reviewers).values_list("user_id", "role"))
    for user in reviewers:
        role = roles.get(user.pk)
        if role is None or role == Role.VIEWER:
            raise ValidationError({"reviewers": f"{user.get_username()} cannot review: reviewers must be members "
                                                f"or owners of {project.slug}"})
        if not user.is_active:
            raise ValidationError({"reviewers": f"{user.get_username()} cannot review: their account is "
                                                "deactivated"})
    return reviewers


@transaction.atomic
def reviewer_leave_campaigns(*, project: Project, user: AbstractBaseUser) -> None:
    """Take ``user``, removed from ``project`` or made a viewer of it, off the reviewers of every campaign of
    it, so that being added (or promoted) again does not make them a reviewer again unasked (an owner ticks
    them again in Settings). Their reviews stay and count; the items they hold go back to the queue at once."""
    CampaignReviewer.objects.filter(campaign__project=project, user=user).delete()
    Lease.objects.filter(campaign__project=project, reviewer=user).delete()


def _check_campaign_basics(project: Project, name: str, required_reviews: int) -> str:
    """The campaign's name, stripped, once it and ``required_reviews`` are valid."""
    name = checked_name(name, field="name", max_length=Campaign._meta.get_field("name").max_length)
    if not name:
        raise ValidationError({"name": "give the campaign a name, e.g. 'helpfulness pass 1'"})
    if Campaign.objects.filter(project=project, name=name).exists():
        raise ValidationError({"name": f"{project.slug} already has a review campaign named {name!r}"})
    _check_required(required_reviews)
    return name


def _check_required(required_reviews: int) -> None:
    if not 1 <= required_reviews <= MAX_REQUIRED_REVIEWS:
        raise ValidationError({"required_reviews": f"reviews per item must be 1 to {MAX_REQUIRED_REVIEWS}, "
                                                   f"got {required_reviews}"})


def _send(task_name: str, args: list[Any], *, queue: str = "default") -> None:
    try:
        celery_app.send_task(task_name, args=args, queue=queue)
    except OperationalError:
        # The campaign stays "loading"/"generating" (its page offers to queue it again), an export "writing".
        logger.exception("could not queue %s%s: is Redis (REDIS_URL) up?", task_name, tuple(args))


@transaction.atomic
def campaign_create(
    *,
    project: Project,
    name: str,
    guidelines: str,
    required_reviews: int,
    reviewers: Iterable[AbstractBaseUser],
    source_version: DatasetVersion | None,
    user: AbstractBaseUser | None,
) -> Campaign:
    """Create a campaign. With ``source_version`` (a ready ``preference`` version of the project) it is
    ``loading`` until the ``default`` worker has made one item per row (``campaign_load_items``);
    without it the campaign is ready and empty, and items come from ``items_add`` (arena votes).
    Campaigns on two models' answers are made by ``campaign_generate``."""
    # First, as every creator in a project does: a deletion of the project at this moment either waits and is
    # refused (a loading campaign is in flight) or committed first and this campaign is refused in words (its
    # save would otherwise fail on the project's foreign key: a server error).
    project_lock(project=project, doing="as the campaign was being created")
    name = _check_campaign_basics(project, name, required_reviews)
    checked_text(guidelines, field="guidelines", max_length=LONG_TEXT_MAX_CHARS)
    reviewers = _check_reviewers(project, reviewers)
    if source_version is not None:
        if source_version.dataset.project_id != project.pk:
            raise ValidationError({"source_version": "choose a dataset version of this project"})
        if source_version.dataset.kind != formats.DatasetKind.PREFERENCE:
            raise ValidationError({"source_version": f"{source_version} is {with_article(source_version.dataset.kind)} "
                                                     "dataset; review campaigns need a preference dataset"})
        if source_version.status != VersionStatus.READY:
            raise ValidationError({"source_version": f"{source_version} {source_version.status_phrase}; "
                                                     f"{_until_ready(source_version)}"})
    campaign = Campaign.objects.create(
        project=project, name=name, guidelines=guidelines, required_reviews=required_reviews,
        source_version=source_version, source_label=str(source_version) if source_version is not None else "",
        created_by=user, status=CampaignStatus.LOADING if source_version is not None else CampaignStatus.READY)
    CampaignReviewer.objects.bulk_create(CampaignReviewer(campaign=campaign, user=reviewer) for reviewer in reviewers)
    if source_version is not None:
        campaign_load_request(campaign=campaign)
    activity_record(project=project, actor=user, verb=Verb.CAMPAIGN_CREATED, target=campaign)
    return campaign


def campaign_load_request(*, campaign: Campaign) -> None:
    """Queue the making of a campaign's items, after commit: a ``loading`` campaign's load on the
    ``default`` queue, a ``generating`` one's generation on the ``serve`` queue."""
    if campaign.status == CampaignStatus.LOADING:
        # A new attempt: a load still running for an earlier one (the page offers this button while
        # items arrive) stops at its next batch instead of writing the same sequence numbers as this one. A notice of
        # an earlier attempt's lost worker (``campaign_load_requeued``) is for that attempt.
        Campaign.objects.filter(pk=campaign.pk).update(load_attempt=F("load_attempt") + 1, notice="")
        attempt = Campaign.objects.values_list("load_attempt", flat=True).get(pk=campaign.pk)
        transaction.on_commit(lambda: _send(LOAD_TASK, [campaign.pk, attempt]))
    elif campaign.status == CampaignStatus.GENERATING:
        # A notice of an earlier, lost generation (``generation_lost``) is for the attempt it was about.
        Campaign.objects.filter(pk=campaign.pk).update(generation_progress_at=timezone.now(), notice="")
        transaction.on_commit(lambda: _send(GENERATE_TASK, [campaign.pk], queue=GENERATE_QUEUE))
    else:
        raise ValidationError({"status": f"campaign {isolated(campaign.name)} is {campaign.status}, not waiting for its items"})


def campaign_load_again(*, campaign: Campaign) -> None:
    """``campaign_load_request`` asked from the campaign page (its message was lost: Redis was down, or
    the worker stopped). Refused while Redis holds the generation's message."""
    if campaign.status == CampaignStatus.GENERATING and generation_queued(campaign=campaign):
        raise ValidationError({"status": f"the generation of {isolated(campaign.name)} is queued or under way; its items "
                                         "appear when it is done"})
    campaign_load_request(campaign=campaign)


def generation_seems_queued(*, campaign: Campaign) -> bool | None:
    """``generation_queued`` for the campaign's page, which reloads every 3 s while it generates: True
    without asking Redis while the answers keep coming (within ``GENERATION_QUIET_SECONDS`` of the
    request or of the last answers reported), since a worker then holds the message (acknowledged at
    the end); Redis is asked only once they have stopped."""
    last_heard = campaign.generation_progress_at
    if last_heard is not None and timezone.now() - last_heard <= timedelta(seconds=GENERATION_QUIET_SECONDS):
        return True
    return generation_queued(campaign=campaign)


def generation_queued(*, campaign: Campaign) -> bool | None:
    """Whether Redis holds the generation message of ``campaign``, waiting or being answered (its task
    acknowledges at the end); None while Redis cannot be asked. Sending it again then only makes the
    serve worker answer every prompt twice, in the way of chats."""
    held = held_task_messages(task=GENERATE_TASK, queues=(GENERATE_QUEUE,),
                              checking=f"the generation of campaign {campaign.public_id}")
    return None if held is None else (campaign.pk,) in held


def campaign_load_items(*, campaign_id: int, attempt: int | None = None) -> Campaign:
    """Make one item per row of a loading campaign's dataset version (the ``default`` worker runs this).

    Batches of ``ITEM_BATCH`` rows are committed one at a time, so a 100,000-row file never holds the
    database's write lock for long; the campaign stays ``loading`` (the queue serves nothing) until the
    last batch is in. Safe to redeliver: a campaign that is not loading is left alone, and a load that
    died half-way starts over. ``attempt`` (the ``load_attempt`` the load was asked as; None: whatever
    is current) stops a load once a later one has been asked for: that one starts over alone."""
    campaign = Campaign.objects.select_related("source_version__dataset").get(pk=campaign_id)
    if attempt is None:
        attempt = campaign.load_attempt
    with transaction.atomic():
        last_claim = (_current_load(campaign_id, attempt).select_for_update(of=("self",))
                      .values_list("load_claim", flat=True).first())
        if last_claim is None:
            return campaign
        # This delivery claims the load: one that started earlier (the same message delivered twice)
        # stops at its next batch, and only the claim's holder may write items or the outcome.
        claim = last_claim + 1
        Campaign.objects.filter(pk=campaign.pk).update(next_sequence=1, load_claim=claim, identical_rows=0)
        Item.objects.filter(campaign=campaign).delete()
    mine = _current_load(campaign_id, attempt).filter(load_claim=claim)
    status, load_error = CampaignStatus.READY, ""
    if campaign.source_version is None:
        mine.update(status=CampaignStatus.FAILED, notice="",
                    load_error=f"the dataset version {campaign.source_label} was deleted before its items were loaded")
        return Campaign.objects.get(pk=campaign_id)
    read = collections.Counter()
    try:
        pairs = _version_pairs(campaign.source_version, read=read)
        while batch := list(itertools.islice(pairs, ITEM_BATCH)):
            with transaction.atomic():
                if not mine.select_for_update(of=("self",)).exists():
                    logger.info("review campaign %s: load %s (delivery %s) stops, a later one started",
                                campaign.public_id, attempt, claim)
                    return Campaign.objects.get(pk=campaign_id)
                items_add(campaign=campaign, pairs=batch)
    except (formats.DatasetFormatError, OSError) as error:
        status, load_error = CampaignStatus.FAILED, (
            f"could not read {campaign.source_version}: {error}; the version may have been deleted from storage")
    if status == CampaignStatus.READY and read["rows"] and read["identical"] == read["rows"]:
        status, load_error = CampaignStatus.FAILED, (
            f"every one of the {read['rows']} rows of {isolated(str(campaign.source_version))} has the same chosen "
            "and rejected answer, which leaves nothing to review; choose a version whose rows differ")
    mine.update(status=status, load_error=load_error, notice="", identical_rows=read["identical"])
    campaign.refresh_from_db()
    logger.info("review campaign %s: %s, %s items", campaign.public_id, campaign.status, campaign.next_sequence - 1)
    return campaign


def _current_load(campaign_id: int, attempt: int) -> QuerySet[Campaign]:
    """The campaign while load ``attempt`` is the one asked for last and it is still loading. Checked
    with the row locked (``select_for_update``, inside the caller's transaction) before a load writes,
    as ``campaign_load_request`` bumps the attempt under the same lock."""
    return Campaign.objects.filter(pk=campaign_id, status=CampaignStatus.LOADING, load_attempt=attempt)


def _version_pairs(version: DatasetVersion, *, read: collections.Counter) -> Iterator[Pair]:
    """A pair per row of a ``preference`` version, counting in ``read`` the ``rows`` read and the ``identical``
    ones left out: a row whose chosen and rejected are the same answer holds nothing to prefer (as
    ``generation_finish`` leaves such generated pairs out), and the export would write it as a pair whose
    chosen is its rejected."""
    mapping = formats.ColumnMapping(kind=formats.DatasetKind.PREFERENCE, columns=version.column_mapping)
    examples = formats.iter_examples(version.absolute_path, fmt=formats.FileFormat(version.format), mapping=mapping)
    for row, example in enumerate(examples, start=1):
        read["rows"] += 1
        if is_same_response(example["chosen"], example["rejected"]):
            read["identical"] += 1
            continue
        yield Pair(prompt=example["prompt"], response_a=example["chosen"], response_b=example["rejected"],
                   source=ItemSource.DATASET, source_row=row, original_label="a")


@dataclass(frozen=True, kw_only=True)
class CampaignUpdate:
    """What ``campaign_update`` changed beyond the campaign's own fields: the conflicts that more reviews per item
    sent back to review (``reopened_conflicts``), and how many of them the campaign's reviewers cannot give the
    reviews they now lack (``reopened_out_of_reach``: each goes only to reviewers who have neither answered it nor
    read its reviews on the conflicts page)."""

    campaign: Campaign
    reopened_conflicts: int = 0
    reopened_out_of_reach: int = 0


@transaction.atomic
def campaign_update(*, campaign: Campaign, guidelines: str, required_reviews: int,
                    reviewers: Iterable[AbstractBaseUser]) -> CampaignUpdate:
    """Change a campaign's guidelines, reviews per item and reviewers. Reviews already given stay (an
    unticked reviewer's too); item statuses follow the new number of reviews."""
    _check_required(required_reviews)
    checked_text(guidelines, field="guidelines", max_length=LONG_TEXT_MAX_CHARS)
    reviewers = _check_reviewers(campaign.project, reviewers)
    campaign = Campaign.objects.select_for_update(of=("self",)).get(pk=campaign.pk)
    previous_required = campaign.required_reviews
    campaign.guidelines = guidelines
    campaign.required_reviews = required_reviews
    campaign.save(update_fields=["guidelines", "required_reviews"])
    keep = {user.pk for user in reviewers}
    CampaignReviewer.objects.filter(campaign=campaign).exclude(user_id__in=keep).delete()
    # An unticked reviewer can no longer answer the item they were shown: it goes back to the queue now,
    # not when their lease runs out.
    Lease.objects.filter(campaign=campaign).exclude(reviewer_id__in=keep).delete()
    present = set(CampaignReviewer.objects.filter(campaign=campaign).values_list("user_id", flat=True))
    CampaignReviewer.objects.bulk_create(
        CampaignReviewer(campaign=campaign, user=user) for user in reviewers if user.pk not in present)
    if required_reviews == previous_required:
        return CampaignUpdate(campaign=campaign)
    if required_reviews > previous_required:
        # Items that were full are open again: the cursors' promise no longer holds.
        CampaignReviewer.objects.filter(campaign=campaign).update(cursor=0)
    reopened = [item for previous, item in _refresh_statuses(campaign)
                if previous == ItemStatus.CONFLICT and item.status == ItemStatus.IN_REVIEW]
    return CampaignUpdate(campaign=campaign, reopened_conflicts=len(reopened),
                          reopened_out_of_reach=_out_of_reach(campaign, reopened))


def _out_of_reach(campaign: Campaign, items: list[Item]) -> int:
    """How many of ``items`` (in review) the campaign's reviewers cannot give the reviews they lack: each is served
    only to reviewers who have neither answered it nor read its reviews on the conflicts page."""
    if not items:
        return 0
    reviewers = set(selectors.reviewers_who_may_review(campaign=campaign).values_list("user_id", flat=True))
    blocked = collections.defaultdict(set)
    for item_id, user_id in itertools.chain(
            Review.objects.filter(item__in=items).values_list("item_id", "reviewer_id"),
            ConflictRead.objects.filter(item__in=items).values_list("item_id", "reader_id")):
        blocked[item_id].add(user_id)
    return sum(1 for item in items
               if len(reviewers - blocked[item.pk]) < campaign.required_reviews - item.review_count)


def conflicts_read(*, items: Iterable[Item], user: AbstractBaseUser) -> None:
    """Record that ``user`` was shown the reviews of ``items`` (conflicts) on the conflicts page: should one go back
    to review, it is not served to them (``_first_open_item``)."""
    ConflictRead.objects.bulk_create([ConflictRead(item=item, reader=user) for item in items], ignore_conflicts=True)


def _refresh_statuses(campaign: Campaign) -> list[tuple[str, Item]]:
    """Recompute the status of every reviewed item (after ``required_reviews`` changed); ``(status before,
    item)`` for each item whose status changed."""
    labels_by_item: dict[int, list[str]] = {}
    reviews = Review.objects.filter(campaign=campaign).exclude(label=Label.SKIP).values_list("item_id", "label")
    for item_id, label in reviews.iterator(chunk_size=ITEM_BATCH):
        labels_by_item.setdefault(item_id, []).append(label)
    # Only answers with an edit can disagree on a text, so only those texts are read.
    edits_by_item: dict[int, list[tuple[str, str | None, str | None]]] = {}
    edits = (Review.objects.filter(campaign=campaign).exclude(label=Label.SKIP)
             .exclude(edited_a=None, edited_b=None).order_by("created_at", "pk")
             .values_list("item_id", "label", "edited_a", "edited_b"))
    for item_id, *answer in edits.iterator(chunk_size=ITEM_BATCH):
        edits_by_item.setdefault(item_id, []).append(tuple(answer))
    changed = []
    for item in Item.objects.filter(campaign=campaign, review_count__gt=0).only(
            "pk", "status", "resolved_label", "resolved_a", "resolved_b", "review_count"):
        edits_differ = bool(open_edit_sides(edits_by_item.get(item.pk, []), resolved_a=item.resolved_a,
                                            resolved_b=item.resolved_b))
        status = item_status(labels_by_item.get(item.pk, []), required=campaign.required_reviews,
                             resolved_label=item.resolved_label, edits_differ=edits_differ)
        if status != item.status:
            changed.append((item.status, item))
            item.status = status
    Item.objects.bulk_update([item for _previous, item in changed], ["status"], batch_size=ITEM_BATCH)
    return changed


# --- Items -----------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Pair:
    """A prompt and two responses to review. ``original_label`` (``"a"``/``"b"``/``""``) is the
    source's own preference, if it has one (a dataset row's chosen, an arena voter's pick)."""

    prompt: Any
    response_a: Any
    response_b: Any
    source: str
    source_row: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    original_label: str = ""


def _check_pair(pair: Pair, index: int) -> None:
    if pair.source not in ItemSource.values:
        raise ValidationError({"source": f"pair {index}: source {pair.source!r} is not one of "
                                         f"{', '.join(ItemSource.values)}"})
    if pair.original_label not in ("", "a", "b"):
        raise ValidationError({"original_label": f"pair {index}: original_label must be 'a', 'b' or '', "
                                                 f"got {pair.original_label!r}"})
    for name in ("response_a", "response_b"):
        value = getattr(pair, name)
        if not (isinstance(value, str) and value) and not isinstance(value, list):
            raise ValidationError({name: f"pair {index}: {name} must be a non-empty string or a message list"})


@transaction.atomic
def items_add(*, campaign: Campaign, pairs: Iterable[Pair]) -> int:
    """Append ``pairs`` to ``campaign`` as pending items (in batches; ``pairs`` may be a generator over
    a large file). Returns how many were added."""
    campaign = Campaign.objects.select_for_update(of=("self",)).get(pk=campaign.pk)
    sequence = campaign.next_sequence
    added = 0
    batch: list[Item] = []
    for pair in pairs:
        _check_pair(pair, added + 1)
        batch.append(Item(campaign=campaign, sequence=sequence, source=pair.source, source_row=pair.source_row,
                          metadata=pair.metadata, prompt=pair.prompt, response_a=pair.response_a,
                          response_b=pair.response_b, original_label=pair.original_label))
        sequence += 1
        added += 1
        if len(batch) >= ITEM_BATCH:
            Item.objects.bulk_create(batch)
            batch = []
    Item.objects.bulk_create(batch)
    campaign.next_sequence = sequence
    campaign.save(update_fields=["next_sequence"])
    return added


@transaction.atomic
def item_add(*, campaign: Campaign, prompt: Any, response_a: Any, response_b: Any, source: str,
             metadata: dict[str, Any] | None = None, original_label: str = "") -> Item:
    """Add one pair to a campaign: for the arena (``source="arena"``, ``metadata`` naming the two models
    and the vote; ``original_label`` the voter's pick) and for run comparisons (``source="runs"``,
    ``metadata`` naming the runs or checkpoints). Returns the new item."""
    items_add(campaign=campaign, pairs=[Pair(prompt=prompt, response_a=response_a, response_b=response_b,
                                             source=source, metadata=metadata or {},
                                             original_label=original_label)])
    # The campaign row stays locked by items_add until this transaction ends, so the last sequence is ours.
    last = Campaign.objects.values_list("next_sequence", flat=True).get(pk=campaign.pk) - 1
    return Item.objects.get(campaign=campaign, sequence=last)


# --- Campaigns on two models' answers ---------------------------------------------------------------------
#
# The owner picks two models as the chat does (``webapp.chat.selectors.model_choices``: base models,
# succeeded runs, exported checkpoints), a dataset version to take prompts from and sampling settings.
# The ``serve`` worker, which already keeps models loaded and batches their decoding, generates both
# answers to each prompt (``worker.tasks.review.generate_campaign_answers``) and hands them to
# ``generation_finish``, which makes every item in one transaction: until then the campaign is
# ``generating`` (with a count of answers done) and has no items, and a failure leaves none behind.

MAX_GENERATED_PROMPTS = 5000
# A generated campaign's chat template variables are rendered at creation with this many of its first prompts at most
# (the form says so), to keep the owner's request short: a large template takes a millisecond a prompt and model. A
# prompt after them that the template fails on fails the generation, naming its row, as before.
TEMPLATE_CHECKED_PROMPTS = 1_000
PROMPT_SOURCE_KINDS = (formats.DatasetKind.PROMPTS, formats.DatasetKind.SFT, formats.DatasetKind.PREFERENCE)


@dataclass(frozen=True, kw_only=True)
class GenerationSettings:
    """How both models sample their answers (the chat's settings; ``temperature=0`` is greedy).
    Prompt ``i`` (0-based) is sampled with seed ``seed + i`` by both models. ``enable_thinking``: the chat's
    Thinking switch for both, rendered by a model whose chat template reads it over its own template variables;
    None leaves each model's own (a campaign made before it was a setting has none)."""

    max_new_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    enable_thinking: bool | None = None

    def __post_init__(self):
        problems = {}
        if not 1 <= self.max_new_tokens <= 4096:
            problems["max_new_tokens"] = f"max new tokens must be 1 to 4096, got {self.max_new_tokens}"
        if not 0 <= self.temperature <= 5:
            problems["temperature"] = f"temperature must be 0 (greedy) to 5, got {self.temperature}"
        if not 0 < self.top_p <= 1:
            problems["top_p"] = f"top-p must be above 0 and at most 1 (1 = off), got {self.top_p}"
        if self.top_k < 0:
            problems["top_k"] = f"top-k must be 0 (off) or more, got {self.top_k}"
        if not 0 <= self.seed < 2**31:
            problems["seed"] = f"seed must be 0 to 2**31 - 1, got {self.seed}"
        if self.enable_thinking is not None and not isinstance(self.enable_thinking, bool):
            problems["thinking"] = f"thinking must be on, off or each model's default, got {self.enable_thinking!r}"
        if problems:
            raise ValidationError(problems)

    @property
    def chat_template_kwargs(self) -> dict[str, bool]:
        """The template variables each prompt is rendered with, over the model's own."""
        return {} if self.enable_thinking is None else {"enable_thinking": self.enable_thinking}


def _generation_model(project: Project, field_name: str, ref: str) -> dict[str, Any]:
    choice = model_choice(project=project, ref=ref)
    if choice is None:
        raise ValidationError({field_name: f"{ref!r} is not a model of {project.slug}: choose a base model, a "
                                           "succeeded run or an exported checkpoint"})
    if choice.refused:  # registered before its directory lay in another project's folder
        raise ValidationError({field_name: choice.refused})
    # template_kwargs: a run's model's variables as its Run row has them (the serve worker lays the Thinking switch over).
    return {"ref": choice.ref, "label": choice.label, "path": choice.path, "cache_key": choice.cache_key,
            "template_kwargs": choice.template_kwargs}


def _generation_variables(project: Project, models: dict[str, dict[str, Any]], values: dict[str, str], *,
                          enable_thinking: bool | None, prompts_version: DatasetVersion, prompt_count: int
                          ) -> tuple[dict[str, Any], dict[str, Any]]:
    """``values`` (as typed) for model A and B: each model's those its chat template reads, typed as its own, and
    checked as a conversation's. Whether or not any are set, each model's chat template renders the campaign's
    ``prompt_count`` first prompts of ``prompts_version`` (``TEMPLATE_CHECKED_PROMPTS`` at most) as
    ``worker.tasks.review.model_answers`` will (a prompt the template fails on, with the variables or on its own, would
    otherwise be found only once the serve worker has loaded the models); a ``ValidationError`` keyed
    ``template_variables`` naming what is wrong with them (for a prompt, its row and the template's line), or
    ``prompts_version`` where a prompt fails with none set or the file cannot be read."""
    # Imported here: webapp.chat.arena imports this module (a battle's votes go to review campaigns).
    from jaxengine.prompts import as_messages
    from webapp.chat.arena import side_template_variables
    from webapp.chat.services import checked_template_variables

    values = {name: value for name, value in values.items() if value != ""}
    choices = tuple(model_choice(project=project, ref=model["ref"]) for model in models.values())
    sides = side_template_variables(values, choices) if values else ({}, {})
    source = isolated(str(prompts_version))
    try:
        prompts = [(f"row {prompt.row} of the prompts {source}", as_messages(prompt.prompt, "user"))
                   for prompt in _version_prompts(prompts_version, min(prompt_count, TEMPLATE_CHECKED_PROMPTS))]
    except (OSError, formats.DatasetFormatError) as error:
        checked = "the template variables" if any(sides) else "the models' chat templates"
        raise ValidationError({"prompts_version": (
            f"the prompts {source} cannot be read to check {checked} against them ({error}); choose another version, "
            "or ask an administrator about its file")}) from None
    return tuple(checked_template_variables(model=choice, variables=variables, enable_thinking=enable_thinking,
                                            prompts=prompts)
                 for choice, variables in zip(choices, sides))


@transaction.atomic
def campaign_generate(
    *,
    project: Project,
    name: str,
    guidelines: str,
    required_reviews: int,
    reviewers: Iterable[AbstractBaseUser],
    model_a: str,
    model_b: str,
    prompts_version: DatasetVersion,
    prompt_count: int,
    sampling: GenerationSettings,
    user: AbstractBaseUser | None,
    template_variables: dict[str, str] | None = None,
) -> Campaign:
    """Create a campaign on the answers of models ``model_a`` and ``model_b`` (model refs as the chat
    stores them) to the first ``prompt_count`` prompts of ``prompts_version`` (a ready ``prompts``,
    ``sft`` or ``preference`` version of the project, e.g. a run's eval set). The campaign is
    ``generating`` until the ``serve`` worker has generated both answers to every prompt.
    ``template_variables``: the chat panel's chat template variables, values as typed (an empty one is not sent),
    kept with each model whose template reads them as the arena's compare mode keeps them
    (``webapp.chat.arena.side_template_variables``) and checked as a conversation's
    (``webapp.chat.services.checked_template_variables``): every prompt that model answers is rendered with them."""
    name = _check_campaign_basics(project, name, required_reviews)
    checked_text(guidelines, field="guidelines", max_length=LONG_TEXT_MAX_CHARS)
    reviewers = _check_reviewers(project, reviewers)
    models = {"model_a": _generation_model(project, "model_a", model_a),
              "model_b": _generation_model(project, "model_b", model_b)}
    if models["model_a"]["ref"] == models["model_b"]["ref"]:
        raise ValidationError({"model_b": "choose two different models (or two checkpoints of one run)"})
    if prompts_version.dataset.project_id != project.pk:
        raise ValidationError({"prompts_version": "choose a dataset version of this project"})
    if prompts_version.dataset.kind not in PROMPT_SOURCE_KINDS:
        raise ValidationError({"prompts_version": f"{prompts_version} is {with_article(prompts_version.dataset.kind)} dataset, "
                                                  "which has no prompts; choose a prompts, sft or preference one"})
    if prompts_version.status != VersionStatus.READY:
        raise ValidationError({"prompts_version": f"{prompts_version} {prompts_version.status_phrase}; "
                                                  f"{_until_ready(prompts_version)}"})
    if not 1 <= prompt_count <= MAX_GENERATED_PROMPTS:
        raise ValidationError({"prompt_count": f"generate for 1 to {MAX_GENERATED_PROMPTS} prompts, "
                                               f"got {prompt_count}"})
    prompts = {"version": prompts_version.public_id, "label": str(prompts_version),
               "count": min(prompt_count, prompts_version.row_count or prompt_count)}
    for model, variables in zip(models.values(), _generation_variables(
            project, models, template_variables or {}, enable_thinking=sampling.enable_thinking,
            prompts_version=prompts_version, prompt_count=prompts["count"])):
        model["template_variables"] = variables
    # Before the campaign's row, as a chat turn: a deletion of either model (or of the project) and this
    # generation are taken one after the other, and the deletion then names the campaign (run_readers).
    for field_name, model in models.items():
        model_lock(project=project, ref=model["ref"], label=model["label"], field=field_name,
                   doing="as the campaign was being created")
    campaign = Campaign.objects.create(
        project=project, name=name, guidelines=guidelines, required_reviews=required_reviews, created_by=user,
        status=CampaignStatus.GENERATING,
        generation={**models, "prompts": prompts, "sampling": asdict(sampling)})
    CampaignReviewer.objects.bulk_create(CampaignReviewer(campaign=campaign, user=reviewer) for reviewer in reviewers)
    campaign_load_request(campaign=campaign)
    activity_record(project=project, actor=user, verb=Verb.CAMPAIGN_CREATED, target=campaign)
    return campaign


@dataclass(frozen=True, kw_only=True)
class GenerationPrompt:
    row: int  # 1-based, as in the dataset preview
    prompt: Any  # a string or a message list, as the chat template takes it


def prompt_of(example: dict[str, Any]) -> Any:
    """The prompt of a validated ``prompts``/``sft``/``preference`` example: its ``prompt``, or the turns
    of its conversation before the last assistant turn (an sft ``messages`` row, a preference row made
    of chats without a separate prompt), or the whole conversation when it has none (the preference
    validator does not ask its chats for one)."""
    if example.get("prompt") is not None:
        return example["prompt"]
    messages = example.get("messages") or example.get("chosen")
    last_assistant = max((index for index, turn in enumerate(messages) if turn.get("role") == "assistant"),
                         default=len(messages))
    return messages[:last_assistant]


def generation_prompts(*, campaign: Campaign) -> list[GenerationPrompt]:
    """The prompts a generating campaign asks both models: the first ones of its prompts version.
    Raises ``ValidationError`` naming the row when a prompt is unusable."""
    source = campaign.generation["prompts"]
    version = (DatasetVersion.objects.select_related("dataset")
               .filter(dataset__project=campaign.project_id, public_id=source["version"]).first())
    if version is None:
        raise ValidationError({"prompts_version": f"the prompts version {source['label']} has been deleted"})
    return list(_version_prompts(version, source["count"]))


def _version_prompts(version: DatasetVersion, count: int) -> Iterator[GenerationPrompt]:
    mapping = formats.ColumnMapping(kind=version.dataset.kind, columns=version.column_mapping)
    examples = formats.iter_examples(version.absolute_path, fmt=formats.FileFormat(version.format), mapping=mapping)
    for row, example in enumerate(itertools.islice(examples, count), start=1):
        prompt = prompt_of(example)
        if not prompt:
            raise ValidationError({"prompts_version": f"row {row} of {version}: the prompt is empty"})
        yield GenerationPrompt(row=row, prompt=prompt)


def generation_begin(*, campaign_id: int) -> Campaign | None:
    """The serve worker takes up a generating campaign: it is marked as being answered (``generation_running``)
    until ``generation_end``, so that a deletion of either model waits for the worker even once an owner has
    cancelled the campaign (``selectors.generation_readers``). None, and nothing marked, when the campaign is no
    longer generating (cancelled, deleted or finished before its message was taken up)."""
    if not Campaign.objects.filter(pk=campaign_id, status=CampaignStatus.GENERATING).update(
            generation_running=True, generation_progress_at=timezone.now()):
        return None
    return Campaign.objects.filter(pk=campaign_id).first()


@transaction.atomic
def generation_end(*, campaign_id: int) -> None:
    """The serve worker no longer answers the campaign (it finished, failed or stopped): its models may go, and a
    campaign deleted meanwhile (``campaign_delete``, which kept it until now) goes. Under the campaign's row lock,
    as the deletion decides under it whether the worker is still answering."""
    campaign = Campaign.objects.select_for_update(of=("self",)).filter(pk=campaign_id).first()
    if campaign is None:
        return
    if campaign.delete_when_stopped:
        campaign.delete()
        logger.info("review campaign %s deleted, its serve worker having stopped", campaign)
        return
    campaign.generation_running = False
    campaign.save(update_fields=["generation_running"])


def generation_progress(*, campaign_id: int, answers: int) -> bool:
    """Record how many answers a generating campaign has so far (shown on its page). Returns whether it is
    still generating: False once an owner cancelled it (``generation_cancel``) or deleted it, which the
    serve worker reads after each slice of prompts as its cue to stop."""
    return Campaign.objects.filter(pk=campaign_id, status=CampaignStatus.GENERATING).update(
        generated_answers=answers, generation_progress_at=timezone.now()) > 0


def generations_settle_lost(*, now: datetime | None = None) -> list[Campaign]:
    """Settle each generation whose serve worker died answering it (SIGKILL, out of memory, its host lost), which
    therefore never says it stopped (``generation_end``): run by every worker's reaper (``worker/reaper.py``).

    A campaign marked as being answered (``generation_running``) is lost when no live worker holds its message
    (``workers.deliveries.task_deliveries``, from the workers' heartbeats) and its worker has been silent for
    ``TEMPER_RUN_LOST_SECONDS``: no answers reported for that long, or its message delivered that long ago to a
    worker no longer heard from (the same wait after which ``deliveries_restore_orphaned`` queues the message again,
    so this runs before that in a reaper's round). Then ``generation_lost`` settles it. Safe from many reapers at
    once: a campaign is settled under its row lock, and only while it is as read."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.TEMPER_RUN_LOST_SECONDS)
    running = list(Campaign.objects.filter(generation_running=True))
    if not running:
        return []
    deliveries = task_deliveries(task=GENERATE_TASK, now=now)
    if deliveries is None:
        return []
    lost = []
    for campaign in running:
        orphan = deliveries.orphaned.get((campaign.pk,))
        if (campaign.pk,) in deliveries.live:
            continue
        silent = campaign.generation_progress_at is None or campaign.generation_progress_at < cutoff
        if not (silent or (orphan is not None and orphan.delivered_at < cutoff.timestamp())):
            continue
        lost.append((campaign, orphan))
    if not lost:
        return []
    held = held_task_messages(task=GENERATE_TASK, queues=(GENERATE_QUEUE,), checking="lost generations", now=now)
    if held is None:
        return []
    settled = []
    for campaign, orphan in lost:
        settled_campaign = generation_lost(
            campaign_id=campaign.pk, heard_at=campaign.generation_progress_at,
            again=orphan is not None and orphan.redelivered, queued=(campaign.pk,) in held)
        if settled_campaign is not None:
            settled.append(settled_campaign)
    return settled


@transaction.atomic
def generation_lost(*, campaign_id: int, heard_at: datetime | None, again: bool, queued: bool) -> Campaign | None:
    """Settle a generation whose serve worker died answering it, last heard from at ``heard_at`` (its last answers
    reported, or its start): the worker no longer holds its models. A campaign being deleted
    (``delete_when_stopped``) goes, as ``generation_end`` would have deleted it; a cancelled one stays as it is. One
    still generating says when its worker stopped: its message, queued again (``queued``), is answered from the first
    prompt by the next serve worker free; one that Redis holds nowhere can be queued again from its page; one whose
    message had been delivered once before (``again``: two workers died on it; it may be what kills them) fails.
    Returns the campaign, or None when it was settled otherwise meanwhile (its worker reported again, it ended)."""
    campaign = (Campaign.objects.select_for_update(of=("self",))
                .filter(pk=campaign_id, generation_running=True, generation_progress_at=heard_at).first())
    if campaign is None:
        return None
    if campaign.delete_when_stopped:
        campaign.delete()
        logger.warning("review campaign %s deleted, its serve worker having died", campaign)
        return campaign
    campaign.generation_running = False
    # A campaign still generating is told in its notice: it has not failed, and whether it will is for its next
    # worker to tell.
    if campaign.status == CampaignStatus.GENERATING:
        total = 2 * campaign.generation.get("prompts", {}).get("count", 0)
        stopped = (f"the serve worker answering it stopped answering at {when(heard_at)} (killed, out of memory, or "
                   f"its host lost), after {campaign.generated_answers} of {total} answers")
        if again:
            campaign.status, campaign.notice = CampaignStatus.FAILED, ""
            campaign.load_error = (f"{stopped}, and so had the worker answering it before; no items were made. Its "
                                   "prompts may be what stops them (out of memory): start another campaign with "
                                   "fewer prompts, fewer new tokens or smaller models")
        elif queued:
            campaign.notice = f"{stopped}; its prompts were queued again, and are answered from the first"
        else:
            campaign.notice = f"{stopped}, and Redis holds its message nowhere"
    campaign.save(update_fields=["generation_running", "status", "load_error", "notice"])
    logger.warning("review campaign %s: its serve worker died; %s", campaign.public_id,
                   campaign.load_error or campaign.notice or "released")
    return campaign


LOAD_WORKERS_LOST = ("loading its items stopped two workers in turn (killed, out of memory, or their host lost); they "
                     "are not loaded again: delete this campaign and make it from a smaller dataset version, or ask "
                     "for workers with more memory")
EXPORT_WORKERS_LOST = ("writing this export stopped two workers in turn (killed, out of memory, or their host lost); "
                       "it is not written again: export again once the workers have more memory")


def review_work_fail_abandoned(*, now: datetime | None = None) -> list[Campaign | Export]:
    """Fail each item load and export being written whose message lost two workers in turn (run by every worker's
    reaper, ``worker/reaper.py``), with the reason: ``deliveries_restore_orphaned`` queues a dead worker's message
    again once, and one that kills its next worker too (out of memory) is left to Celery's visibility timeout, an
    hour, after which it kills another, the campaign saying meanwhile that its items load or its export is being
    written (which refuses its deletion). Held by no live worker, delivered again, that delivery
    ``TEMPER_RUN_LOST_SECONDS`` old (``workers.deliveries.TaskDeliveries.abandoned``). Safe from many reapers at once:
    each is failed only while still loading as that attempt, or writing."""
    now = now or timezone.now()
    loading = list(Campaign.objects.filter(status=CampaignStatus.LOADING))
    writing = list(Export.objects.filter(status=ExportStatus.WRITING))
    delivered_before = now - timedelta(seconds=settings.TEMPER_RUN_LOST_SECONDS)
    failed: list[Campaign | Export] = []
    if loading and (deliveries := task_deliveries(task=LOAD_TASK, now=now)) is not None:
        abandoned = deliveries.abandoned(delivered_before=delivered_before)
        for campaign in loading:
            if (campaign.pk, campaign.load_attempt) in abandoned and Campaign.objects.filter(
                    pk=campaign.pk, status=CampaignStatus.LOADING, load_attempt=campaign.load_attempt).update(
                    status=CampaignStatus.FAILED, load_error=LOAD_WORKERS_LOST, notice=""):
                logger.warning("review campaign %s failed: %s", campaign.public_id, LOAD_WORKERS_LOST)
                failed.append(campaign)
    if writing and (deliveries := task_deliveries(task=EXPORT_TASK, now=now)) is not None:
        abandoned = deliveries.abandoned(delivered_before=delivered_before)
        for export in writing:
            if (export.pk,) in abandoned and _export_end(export=export, was=ExportStatus.WRITING,
                                                         status=ExportStatus.FAILED, error=EXPORT_WORKERS_LOST):
                logger.warning("review export %s failed: %s", export.pk, EXPORT_WORKERS_LOST)
                failed.append(export)
    return failed


def campaign_load_requeued(arguments: tuple, *, lost: LostWorker) -> bool:
    """Say on a loading campaign that its load's worker was lost and the load was queued again
    (``workers.deliveries.FIRST_LOSS_NOTES``), in its ``notice``, which its page shows while it loads and the load's
    outcome clears; not in ``load_error``, which holds failures only. Whether it was said (not for a load ended, or
    asked again, meanwhile)."""
    campaign_id, *attempt = arguments
    loading = Campaign.objects.filter(pk=campaign_id, status=CampaignStatus.LOADING)
    if attempt:  # a message sent before attempts were numbered loads as the current one
        loading = loading.filter(load_attempt=attempt[0])
    return loading.update(notice=lost.note(doing="loading its items", work="the load")) > 0


def export_requeued(arguments: tuple, *, lost: LostWorker) -> bool:
    """Say on an export being written that its worker was lost and the export was queued again
    (``workers.deliveries.FIRST_LOSS_NOTES``), in its ``notice``, which the campaign page shows while it is written
    and the export's outcome clears; not in ``error``, which holds a failure only. Whether it was said (not for an
    export written meanwhile)."""
    (export_id,) = arguments
    return Export.objects.filter(pk=export_id, status=ExportStatus.WRITING).update(
        notice=lost.note(doing="writing this export", work="the export")) > 0


@transaction.atomic
def generation_cancel(*, campaign: Campaign, user: AbstractBaseUser) -> Campaign:
    """Stop a generating campaign: it becomes ``cancelled`` at once, with no items (a pair needs both models'
    answers, and model A answers every prompt before B), and can be deleted; the serve worker finds it so after
    its current slice of prompts (``generation_progress``) and stops there, and a message of it still queued
    does nothing. Refused for a campaign that is not generating (it finished or failed meanwhile)."""
    campaign = Campaign.objects.select_for_update(of=("self",)).get(pk=campaign.pk)
    if campaign.status != CampaignStatus.GENERATING:
        raise ValidationError({"status": f"campaign {isolated(campaign.name)} is "
                                         f"{campaign.get_status_display().lower()}, not generating: there is no "
                                         "generation to cancel"})
    total = 2 * campaign.generation.get("prompts", {}).get("count", 0)
    campaign.status = CampaignStatus.CANCELLED
    campaign.load_error = (f"{isolated(user.get_username())} cancelled the generation after {campaign.generated_answers} of "
                           f"{total} answers; no items were made, as each pair needs both models' answers")
    campaign.notice = ""
    campaign.save(update_fields=["status", "load_error", "notice"])
    logger.info("review campaign %s: generation cancelled by %s", campaign.public_id, user.get_username())
    return campaign


@transaction.atomic
def generation_finish(*, campaign_id: int, prompts: list[GenerationPrompt], answers_a: list[str],
                      answers_b: list[str]) -> Campaign | None:
    """Make a generating campaign's items from both models' answers, all at once, and make it ready.

    A pair where either model answered nothing (or only whitespace) is left out (it cannot be reviewed,
    and the export's validator would refuse it; the count is kept in ``generation["empty_answers"]``), and so
    is one where both gave the same answer (``is_same_response``: nothing to prefer; counted in
    ``generation["identical_answers"]``). A campaign that is no longer generating (a redelivered task
    finishing second, a cancelled one) is left alone, and so is one deleted meanwhile (None)."""
    campaign = Campaign.objects.select_for_update(of=("self",)).filter(pk=campaign_id).first()
    if campaign is None or campaign.status != CampaignStatus.GENERATING:
        return campaign
    if not len(prompts) == len(answers_a) == len(answers_b):
        raise ValueError(f"{len(prompts)} prompts but {len(answers_a)} and {len(answers_b)} answers")
    generation = campaign.generation
    models = {"model_a": generation["model_a"]["ref"], "model_a_label": generation["model_a"]["label"],
              "model_b": generation["model_b"]["ref"], "model_b_label": generation["model_b"]["label"],
              "prompts_version": generation["prompts"]["version"]}
    answers_a, answers_b = map(storable_model_text, answers_a), map(storable_model_text, answers_b)
    pairs, empty, identical = [], 0, 0
    for prompt, answer_a, answer_b in zip(prompts, answers_a, answers_b):
        if is_blank(answer_a) or is_blank(answer_b):
            empty += 1
        elif is_same_response(answer_a, answer_b):
            identical += 1
        else:
            pairs.append(Pair(prompt=prompt.prompt, response_a=answer_a, response_b=answer_b, source=ItemSource.RUNS,
                              source_row=prompt.row, metadata=models))
    if not pairs:
        campaign.status = CampaignStatus.FAILED
        if not identical:
            campaign.load_error = (f"every one of the {len(prompts)} prompts got an empty answer from at least one "
                                   "model; allow more new tokens, or check the models end their answers sensibly")
        elif not empty:
            campaign.load_error = (f"both models gave the same answer to every one of the {len(prompts)} prompts; "
                                   "raise the temperature, or choose models that differ more")
        else:
            campaign.load_error = (f"none of the {len(prompts)} prompts left a pair to review: {empty} got an empty "
                                   f"answer from at least one model, {identical} the same answer from both; allow "
                                   "more new tokens, raise the temperature, or choose models that differ more")
    else:
        items_add(campaign=campaign, pairs=pairs)
        campaign.status = CampaignStatus.READY
    campaign.generation = {**generation, "empty_answers": empty, "identical_answers": identical}
    campaign.generated_answers = 2 * len(prompts)
    if campaign.status == CampaignStatus.FAILED:  # the failure speaks for itself; a ready campaign keeps the record
        campaign.notice = ""                        # that its generation started over (a notice, never an error)
    campaign.save(update_fields=["status", "load_error", "notice", "generation", "generated_answers"])
    logger.info("review campaign %s: %s, %s pairs generated, %s left out empty, %s identical", campaign.public_id,
                campaign.status, len(pairs), empty, identical)
    return Campaign.objects.get(pk=campaign.pk)


def generation_fail(*, campaign_id: int, reason: str) -> None:
    """A generating campaign could not get its answers: it fails with ``reason`` and has no items."""
    updated = Campaign.objects.filter(pk=campaign_id, status=CampaignStatus.GENERATING).update(
        status=CampaignStatus.FAILED, load_error=reason, notice="")
    if updated:
        logger.warning("review campaign %s: generation failed: %s", campaign_id, reason)


@transaction.atomic
def campaign_delete(*, campaign: Campaign, stop_generation: bool = False, actor: AbstractBaseUser | None = None) -> bool:
    """Delete ``campaign`` with its items, reviews, leases, reviewer rows and export records. The dataset
    versions it exported stay: they are datasets now, trained on like any other. Refused
    (``ValidationError`` on ``delete``) while a worker still makes its items or writes an export
    (``selectors.campaign_readers``); with ``stop_generation`` (the page's Delete said so) a generation under
    way is no reason: it is cancelled, and the serve worker stops after its current slice
    (``generation_progress``). Returns whether the campaign is gone now: while the serve worker is answering its
    prompts (``generation_running``; generating, or cancelled and still held, as ``selectors.stopping_generations``
    counts it) it is kept, cancelled and ``delete_when_stopped``, and the worker deletes it as it stops
    (``generation_end``)."""
    campaign = Campaign.objects.select_for_update(of=("self",)).get(pk=campaign.pk)
    if problems := selectors.campaign_readers(campaign=campaign, stopping_generation=stop_generation):
        raise ValidationError({"delete": problems})
    activity_record(project=campaign.project, actor=actor, verb=Verb.CAMPAIGN_DELETED, target=campaign)
    # Deleted at once, the campaign took with it the only record that its models were still being answered with
    # (``selectors.generation_readers``): either could be deleted under the worker. Refusing ("cancel, wait, then
    # delete") would hold the owner, who chose Stop and delete, to a second visit for what they asked in one; so
    # the campaign is stopped now and goes by itself a moment later, its page saying so meanwhile.
    if campaign.generation_running and (campaign.status == CampaignStatus.GENERATING
                                        or generation_seems_queued(campaign=campaign) is not False):
        campaign.status = CampaignStatus.CANCELLED
        campaign.delete_when_stopped = True
        campaign.load_error = ("it is being deleted: it goes once the serve worker has answered the prompts under "
                               "way, in a moment")
        campaign.notice = ""
        campaign.save(update_fields=["status", "delete_when_stopped", "load_error", "notice"])
        logger.info("review campaign %s: deleted once its serve worker stops", campaign.public_id)
        return False
    campaign.delete()
    logger.info("review campaign %s deleted", campaign)
    return True


# --- The queue and reviews ------------------------------------------------------------------------------

def _reviewer_row(campaign: Campaign, user: AbstractBaseUser) -> CampaignReviewer:
    row = CampaignReviewer.objects.filter(campaign=campaign, user=user).first()
    if row is None:
        raise PermissionDenied(f"you are not a reviewer of {isolated(campaign.name)}; ask a project owner to add you")
    return row


def _first_open_item(*, campaign: Campaign, user: AbstractBaseUser, after: int, extra: Any = None) -> Item | None:
    """The first item after sequence ``after`` that still needs reviews and that ``user`` has not
    answered, nor read the reviews of on the conflicts page (and that matches ``extra``, a filter). Open items
    are exactly the pending and in-review ones, so each status walks its own stretch of the (campaign, status,
    sequence) index and finished items are never read."""
    answered = Exists(Review.objects.filter(item=OuterRef("pk"), reviewer=user)) | Exists(
        ConflictRead.objects.filter(item=OuterRef("pk"), reader=user))
    found = []
    for status in (ItemStatus.PENDING, ItemStatus.IN_REVIEW):
        query = Item.objects.filter(campaign=campaign, status=status, sequence__gt=after)
        if extra is not None:
            query = query.filter(extra)
        item = query.exclude(answered).order_by("sequence").first()
        if item is not None:
            found.append(item)
    return min(found, key=lambda item: item.sequence, default=None)


@transaction.atomic
def _lease(*, item: Item, user: AbstractBaseUser) -> Item | None:
    """Lease ``item`` to ``user`` (moving their lease in its campaign here) if it still has a place for
    them; None when others took its last place since the walk read it. The item's row lock makes the
    count and the lease one step for everyone asking at once (SQLite: the transaction's write lock)."""
    item = (Item.objects.select_for_update(of=("self",)).select_related("campaign")
            .filter(pk=item.pk, status__in=(ItemStatus.PENDING, ItemStatus.IN_REVIEW)).first())
    if item is None:
        return None
    now = timezone.now()
    others = Lease.objects.filter(item=item, until__gt=now).exclude(reviewer=user).count()
    if item.review_count + others >= item.campaign.required_reviews:
        return None
    Lease.objects.update_or_create(campaign=item.campaign, reviewer=user,
                                   defaults={"item": item, "until": now + timedelta(seconds=LEASE_SECONDS)})
    return item


def queue_next_item(*, campaign: Campaign, user: AbstractBaseUser) -> Item | None:
    """The next item for ``user`` to review in ``campaign``, leased to them; None when nothing is left
    (or the campaign's items are not loaded, or others hold the places of every item left).

    Never an item the user has reviewed (or skipped), never one with all its reviews, never one whose
    answers and others' live leases fill its places. Items no one else holds come first, so that
    reviewers working at once get different items; then items others hold that still have room."""
    reviewer = _reviewer_row(campaign, user)
    if campaign.status != CampaignStatus.READY:
        return None
    first_open = _first_open_item(campaign=campaign, user=user, after=reviewer.cursor)
    if first_open is None:
        return None
    if first_open.sequence - 1 > reviewer.cursor:
        CampaignReviewer.objects.filter(pk=reviewer.pk, cursor__lt=first_open.sequence - 1).update(
            cursor=first_open.sequence - 1)
    now = timezone.now()
    held_by_none = ~Exists(selectors.leases_of_others(user=user, now=now))
    with_room = LessThan(selectors.places_taken(user=user, now=now), campaign.required_reviews)
    for extra in (held_by_none, with_room):
        after = first_open.sequence - 1
        while (item := _first_open_item(campaign=campaign, user=user, after=after, extra=extra)) is not None:
            leased = _lease(item=item, user=user)
            if leased is not None:
                return leased
            after = item.sequence  # its last place went to someone asking at the same time
    return None


@transaction.atomic
def review_submit(
    *,
    item: Item,
    user: AbstractBaseUser,
    choice: str,
    edited_first: str | None = None,
    edited_second: str | None = None,
    comment: str = "",
) -> Review:
    """Record ``user``'s answer to ``item`` as they saw it (``choice`` and edits of the first/second
    shown response) and update the item's status. One review per reviewer and item. An edit that leaves
    a response blank is refused (nothing is recorded): it could be neither judged nor exported. A skip stores no
    edit, whatever was typed: it decides nothing (the review's ``edits_dropped`` says whether edits were typed)."""
    if choice not in Choice.values:
        raise ValidationError({"choice": f"choice {choice!r} is not one of {', '.join(Choice.values)}"})
    for field_name, text in (("edited_first", edited_first), ("edited_second", edited_second),
                             ("comment", comment)):
        checked_text(text or "", field=field_name)
    item = Item.objects.select_for_update(of=("self",)).select_related("campaign").get(pk=item.pk)
    campaign = item.campaign
    _reviewer_row(campaign, user)
    if Review.objects.filter(item=item, reviewer=user).exists():
        raise ValidationError({"item": "you have already reviewed this item"})
    if ConflictRead.objects.filter(item=item, reader=user).exists():
        # The queue serves no one such an item; a page open from before could still send an answer.
        raise ValidationError({"item": f"you read the answers to item {item.sequence} on the conflicts page, so your "
                                       "answer would not be blind to them; it was not recorded, and the item goes to "
                                       "other reviewers"})
    if item.status not in (ItemStatus.PENDING, ItemStatus.IN_REVIEW):
        # Others filled the item while this reviewer's page was open (their lease ran out, or the item was
        # shared while it had room): one answer more could turn a complete item into a conflict.
        required = campaign.required_reviews
        raise ValidationError({"item": f"item {item.sequence} already has the {required} review"
                                       f"{'' if required == 1 else 's'} it needs (others answered it while your "
                                       "page was open); your answer was not recorded"})
    shown_first = shown_first_for(item_public_id=item.public_id, user_id=user.pk)
    label = label_for_choice(choice, shown_first=shown_first)
    edited = {"a": None, "b": None}
    blanked = {}
    edits_dropped = False
    for field_name, position, text, shown in (("edited_first", "first", edited_first, shown_first),
                                              ("edited_second", "second", edited_second,
                                               "b" if shown_first == "a" else "a")):
        original = item.response_a if shown == "a" else item.response_b
        if text is None or text.replace("\r\n", "\n") == editable_text(original):
            continue
        if label == Label.SKIP:
            # A skip decides nothing: the edits typed before it are dropped, not stored (the page says so).
            edits_dropped = True
            continue
        if is_blank(with_text(original, text)) and not is_blank(original):
            blanked[field_name] = (f"your edit leaves the {position} response empty: type the text it should "
                                   "have, or put its original text back to leave it unedited")
        edited[shown] = text.replace("\r\n", "\n")
    if blanked:
        raise ValidationError(blanked)
    try:
        review = Review.objects.create(item=item, campaign=campaign, reviewer=user, shown_first=shown_first,
                                       choice=choice, label=label, edited_a=edited["a"], edited_b=edited["b"],
                                       comment=comment.strip())
    except IntegrityError:
        raise ValidationError({"item": "you have already reviewed this item"}) from None
    _count_reviews(item)
    Lease.objects.filter(item=item, reviewer=user).delete()
    review.edits_dropped = edits_dropped
    return review


def _count_reviews(item: Item) -> None:
    """``item``'s review count and status from its reviews as they are now (skips left out)."""
    answers = item_answers(item)
    labels = [label for label, _a, _b in answers]
    item.review_count = len(labels)
    edits_differ = bool(open_edit_sides(answers, resolved_a=item.resolved_a, resolved_b=item.resolved_b))
    item.status = item_status(labels, required=item.campaign.required_reviews, resolved_label=item.resolved_label,
                              edits_differ=edits_differ)
    item.save(update_fields=["review_count", "status"])


@transaction.atomic
def review_change(*, item: Item, user: AbstractBaseUser, choice: str) -> Review:
    """Change ``user``'s answer to ``item`` to ``choice`` (as clicked, like ``review_submit``'s), its edits and
    comment kept; the item's count and status follow. A key pressed by mistake sent an answer no one could take
    back. Refused once an owner has resolved the item (their label is final), and for a skip turned into an
    answer once others have given the item the reviews it needs."""
    if choice not in Choice.values:
        raise ValidationError({"choice": f"choice {choice!r} is not one of {', '.join(Choice.values)}"})
    item = Item.objects.select_for_update(of=("self",)).select_related("campaign").get(pk=item.pk)
    _reviewer_row(item.campaign, user)
    review = Review.objects.filter(item=item, reviewer=user).first()
    if review is None:
        raise ValidationError({"item": f"you have not answered item {item.sequence}; answer it from the queue"})
    if item.resolved_label:
        raise ValidationError({"item": f"item {item.sequence} was resolved by {isolated(resolver_name(item))}, whose label is "
                                       "final; ask an owner to resolve it again"})
    label = label_for_choice(choice, shown_first=review.shown_first)
    if review.label == Label.SKIP and label != Label.SKIP and item.review_count >= item.campaign.required_reviews:
        required = item.campaign.required_reviews
        raise ValidationError({"item": f"item {item.sequence} already has the {required} review"
                                       f"{'' if required == 1 else 's'} it needs from others since you skipped it; "
                                       "your skip stays"})
    review.choice, review.label = choice, label
    review.save(update_fields=["choice", "label"])
    _count_reviews(item)
    Campaign.objects.filter(pk=item.campaign_id).update(answers_changed=F("answers_changed") + 1)
    return review


def resolver_name(item: Item) -> str:
    """Who resolved ``item``, for messages (a deleted account leaves no name)."""
    return item.resolved_by.get_username() if item.resolved_by else "an account since deleted"


class AlreadyResolved(ValidationError):
    """Another resolution of the item was made since the owner was shown it: ``label`` by ``resolved_by``
    (a username). ``sent_texts`` holds the final texts the refused owner gave (``final_texts_sent``), for them to
    weigh against that resolution's. Resolving again over it (``shown_label=label``) changes it."""

    def __init__(self, *, item: Item, sent_texts: dict[str, str] | None = None):
        self.item = item
        self.label = item.resolved_label
        self.resolved_by = resolver_name(item)
        self.sent_texts = sent_texts or {}
        super().__init__({"item": f"item {item.sequence} is already resolved as {Label(self.label).label} by "
                                  f"{self.resolved_by}; confirm to change it"})


def blank_final_texts(item: Item, texts: dict[str, str | None], *, sides: Iterable[str]) -> dict[str, str]:
    """The refusals, by field (``text_a``/``text_b``), of the final texts in ``texts`` given for ``item``'s responses
    ``sides`` that would leave their response blank (None is no text given, not a blank one)."""
    sent = final_texts_sent(item, texts, sides=sides)
    return {f"text_{side}": (f"the final text of response {side.upper()} is blank: write it, or choose another "
                             "(an empty response is nothing to train on)")
            for side in sorted(sides) if texts.get(side) is not None and side not in sent}


def final_texts_sent(item: Item, texts: dict[str, str | None], *, sides: Iterable[str]) -> dict[str, str]:
    """The final texts in ``texts`` for ``item``'s responses ``sides`` (those whose edits differ), line ends made
    ``\\n``; a text that would leave its response blank is no final text and is left out."""
    sent = {}
    for side in sorted(sides):
        text = (texts.get(side) or "").replace("\r\n", "\n")
        if not is_blank(with_text(item.response_a if side == "a" else item.response_b, text)):
            sent[side] = text
    return sent


@transaction.atomic
def conflict_resolve(*, item: Item, label: str, user: AbstractBaseUser, shown_label: str | None = None,
                     shown_resolution: str | None = None, texts: dict[str, str | None] | None = None) -> Item:
    """The owner's final label for an item whose reviewers disagree; the item becomes complete.

    ``texts`` gives the final text of each response (``"a"``/``"b"``) whose reviewers' edits differ
    (``open_edit_sides``): one reviewer's edit picked, or the owner's own; such a response without one is refused
    (field ``text_a``/``text_b``), as is a blank text given (``""``: the owner cleared the box; None is none given).
    Texts of responses whose edits agree are not the owner's to set here and are left alone. A resolution changed
    later keeps its final texts unless new ones are given.

    ``shown_label`` is the resolution the owner chose over (``""``: none), as their page showed it, and
    ``shown_resolution`` that resolution's ``selectors.resolution_stamp`` (None: the label alone is compared). When
    the item has been resolved otherwise since (another owner, an older tab; another label or another text), nothing
    changes and
    ``AlreadyResolved`` says by whom, holding the texts sent; when it already has ``label`` and the final texts sent
    (if any) say the same as its own, it is left as it is: nothing the owner chose is lost. ``None`` (scripts)
    resolves over whatever is there. The check and the write hold the item's row lock."""
    if label not in (Label.A, Label.B, Label.TIE, Label.BOTH_BAD):
        raise ValidationError({"label": f"label {label!r} is not one of a, b, tie, both_bad"})
    texts = texts or {}
    for side in ("a", "b"):
        checked_text(texts.get(side) or "", field=f"text_{side}")
    item = Item.objects.select_for_update(of=("self",)).select_related("resolved_by").get(pk=item.pk)
    # A resolved conflict may be resolved again (the owner changes their mind); nothing else may.
    if item.status != ItemStatus.CONFLICT and not item.resolved_label:
        raise ValidationError({"item": left_conflict_reason(item)})
    open_sides = open_edit_sides(item_answers(item))
    if blank := blank_final_texts(item, texts, sides=open_sides):
        raise ValidationError(blank)
    sent = final_texts_sent(item, texts, sides=open_sides)
    final = {"a": item.resolved_a, "b": item.resolved_b}
    if shown_label is not None and (item.resolved_label != shown_label
                                    or shown_resolution not in (None, selectors.resolution_stamp(item))):
        if item.resolved_label == label and all(final[side] is not None and same_edit(text, final[side])
                                                for side, text in sent.items()):
            return item
        raise AlreadyResolved(item=item, sent_texts=sent)
    final.update(sent)
    missing = {f"text_{side}": (f"reviewers edited response {side.upper()} differently: choose the final text of "
                                f"response {side.upper()} (one of their edits, or write it)")
               for side in sorted(open_sides) if final[side] is None}
    if missing:
        raise ValidationError(missing)
    item.resolved_label = label
    item.resolved_a, item.resolved_b = final["a"], final["b"]
    item.resolved_by = user
    item.resolved_at = timezone.now()
    item.status = ItemStatus.COMPLETE
    item.save(update_fields=["resolved_label", "resolved_a", "resolved_b", "resolved_by", "resolved_at", "status"])
    return item


def left_conflict_reason(item: Item) -> str:
    """Why unresolved ``item`` is not a conflict to resolve, and what becomes of it. The conflicts page may have shown
    it as one: since then an owner may have raised the reviews per item (it went back to review) or a reviewer changed
    their answer (its reviewers agree)."""
    if item.status == ItemStatus.COMPLETE:
        label = final_label(item, item.reviews.all())
        return (f"item {item.sequence} is not in conflict: its reviewers agree (one may have changed their answer since "
                f"this page was loaded), so it is complete with their label, {Label(label).label if label else 'none'}; "
                "there is nothing to resolve.")
    required = item.campaign.required_reviews
    return (f"item {item.sequence} is not in conflict: it is {item.get_status_display().lower()}, for {required} "
            "answers (the campaign's reviews per item; an owner may have raised them since this page was loaded). It "
            "comes to the conflicts page if its reviewers disagree once they have answered.")


# --- Export ----------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class ExportOptions:
    """What an export keeps: ``drop_ties``/``drop_both_bad`` leave those items out (kept, they are
    written with the responses in stored order and ``review.label`` saying what they are);
    ``apply_edits`` uses reviewers' edited responses: a response's edit when its answers' edits agree (skips carry
    none; an item whose edits differ unresolved is a conflict, left out). An owner's final text of a response
    (``Item.resolved_a``/``resolved_b``, chosen or written resolving a conflict) is written either way: it is their
    decision, as the label is, not a reviewer's suggestion."""

    dataset_name: str
    drop_ties: bool = True
    drop_both_bad: bool = True
    apply_edits: bool = True


def _final_row(item: Item, reviews: list[Review], options: ExportOptions) -> tuple[dict[str, Any] | None, str]:
    label = final_label(item, reviews)
    if label is None:
        return None, "no_majority"
    if label == Label.TIE and options.drop_ties:
        return None, "tie"
    if label == Label.BOTH_BAD and options.drop_both_bad:
        return None, "both_bad"
    answers = [(review.label, review.edited_a, review.edited_b)
               for review in sorted(reviews, key=lambda review: (review.created_at, review.pk))]
    final = {}
    for side, resolved in (("a", item.resolved_a), ("b", item.resolved_b)):
        # An owner's final text is their decision, as their label is: written whether or not edits are applied.
        if resolved is not None:
            final[side] = resolved
            continue
        edits = distinct_edits(answers, side) if options.apply_edits else []
        if len(edits) > 1:
            # Not a text reviewers decided on (the item's status says conflict, so this is not reached).
            return None, "unresolved_conflict"
        final[side] = edits[0] if edits else None
    response_a = item.response_a if final["a"] is None else with_text(item.response_a, final["a"])
    response_b = item.response_b if final["b"] is None else with_text(item.response_b, final["b"])
    if is_blank(response_a) or is_blank(response_b):
        # Stored by campaigns generated before blank answers were left out, or blanked by an edit: the
        # version's validator refuses the row, which would fail the whole export.
        return None, "empty_response"
    if is_same_response(response_a, response_b):
        # Stored by campaigns generated before identical answers were left out, or made one by edits.
        return None, "identical"
    swapped = label == Label.B
    chosen, rejected = (response_b, response_a) if swapped else (response_a, response_b)
    row: dict[str, Any] = {}
    if item.prompt is not None:
        row["prompt"] = item.prompt
    review = {"campaign": item.campaign.public_id, "item": item.public_id, "label": label,
              "resolved": bool(item.resolved_label), "source": item.source, "source_row": item.source_row}
    if item.metadata.get("model_a") and item.metadata.get("model_b"):
        # Arena and run pairs: which model wrote each side, as the arena's own export names them.
        models = (item.metadata["model_b"], item.metadata["model_a"]) if swapped else (
            item.metadata["model_a"], item.metadata["model_b"])
        review.update(chosen_model=models[0], rejected_model=models[1])
    for key in ("battle", "prompts_version"):
        if key in item.metadata:
            review[key] = item.metadata[key]
    row.update(chosen=chosen, rejected=rejected, review=review)
    return row, "written"


def _export_dataset(project: Project, name: str, user: AbstractBaseUser | None) -> Dataset | None:
    """The preference dataset ``name`` of ``project`` (None when there is none yet); refuses a dataset
    of another kind."""
    dataset = dataset_named(project=project, name=name)
    if dataset is not None and dataset.kind != formats.DatasetKind.PREFERENCE:
        raise ValidationError({"dataset_name": f"{name!r} is {with_article(dataset.kind)} dataset; choose a preference "
                                               "dataset or a new name"})
    return dataset


@transaction.atomic
def export_create(*, campaign: Campaign, options: ExportOptions, user: AbstractBaseUser | None) -> Export:
    """Queue the export of the campaign's complete items as the next version of the ``preference``
    dataset ``options.dataset_name`` (created when missing); the ``default`` worker writes it
    (``export_write``). Returns the export, ``writing`` until then."""
    # Checked as the dataset's own name will be, here where the form can show it, not in the worker.
    name = checked_name(options.dataset_name, field="dataset_name", max_length=dataset_services.DATASET_NAME_MAX)
    if not name:
        raise ValidationError({"dataset_name": "name the dataset the reviewed pairs go to"})
    _export_dataset(campaign.project, name, user)
    if not Item.objects.filter(campaign=campaign, status=ItemStatus.COMPLETE).exists():
        raise ValidationError({"dataset_name": "no item is complete yet: review some items (or resolve their "
                                               "conflicts) first"})
    export = Export.objects.create(
        campaign=campaign, dataset_name=name, created_by=user,
        options={"drop_ties": options.drop_ties, "drop_both_bad": options.drop_both_bad,
                 "apply_edits": options.apply_edits})
    activity_record(project=campaign.project, actor=user, verb=Verb.CAMPAIGN_EXPORTED, target=campaign,
                    details={"dataset": name})
    transaction.on_commit(lambda: _send(EXPORT_TASK, [export.pk]))
    return export


def export_write(*, export_id: int) -> Export:
    """Write an export's complete items as a ``preference`` JSONL file and store it as the next version
    of its dataset through the datasets services, so that the ``default`` worker validates it like any
    upload and it becomes ready (the ``default`` worker runs this). The export row records the rows
    written and left out, the reviewers and the agreement figures (provenance); a redelivered task
    leaves a finished export alone.

    Each row carries its review (label, item, campaign) in a ``review`` column, which the
    ``preference`` kind ignores when training. The export is then ``validating`` until the version's
    check settles it (``export_settle``)."""
    export = Export.objects.select_related("campaign__project", "created_by").get(pk=export_id)
    if export.status != ExportStatus.WRITING:
        return export
    campaign = export.campaign
    options = ExportOptions(dataset_name=export.dataset_name, **export.options)
    counts = {"written": 0, "tie": 0, "both_bad": 0, "no_majority": 0, "empty_response": 0, "identical": 0,
              "unresolved_conflict": 0, "not_complete": 0}
    upload = TemporaryUploadedFile(f"review-{campaign.public_id}.jsonl", "application/x-ndjson", 0, "utf-8")
    try:
        items = (Item.objects.filter(campaign=campaign, status=ItemStatus.COMPLETE).select_related("campaign")
                 .prefetch_related("reviews").order_by("sequence"))
        for item in items.iterator(chunk_size=ITEM_BATCH):
            row, outcome = _final_row(item, list(item.reviews.all()), options)
            counts[outcome] += 1
            if row is not None:
                upload.write(json.dumps(row, ensure_ascii=False).encode() + b"\n")
        by_status = selectors.status_counts(campaign=campaign)
        counts["unresolved_conflict"] += by_status[ItemStatus.CONFLICT]
        counts["not_complete"] = by_status[ItemStatus.PENDING] + by_status[ItemStatus.IN_REVIEW]
        upload.flush()
        upload.size = upload.tell()
        upload.seek(0)
        export.counts = counts
        export.reviewers = sorted(set(Review.objects.filter(campaign=campaign)
                                      .values_list("reviewer__username", flat=True)))
        export.agreement = agreement.report_to_dict(selectors.campaign_agreement(campaign=campaign))
        try:
            with transaction.atomic():
                if counts["written"] == 0:
                    raise ValidationError({"dataset_name": "no pair was left to write: every complete item is a tie, "
                                                           "both bad, without a majority, with an empty answer or "
                                                           "with the same answer twice; "
                                                           "keep ties or both-bad items, or resolve more items"})
                dataset = _export_dataset(campaign.project, options.dataset_name, export.created_by)
                if dataset is None:
                    dataset = dataset_services.dataset_create(project=campaign.project, name=options.dataset_name,
                                                              kind=formats.DatasetKind.PREFERENCE,
                                                              user=export.created_by, record=False)
                export.version = dataset_services.dataset_version_create(
                    dataset=dataset, upload=upload, file_format="jsonl", column_mapping={}, user=export.created_by,
                    record=False)
                # Done or failed once the version's own validation settles (export_settle).
                export.status, export.notice = ExportStatus.VALIDATING, ""  # a lost worker's notice is over
                export.save(update_fields=["version", "status", "notice", "counts", "reviewers", "agreement"])
        except ValidationError as error:
            with transaction.atomic():
                export.save(update_fields=["counts", "reviewers", "agreement"])
                _export_end(export=export, was=ExportStatus.WRITING, status=ExportStatus.FAILED,
                            error=" ".join(error.messages))
    finally:
        upload.close()
    logger.info("review export %s of %s: %s, %s", export.pk, campaign.public_id, export.status, counts)
    return export


@transaction.atomic
def export_settle(*, version_id: int) -> None:
    """Give the exports that wrote version ``version_id`` its validation's outcome, once it has one:
    ``done`` when the version is ready, ``failed`` with its first problem when it is not. The datasets'
    validation task calls this for every version it checks: versions no export wrote, unsettled
    versions and settled exports are left alone, so a redelivery changes nothing."""
    version = DatasetVersion.objects.select_related("dataset").filter(pk=version_id).first()
    if version is None or not version.is_settled:
        return
    waiting = (Export.objects.select_for_update(of=("self",)).select_related("campaign")
               .filter(version=version, status=ExportStatus.VALIDATING))
    ready = version.status == VersionStatus.READY
    for export in waiting:
        _export_end(export=export, was=ExportStatus.VALIDATING,
                    status=ExportStatus.DONE if ready else ExportStatus.FAILED,
                    error="" if ready else validation_failure(version))


@transaction.atomic
def _export_end(*, export: Export, was: str, status: str, error: str = "") -> bool:
    """The one place a review export ends (its version's check settled it, writing it failed, or its workers were
    lost): ``status`` recorded only while it is still ``was`` (a redelivered task or a second reaper changes
    nothing), and its project's ``review.exported`` webhooks told in the same transaction. Whether it ended here."""
    if not Export.objects.filter(pk=export.pk, status=was).update(status=status, error=error, notice=""):
        return False
    export.status, export.error, export.notice = status, error, ""
    webhooks.review_export_ended(export=export)
    return True


def validation_failure(version: DatasetVersion) -> str:
    """Why an exported version failed its check, in one sentence: its first problem and how many more."""
    first = formats.Issue.from_dict(version.errors[0]) if version.errors else "the check failed"
    more = version.error_count - 1
    return (f"{version} failed validation: {first}"
            f"{f' (and {more} more problem{pluralize(more)})' if more > 0 else ''}; its page lists them")


def _until_ready(version: DatasetVersion) -> str:
    """What to do about a version that is not ready: a failed one never will be."""
    return ("choose a ready version, or fix the file and upload it again" if version.status == VersionStatus.FAILED
            else "wait until it is ready")
