"""Reads of review campaigns for pages: campaigns, progress counts, items, conflicts, agreement.

A reviewer never sees another reviewer's answer to an item they could still review: the only page
that shows answers is the owner's conflict queue, and a conflict has all its reviews, so the queue
never serves it to anyone again.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.cache import cache
from django.db.models import Count, Exists, F, Max, Min, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.db.models.lookups import GreaterThanOrEqual, LessThan
from django.http import Http404
from django.utils import timezone

from jaxengine.words import counted
from webapp.core.bidi import isolated
from webapp.datasets.models import Dataset, DatasetVersion, VersionStatus
from webapp.projects.models import Membership, Project, Role
from webapp.review import agreement
from webapp.review.models import (
    Campaign, CampaignReviewer, CampaignStatus, ConflictRead, Export, ExportStatus, Item, ItemSource, ItemStatus, Label,
    Lease, Review,
)


def campaign_list(*, project: Project) -> QuerySet[Campaign]:
    """The project's campaigns, newest first, with their item count (``item_total``), how many of those
    are complete (``item_complete``, as ``campaign_progress`` counts ``done``) and how many of their
    reviewers may still review (``reviewer_total``, as ``reviewer_names`` lists them), all in the one
    query: a page of campaigns costs no query per campaign."""
    # Subqueries, not joins: joined, the campaigns' items were grouped and counted distinct, every item read on each
    # load of the campaign list, the arena and the leaderboard (3,000 items: 40-150 ms); a subquery counts one
    # campaign's entries of the items' (campaign, status, sequence) index.
    def counted(rows: QuerySet) -> Coalesce:
        return Coalesce(Subquery(rows.filter(campaign=OuterRef("pk")).order_by().values("campaign")
                                 .annotate(count=Count("pk")).values("count")), 0)

    return (
        Campaign.objects.filter(project=project)
        .select_related("source_version__dataset")
        .annotate(item_total=counted(Item.objects.all()),
                  item_complete=counted(Item.objects.filter(status=ItemStatus.COMPLETE)),
                  reviewer_total=counted(_reviewers_who_may_review(project)))
        .order_by("-created_at")
    )


def preference_versions_being_checked(*, project: Project) -> list[DatasetVersion]:
    """The project's preference versions uploaded but not yet checked, oldest first: the New review campaign page
    names them where it has no ready one (a newcomer who had just uploaded pairs was told to upload some)."""
    return list(DatasetVersion.objects.filter(dataset__project=project, dataset__kind="preference",
                                              status__in=(VersionStatus.UPLOADED, VersionStatus.VALIDATING))
                .select_related("dataset").order_by("created_at", "pk"))


@dataclass(frozen=True, kw_only=True)
class CampaignRow:
    campaign: Campaign  # as ``campaign_list`` annotates it
    too_few_reviewers: bool


def campaign_rows(*, project: Project) -> list[CampaignRow]:
    """The campaign list page's rows: ``campaign_list`` with each campaign's ``too_few_reviewers`` flag."""
    return [CampaignRow(campaign=campaign, too_few_reviewers=too_few_reviewers(
                campaign=campaign, reviewer_count=campaign.reviewer_total))
            for campaign in campaign_list(project=project)]


def export_campaigns(*, project: Project, versions: Iterable[DatasetVersion]) -> dict[int, Campaign]:
    """The campaign of ``project`` each of ``versions`` was exported from, by version pk (versions
    uploaded or made otherwise are not keys); one query."""
    exports = Export.objects.filter(campaign__project=project, version__in=list(versions)).select_related("campaign")
    return {export.version_id: export.campaign for export in exports}


def campaign_get(*, project: Project, public_id: str) -> Campaign:
    """The campaign ``public_id`` of ``project``; 404 when it belongs elsewhere."""
    campaign = (Campaign.objects.filter(project=project, public_id=public_id)
                .select_related("project", "source_version__dataset").first())
    if campaign is None:
        raise Http404("no such review campaign in this project")
    return campaign


def may_delete_campaign(*, membership: Membership) -> bool:
    """Owners may delete a campaign, as they alone create and change them; its reviewers may not."""
    return membership.can(Role.OWNER)


EXPORT_NAME_SUFFIX = " reviewed"


def default_export_name(*, campaign: Campaign) -> str:
    """The dataset name the export form suggests: "<campaign> reviewed", the campaign's name shortened
    with an ellipsis where both would pass a dataset name's length (a campaign name may be as long)."""
    limit = Dataset._meta.get_field("name").max_length
    name = campaign.name
    if len(name) + len(EXPORT_NAME_SUFFIX) > limit:
        name = name[:limit - len(EXPORT_NAME_SUFFIX) - 1].rstrip() + "…"
    return name + EXPORT_NAME_SUFFIX


def campaign_readers(*, campaign: Campaign, stopping_generation: bool = False) -> list[str]:
    """What still needs ``campaign`` (the work a deletion would break), one sentence each: a worker
    loading its items or generating its answers (not with ``stopping_generation``: a deletion that stops
    it, which the generation notices at its next slice), an export of its reviews being written. An export
    whose version is being validated holds nothing: the version is a dataset's own."""
    readers = []
    if campaign.status == CampaignStatus.LOADING:
        readers.append("its items are loading; wait until it is ready")
    elif campaign.status == CampaignStatus.GENERATING and not stopping_generation:
        readers.append("its answers are being generated; wait until it is ready")
    for export in campaign.exports.filter(status=ExportStatus.WRITING).order_by("created_at"):
        readers.append(f"its export to {isolated(export.dataset_name)} is being written; wait until it is done")
    return readers


def stopping_generations(*, project_id: int) -> list[Campaign]:
    """Cancelled campaigns of the project whose serve worker still answers the prompts under way: it stops only
    after its current slice (``services.generation_progress``), and says so (``services.generation_end``). A
    worker that died holding one never says it: once none of its answers has come for
    ``GENERATION_QUIET_SECONDS``, it counts only while Redis holds its message (``generation_seems_queued``; the
    task acknowledges at its end, and its redelivery, which finds the campaign cancelled, at once)."""
    from webapp.review.services import generation_seems_queued  # services import this module

    running = Campaign.objects.filter(project_id=project_id, status=CampaignStatus.CANCELLED, generation_running=True)
    return [campaign for campaign in running.order_by("created_at")
            if generation_seems_queued(campaign=campaign) is not False]


def generation_readers(*, project_id: int, model_id: str, model: str) -> list[str]:
    """The campaigns of the project whose answers are generated with the model ``model_id`` (a base model's id,
    or a run's, which covers its checkpoints), one sentence each for a deletion of it to refuse: generating,
    or cancelled while the serve worker still answers the prompts under way (``stopping_generations``).
    ``model`` names the model in the sentences ("it", "its model")."""
    def uses_it(campaign: Campaign) -> bool:
        refs = [((campaign.generation or {}).get(side) or {}).get("ref") or "" for side in ("model_a", "model_b")]
        return any(ref.split(":")[0] == model_id for ref in refs)  # the model, or a checkpoint's

    readers = []
    for campaign in Campaign.objects.filter(project_id=project_id, status=CampaignStatus.GENERATING).order_by(
            "created_at"):
        if uses_it(campaign):
            readers.append(f"review campaign {isolated(campaign.name)} is generating answers with {model}; wait until "
                           "it is ready")
    for campaign in stopping_generations(project_id=project_id):
        if uses_it(campaign):
            readers.append(f"review campaign {isolated(campaign.name)} was cancelled, but the serve worker is still "
                           f"answering the prompts under way with {model}; try again in a moment, once it has stopped")
    return readers


def prompt_sources(*, project: Project) -> list[tuple[DatasetVersion, str]]:
    """Dataset versions a generated campaign can take its prompts from, with an option label each
    (names bidi-isolated): the eval sets of the project's succeeded runs first (named after their
    runs), then every ready ``prompts`` and ``sft`` version."""
    from webapp.runs.models import Run, RunStatus

    versions = {version.public_id: version for version in
                DatasetVersion.objects.filter(dataset__project=project, status=VersionStatus.READY)
                .exclude(dataset__kind="text").select_related("dataset").order_by("dataset__name", "-number")}
    def described(version: DatasetVersion) -> str:
        return (f"{isolated(version.dataset.name)} v{version.number} ({version.dataset.kind}, "
                f"{counted(version.row_count, 'row', grouped=True)})")

    sources, seen = [], set()
    # The name and spec only: a finished run's row holds its series cache, about a megabyte.
    for run in (Run.objects.filter(project=project, status=RunStatus.SUCCEEDED).order_by("-created_at")
                .only("name", "spec")):
        version = versions.get(run.data_spec.get("eval") or "")
        if version is not None and version.public_id not in seen:
            seen.add(version.public_id)
            sources.append((version, f"Eval set of run {isolated(run.name)}: {described(version)}"))
    for version in versions.values():
        if version.public_id not in seen and version.dataset.kind in ("prompts", "sft"):
            sources.append((version, described(version)))
    return sources


def campaigns_taking_battles(*, project: Project) -> QuerySet[Campaign]:
    """The project's campaigns arena battles can be sent to (``campaign_list``'s rows): ready ones on arena votes or
    a dataset, not those on two models' answers (``Campaign.generation``), which compare those two models on their
    prompts and nothing else (``chat.arena.battles_to_review`` refuses them)."""
    return (campaign_list(project=project).filter(status=CampaignStatus.READY)
            .exclude(generation__has_key="model_a"))


def item_get(*, campaign: Campaign, public_id: str) -> Item:
    item = Item.objects.filter(campaign=campaign, public_id=public_id).select_related("campaign").first()
    if item is None:
        raise Http404("no such item in this campaign")
    return item


def arena_battle_ids(*, campaign: Campaign) -> set[str]:
    """Public ids of the arena battles already in ``campaign``."""
    return set(Item.objects.filter(campaign=campaign, source=ItemSource.ARENA)
               .values_list("metadata__battle", flat=True))


def is_reviewer(*, campaign: Campaign, user: AbstractBaseUser) -> bool:
    return CampaignReviewer.objects.filter(campaign=campaign, user=user).exists()


def reviewer_names(*, campaign: Campaign) -> list[str]:
    """The campaign's reviewers who may still review. A reviewer removed from the project or made a viewer
    is no longer one (``services.reviewer_leave_campaigns``); members are checked here all the same, as the
    Settings form checks them."""
    return sorted(_reviewers_who_may_review(campaign.project).filter(campaign=campaign)
                  .values_list("user__username", flat=True))


def _reviewers_who_may_review(project: Project) -> QuerySet[CampaignReviewer]:
    return CampaignReviewer.objects.filter(user__in=possible_reviewers(project=project).values("pk"))


def reviewers_who_may_review(*, campaign: Campaign) -> QuerySet[CampaignReviewer]:
    """The reviewer rows of ``campaign`` whose users may still review (``reviewer_names``' people)."""
    return _reviewers_who_may_review(campaign.project).filter(campaign=campaign)


def too_few_reviewers(*, campaign: Campaign, reviewer_count: int) -> bool:
    """Whether fewer reviewers may review ``campaign`` (``reviewer_count``, as ``reviewer_names`` counts
    them) than each of its items needs: no item can then be complete. The campaign page, its Settings
    and the campaign list say so."""
    return reviewer_count < campaign.required_reviews


def items_out_of_reach(*, campaign: Campaign, reviewer_count: int) -> int:
    """How many open items can never be complete although the campaign has reviewers enough: their answers
    and the reviewers who have not yet answered or skipped them, nor read their reviews on the conflicts page
    (``reviewer_count`` may review, as ``reviewer_names`` counts them), fall short of ``required_reviews``: a skip
    is never served again, nor a conflict sent back to review to those who read it. Only a skip or such a reading
    leaves an item so (answers of reviewers who left still count), so only items with one are read. 0 while
    ``too_few_reviewers`` holds: every item is then short, and that is said instead."""
    if too_few_reviewers(campaign=campaign, reviewer_count=reviewer_count):
        return 0
    reviewed = Review.objects.filter(item=OuterRef(OuterRef("pk")), reviewer=OuterRef("user_id"))
    read = ConflictRead.objects.filter(item=OuterRef(OuterRef("pk")), reader=OuterRef("user_id"))
    blocked_reviewers = (reviewers_who_may_review(campaign=campaign).filter(Exists(reviewed) | Exists(read))
                         .order_by().values("campaign").annotate(count=Count("pk")).values("count"))
    reachable = F("review_count") + reviewer_count - Coalesce(Subquery(blocked_reviewers), 0)
    return (Item.objects.filter(campaign=campaign, status__in=(ItemStatus.PENDING, ItemStatus.IN_REVIEW))
            .filter(Exists(Review.objects.filter(item=OuterRef("pk"), label=Label.SKIP))
                    | Exists(ConflictRead.objects.filter(item=OuterRef("pk"))))
            .filter(LessThan(reachable, campaign.required_reviews)).count())


@dataclass(frozen=True, kw_only=True)
class Progress:
    total: int
    counts: dict[str, int]
    done: int

    @property
    def percent(self) -> int:
        return round(100 * self.done / self.total) if self.total else 0


def status_counts(*, campaign: Campaign) -> dict[str, int]:
    """Items per status (every status present, zero when none)."""
    counts = {status: 0 for status in ItemStatus.values}
    for status, count in Item.objects.filter(campaign=campaign).values_list("status").annotate(count=Count("pk")).order_by():
        counts[status] = count
    return counts


def campaign_progress(*, campaign: Campaign) -> Progress:
    """Counts per status; ``done`` are complete items (conflicts wait for the owner)."""
    counts = status_counts(campaign=campaign)
    return Progress(total=sum(counts.values()), counts=counts, done=counts[ItemStatus.COMPLETE])


@dataclass(frozen=True, kw_only=True)
class ReviewerTally:
    answered: int  # reviews with a label: a skip is not a review
    skipped: int


def reviewer_done(*, campaign: Campaign, user: AbstractBaseUser) -> ReviewerTally:
    """How many items ``user`` has answered, and skipped, in ``campaign``."""
    counts = Review.objects.filter(campaign=campaign, reviewer=user).aggregate(
        skipped=Count("pk", filter=Q(label=Label.SKIP)), all=Count("pk"))
    return ReviewerTally(answered=counts["all"] - counts["skipped"], skipped=counts["skipped"])


def last_answer(*, campaign: Campaign, user: AbstractBaseUser) -> Review | None:
    """``user``'s most recent answer in ``campaign`` (skips included), with its item and who resolved it: the
    one the reviewing page offers to change, unless an owner has resolved its item."""
    return (Review.objects.filter(campaign=campaign, reviewer=user).select_related("item__resolved_by")
            .order_by("-created_at", "-pk").first())


@dataclass(frozen=True, kw_only=True)
class HeldItems:
    count: int
    first_back_at: datetime  # when the earliest of their leases ends


def leases_of_others(*, user: AbstractBaseUser, now: datetime) -> QuerySet[Lease]:
    """The live leases of reviewers other than ``user`` on the item of the outer query."""
    return Lease.objects.filter(item=OuterRef("pk"), until__gt=now).exclude(reviewer=user)


def places_taken(*, user: AbstractBaseUser, now: datetime) -> Any:
    """For the item of the outer query: its answers (skips left out) and the live leases others hold on
    it. ``user`` may be handed the item while this is below the campaign's ``required_reviews``."""
    held = (leases_of_others(user=user, now=now).order_by().values("item")
            .annotate(count=Count("pk")).values("count"))
    return F("review_count") + Coalesce(Subquery(held), 0)


def items_held_by_others(*, campaign: Campaign, user: AbstractBaseUser) -> HeldItems | None:
    """The open items ``user`` has not answered whose places other reviewers hold (answers and live
    leases fill them), with when the first of those leases ends; None when there are none. When the
    queue serves ``user`` nothing, these are what is left: a place comes back to the queue if its holder
    does not answer the item in time."""
    now = timezone.now()
    answered = Review.objects.filter(item=OuterRef("pk"), reviewer=user)
    read = ConflictRead.objects.filter(item=OuterRef("pk"), reader=user)
    first_back = leases_of_others(user=user, now=now).order_by("until").values("until")[:1]
    held = (Item.objects.filter(campaign=campaign, status__in=(ItemStatus.PENDING, ItemStatus.IN_REVIEW))
            .filter(GreaterThanOrEqual(places_taken(user=user, now=now), campaign.required_reviews))
            .exclude(Exists(answered)).exclude(Exists(read))
            .annotate(back_at=Subquery(first_back))
            .aggregate(count=Count("pk"), first_back_at=Min("back_at")))
    return HeldItems(**held) if held["count"] else None


def item_list(*, campaign: Campaign, status: str | None) -> QuerySet[Item]:
    """The campaign's items in order (only those of ``status`` when given), with their reviews."""
    items = Item.objects.filter(campaign=campaign).order_by("sequence").prefetch_related("reviews")
    return items.filter(status=status) if status else items


@dataclass(frozen=True, kw_only=True)
class ItemRow:
    item: Item
    prompt: str  # one line of it (``preview_text``)
    final_label: str  # as shown ("A better"); empty until the item is complete
    resolved: bool  # the final label is an owner's resolution, not the reviewers' majority


def item_rows(*, items: Iterable[Item]) -> list[ItemRow]:
    """The items page's rows: each item (its reviews prefetched) with the label a complete one is exported
    with, so that the page and the exported dataset never disagree."""
    from webapp.review.services import final_label  # services reads through this module: imported when used

    rows = []
    for item in items:
        label = final_label(item, item.reviews.all()) if item.status == ItemStatus.COMPLETE else None
        rows.append(ItemRow(item=item, prompt=preview_text(item.prompt), final_label=Label(label).label if label else "",
                            resolved=bool(item.resolved_label)))
    return rows


def conflict_list(*, campaign: Campaign) -> QuerySet[Item]:
    """Items whose reviewers disagree, oldest first, with their reviews and reviewers."""
    return (Item.objects.filter(campaign=campaign, status=ItemStatus.CONFLICT).order_by("sequence")
            .prefetch_related("reviews__reviewer"))


def export_list(*, campaign: Campaign) -> QuerySet[Export]:
    return campaign.exports.select_related("version__dataset", "created_by")


# Agreement over a large campaign takes a second or two to compute (bench/review_queue.py: ~2 s for
# 120,000 reviews); its inputs change only when a review is added, so it is cached per review state.
AGREEMENT_CACHE_SECONDS = 24 * 3600


def campaign_agreement(*, campaign: Campaign) -> agreement.AgreementReport:
    """The campaign's agreement figures from all its non-skip reviews, cached until a review is added
    or an answer changed (or the number of reviews per item changes)."""
    state = Review.objects.filter(campaign=campaign).aggregate(count=Count("pk"), last=Max("pk"))
    key = (f"review-agreement:{campaign.public_id}:{campaign.required_reviews}:"
           f"{state['count']}:{state['last']}:{campaign.answers_changed}")
    report = cache.get(key)
    if report is None:
        report = _compute_agreement(campaign)
        cache.set(key, report, AGREEMENT_CACHE_SECONDS)
    return report


def _compute_agreement(campaign: Campaign) -> agreement.AgreementReport:
    rows = (Review.objects.filter(campaign=campaign).exclude(label=Label.SKIP)
            .values_list("item_id", "reviewer__username", "label", "choice", "item__original_label",
                         "item__metadata__model_a", "item__metadata__model_b"))
    return agreement.campaign_report(
        (agreement.RatedReview(item=item_id, reviewer=username, label=label,
                               first_chosen=None if choice not in ("first", "second") else choice == "first",
                               original_label=original, model_a=model_a or "", model_b=model_b or "")
         for item_id, username, label, choice, original, model_a, model_b in rows.iterator(chunk_size=5000)),
        required_reviews=campaign.required_reviews,
    )


@dataclass(frozen=True, kw_only=True)
class ModelPreferenceRow:
    first: str
    second: str
    preference: agreement.ModelPreference


def model_preference_rows(*, project: Project, report: agreement.AgreementReport) -> list[ModelPreferenceRow]:
    """The report's model preferences with the models' labels (a model no longer offered keeps its ref)."""
    labels = _model_labels(project) if report.models else {}
    return [ModelPreferenceRow(first=labels.get(preference.models[0], preference.models[0]),
                               second=labels.get(preference.models[1], preference.models[1]), preference=preference)
            for preference in report.models]


def _model_labels(project: Project) -> dict[str, str]:
    """The labels of the project's models (archived runs' too) by ref, as the chat shows them now."""
    from webapp.chat.selectors import model_choices

    return {choice.ref: choice.label for choice in model_choices(project=project, archived=True)}


def as_display(value: Any) -> dict[str, Any] | None:
    """A prompt or response as the templates draw it: ``{"type": "text", "text": ...}`` or
    ``{"type": "chat", "turns": [(role, content), ...]}``; None for a missing prompt."""
    if value is None:
        return None
    if isinstance(value, list):
        return {"type": "chat", "turns": [(str(turn.get("role", "")), str(turn.get("content", ""))) for turn in value]}
    return {"type": "text", "text": str(value)}


def preview_text(value: Any) -> str:
    """One line of a prompt for tables: the text, or a chat's last user turn."""
    if isinstance(value, list):
        users = [turn for turn in value if turn.get("role") == "user"]
        return str((users or value)[-1].get("content", "")) if value else ""
    return "" if value is None else str(value)


def resolution_stamp(item: Item) -> str:
    """A short digest of ``item``'s resolution as it stands: its label and both final texts, everything an owner
    resolving it sets. A resolve form carries the stamp of the resolution its page showed (``shown_resolution``), so
    that a change made since, of a text as much as of the label, is caught rather than overwritten unseen."""
    resolution = json.dumps([item.resolved_label, item.resolved_a, item.resolved_b])
    return hashlib.sha256(resolution.encode()).hexdigest()[:32]


def resolution_stamps(*, public_ids: Iterable[str]) -> dict[str, str]:
    """The ``resolution_stamp`` of each item named that still exists, by public id."""
    items = Item.objects.filter(public_id__in=list(public_ids)).only(
        "public_id", "resolved_label", "resolved_a", "resolved_b")
    return {item.public_id: resolution_stamp(item) for item in items}


@dataclass(frozen=True, kw_only=True)
class ConflictEntry:
    item: Item
    prompt: dict[str, Any] | None
    response_a: dict[str, Any]
    response_b: dict[str, Any]
    reviews: list[Review]
    # The models that wrote response a and b (arena and generated items record them), "" for a dataset row.
    model_a: str = ""
    model_b: str = ""
    # For each response ("a"/"b") whose reviewers' edits differ: its different edited texts, each with who made
    # it, for the owner to pick one (or write the final text); ``originals`` holds those responses' texts unedited.
    edit_choices: dict[str, list[EditChoice]] = field(default_factory=dict)
    originals: dict[str, str] = field(default_factory=dict)
    # A resolution refused for this item (``with_refusal``): the form's fields as sent (``pick_a``, ``text_a``, …,
    # ``shown_label``, ``shown_resolution``) and the refusal's messages by field, so that the form comes back as the owner left it.
    sent: dict[str, str] = field(default_factory=dict)
    errors: dict[str, list[str]] = field(default_factory=dict)

    @property
    def shown_label(self) -> str:
        """The resolution the form says it was shown: the one sent with a refused form (not one made since)."""
        return self.sent.get("shown_label", "") if self.sent else self.item.resolved_label

    @property
    def shown_resolution(self) -> str:
        """The stamp of the resolution the form says it was shown (``resolution_stamp``), as ``shown_label``."""
        return self.sent.get("shown_resolution", "") if self.sent else resolution_stamp(self.item)

    @property
    def text_conflicts(self) -> list[FinalTextField]:
        """The final-text field of each response edited differently, holding what a refused form sent."""
        return [FinalTextField(side=side, choices=choices, original=self.originals[side],
                               picked=self.sent.get(f"pick_{side}"), written=self.sent.get(f"text_{side}", ""),
                               errors=self.errors.get(f"text_{side}", []))
                for side, choices in sorted(self.edit_choices.items())]

    def with_refusal(self, *, sent: dict[str, str], errors: dict[str, list[str]]) -> ConflictEntry:
        return dataclasses.replace(self, sent=sent, errors=errors)


@dataclass(frozen=True, kw_only=True)
class FinalTextField:
    """The conflicts page's choice of one response's final text: its reviewers' different edits, its original, and
    what a refused form sent (``picked``: the text picked, ``""`` for "write it", None for nothing; ``written``)."""

    side: str
    choices: list[EditChoice]
    original: str
    picked: str | None = None
    written: str = ""
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class EditChoice:
    """One edited text of a response and the usernames of the reviewers who made it (edits equal once stripped
    together)."""

    text: str
    editors: list[str]


def edit_choices(reviews: list[Review]) -> dict[str, list[EditChoice]]:
    """The different edits of each response of one item whose (non-skip) reviews edited it differently, in the
    order they were made; responses whose edits agree are not named (they are no conflict)."""
    from webapp.review import services  # services read this module's selectors

    ordered = sorted((review for review in reviews if review.label != Label.SKIP),
                     key=lambda review: (review.created_at, review.pk))
    answers = [(review.label, review.edited_a, review.edited_b) for review in ordered]
    choices = {}
    for side in sorted(services.open_edit_sides(answers)):
        choices[side] = [
            EditChoice(text=text, editors=[review.reviewer.get_username() for review in ordered
                                           if (edit := getattr(review, f"edited_{side}")) is not None
                                           and services.same_edit(edit, text)])
            for text in services.distinct_edits(answers, side)]
    return choices


def conflict_entries(*, campaign: Campaign, limit: int) -> list[ConflictEntry]:
    """The first ``limit`` conflicts with their (non-skip) reviews and the models that wrote their responses, ready
    to draw: each model by its label now (``model_preference_rows``' too), else the one recorded with the item (a
    model since deleted), else its ref. Named to the campaign's owners, whose page this is: a conflict is served to no
    reviewer (its reviews are in), and the reviewing page, which stays blind, names no model."""
    return _conflict_entries(campaign, list(conflict_list(campaign=campaign)[:limit]))


def conflict_entry(*, item: Item) -> ConflictEntry:
    """``item`` as ``conflict_entries`` draws it, wherever it is in the list (or out of it, resolved)."""
    item = Item.objects.filter(pk=item.pk).select_related("campaign__project").prefetch_related("reviews__reviewer").get()
    return _conflict_entries(item.campaign, [item])[0]


def _conflict_entries(campaign: Campaign, items: list[Item]) -> list[ConflictEntry]:
    labels = _model_labels(campaign.project) if any(item.metadata.get("model_a") for item in items) else {}

    def model(item: Item, side: str) -> str:
        ref = item.metadata.get(side) or ""
        return labels.get(ref) or item.metadata.get(f"{side}_label") or ref

    from webapp.review.services import editable_text  # services read this module's selectors

    entries = []
    for item in items:
        reviews = [review for review in item.reviews.all() if review.label != Label.SKIP]
        choices = edit_choices(reviews)
        entries.append(ConflictEntry(
            item=item, prompt=as_display(item.prompt), response_a=as_display(item.response_a),
            response_b=as_display(item.response_b), reviews=reviews,
            model_a=model(item, "model_a"), model_b=model(item, "model_b"), edit_choices=choices,
            originals={side: editable_text(item.response_a if side == "a" else item.response_b)
                       for side in choices}))
    return entries


def possible_reviewers(*, project: Project):
    """Users who may review a campaign of ``project``: its members and owners whose accounts are active (a
    deactivated account cannot log in, so it would hold places it never fills)."""
    user_ids = Membership.objects.filter(project=project).exclude(role=Role.VIEWER).values("user_id")
    return get_user_model().objects.filter(pk__in=user_ids, is_active=True).order_by("username")


def default_required_reviews(*, project: Project) -> int:
    """Reviews per item a new campaign starts at: 2, or 1 where one person may review (an owner working
    alone), since 2 could then never be given."""
    return min(2, max(1, possible_reviewers(project=project).count()))
