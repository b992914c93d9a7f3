"""Review campaigns: a team judges pairs of responses to the same prompt.

Design note. An item holds copies of its prompt and two responses (``a`` and ``b``), so that the
reviewing page never scans a dataset file and items from other sources (chat arena votes, two runs'
generations) look the same. ``original_label`` says which response the source preferred (for a
``preference`` dataset row, ``a`` is the row's ``chosen``), so reviews can be compared with it.

Each reviewer sees an item's responses in an order drawn per (reviewer, item); a ``Review`` stores
what was clicked as shown (``choice``: first/second/...) and the same answer in item terms
(``label``: a/b/...), so position bias and agreement are both measurable.

The reviewer queue (``services.queue_next_item``) walks open (pending, in review) items by their
per-campaign ``sequence`` from the reviewer's ``cursor`` (see ``CampaignReviewer``) through the
(campaign, status, sequence) index; status and ``review_count`` (reviews that are not skips) are
columns of the item so that the walk needs no join except the (item, reviewer) probe of the
``Review`` unique index and the probe of the item's live ``Lease`` rows (one per reviewer holding it).
"""
from __future__ import annotations

from django.conf import settings
from django.db import models

from webapp.core.ids import PUBLIC_ID_MAX_LENGTH, new_public_id
from webapp.datasets.models import DatasetVersion
from webapp.projects.models import Project

MAX_REQUIRED_REVIEWS = 10


def new_campaign_id() -> str:
    return new_public_id("rc")


def new_item_id() -> str:
    return new_public_id("ri")


class CampaignStatus(models.TextChoices):
    LOADING = "loading", "Loading items"
    GENERATING = "generating", "Generating answers"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed to load"
    # An owner stopped the generation (``services.generation_cancel``): no items, as a pair needs both models'
    # answers and model A answers every prompt before model B.
    CANCELLED = "cancelled", "Generation cancelled"


class Campaign(models.Model):
    public_id = models.CharField(max_length=PUBLIC_ID_MAX_LENGTH, unique=True, default=new_campaign_id)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="review_campaigns")
    name = models.CharField(max_length=100)
    guidelines = models.TextField(blank=True, help_text="Markdown, shown beside every item.")
    required_reviews = models.PositiveSmallIntegerField(default=2)
    source_version = models.ForeignKey(DatasetVersion, on_delete=models.SET_NULL, null=True, blank=True,
                                       related_name="review_campaigns")
    # The source version's name and number ("prefs v1"), kept so that the campaign still names its
    # source once the version or its dataset is deleted (``source_version`` is then empty).
    source_label = models.CharField(max_length=200, blank=True)
    reviewers = models.ManyToManyField(settings.AUTH_USER_MODEL, through="CampaignReviewer", related_name="+")
    # A campaign on a dataset version is loading until the `default` worker has made its items; one
    # on two models' answers is generating until the `serve` worker has generated all of them (or an
    # owner cancels it: the worker stops at its next slice of prompts).
    status = models.CharField(max_length=10, choices=CampaignStatus.choices, default=CampaignStatus.READY)
    load_error = models.TextField(blank=True)
    notice = models.TextField(blank=True, default="", help_text=(
        "A word on the load or generation under way that is no failure: that its worker was lost and it starts over "
        "(services.campaign_load_requeued, generation_lost). Its outcome clears it; load_error holds failures."))
    # A generated campaign's request (``services.campaign_generate``): the two models, the prompts, the
    # sampling settings; empty for other campaigns.
    generation = models.JSONField(default=dict, blank=True)
    # Answers generated so far (of 2 × the prompts), while generating.
    generated_answers = models.PositiveIntegerField(default=0)
    # Whether a serve worker is answering the campaign's prompts (``services.generation_begin`` to
    # ``generation_end``): a cancel ends the campaign at once, but the worker stops only after the slice of
    # prompts under way, and its models may not be deleted until then (``selectors.generation_readers``).
    generation_running = models.BooleanField(default=False)
    # Deleted by an owner while the serve worker was answering its prompts (``services.campaign_delete``): kept,
    # cancelled, as the record that holds its models (``selectors.generation_readers``) until the worker stops
    # and deletes it (``services.generation_end``).
    delete_when_stopped = models.BooleanField(default=False)
    # When the generation was last asked for or last reported answers: while answers keep coming, a
    # worker holds its message and the page need not ask Redis whether it is still queued.
    generation_progress_at = models.DateTimeField(null=True, blank=True)
    # Rows of the source version left out by the load as their chosen and rejected answers are the same
    # (``services.is_same_response``: nothing to prefer), said on the campaign page.
    identical_rows = models.PositiveIntegerField(default=0)
    # Next free item sequence number; items added later (arena, runs) continue from here.
    next_sequence = models.PositiveIntegerField(default=1)
    # Counts the requests to load the items (creation, then each "Queue the load again"); a load carries
    # its number and stops once a later one is asked for, so that two loads never write items at once.
    load_attempt = models.PositiveIntegerField(default=0)
    # Counts the deliveries that started a load: a message redelivered while its first delivery still
    # runs (the worker's connection dropped) starts over and the earlier delivery stops, so that it can
    # neither delete the later one's items nor mark the campaign ready without them.
    load_claim = models.PositiveIntegerField(default=0)
    # Counts the answers changed after they were given (``services.review_change``): a change adds no review,
    # so the agreement report's cache key (``selectors.campaign_agreement``) carries this count too.
    answers_changed = models.PositiveIntegerField(default=0)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="campaign_unique_project_name"),
            models.CheckConstraint(
                condition=models.Q(required_reviews__gte=1, required_reviews__lte=MAX_REQUIRED_REVIEWS),
                name="campaign_required_reviews_range",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.public_id})"


class CampaignReviewer(models.Model):
    """A reviewer of a campaign. ``cursor``: every item with a lower or equal sequence is either
    reviewed by this reviewer or has all its reviews, so the queue starts its walk after it.
    Reviews never go away, so the statement stays true until ``required_reviews`` grows (the
    service then resets every cursor to 0)."""

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="reviewer_rows")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    cursor = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["campaign", "user"], name="campaignreviewer_unique"),
        ]


class ItemSource(models.TextChoices):
    DATASET = "dataset", "Dataset row"
    ARENA = "arena", "Arena vote"
    RUNS = "runs", "Run generations"


class ItemStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    IN_REVIEW = "in_review", "In review"
    COMPLETE = "complete", "Complete"
    CONFLICT = "conflict", "Conflict"


class Label(models.TextChoices):
    """An answer in item terms (which stored response is better)."""

    A = "a", "A better"
    B = "b", "B better"
    TIE = "tie", "Tie"
    BOTH_BAD = "both_bad", "Both bad"
    SKIP = "skip", "Skipped"


class Choice(models.TextChoices):
    """An answer as the reviewer clicked it (which shown response is better)."""

    FIRST = "first", "First better"
    SECOND = "second", "Second better"
    TIE = "tie", "Tie"
    BOTH_BAD = "both_bad", "Both bad"
    SKIP = "skip", "Skip"


class Item(models.Model):
    public_id = models.CharField(max_length=PUBLIC_ID_MAX_LENGTH, unique=True, default=new_item_id)
    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="items")
    sequence = models.PositiveIntegerField()
    source = models.CharField(max_length=10, choices=ItemSource.choices)
    # Row number (1-based, as in the dataset preview) of the source version, for dataset items.
    source_row = models.PositiveIntegerField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True, help_text="Source details: arena vote, models, runs, step.")
    # Each a string or a message list, as in a `preference` row.
    prompt = models.JSONField(null=True, blank=True)
    response_a = models.JSONField()
    response_b = models.JSONField()
    original_label = models.CharField(max_length=1, blank=True, choices=[("a", "a"), ("b", "b")])
    status = models.CharField(max_length=10, choices=ItemStatus.choices, default=ItemStatus.PENDING)
    review_count = models.PositiveSmallIntegerField(default=0, help_text="Reviews that are not skips.")
    resolved_label = models.CharField(max_length=10, blank=True, choices=Label.choices)
    resolved_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True,
                                    related_name="+")
    resolved_at = models.DateTimeField(null=True)
    # The final text of response a/b when its reviewers' edits differed (``services.open_edit_sides``): one of
    # their edits picked by the owner who resolved the item, or written by them; null where edits agreed.
    resolved_a = models.TextField(null=True, blank=True)
    resolved_b = models.TextField(null=True, blank=True)

    class Meta:
        ordering = ["campaign", "sequence"]
        constraints = [
            models.UniqueConstraint(fields=["campaign", "sequence"], name="item_unique_campaign_sequence"),
            models.CheckConstraint(condition=models.Q(status__in=[s.value for s in ItemStatus]),
                                   name="item_status_valid"),
        ]
        # The queue's index: its walk is (campaign_id = ?, status = ?, sequence > cursor) in order.
        indexes = [models.Index(fields=["campaign", "status", "sequence"], name="item_campaign_status")]

    def __str__(self) -> str:
        return f"item {self.sequence} of {self.campaign_id}"


class Lease(models.Model):
    """An item handed to a reviewer, held for them until ``until``: while it lasts it takes one of the
    item's places (answers and live leases together never pass ``required_reviews``), so reviewers
    working at the same time get different items, or share one only while it has room. A reviewer
    holds one item per campaign at a time: being handed another moves their lease; answering (or
    skipping) the item ends it."""

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="+")
    item = models.ForeignKey(Item, on_delete=models.CASCADE, related_name="leases")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    until = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["campaign", "reviewer"], name="lease_unique_campaign_reviewer"),
        ]


class ConflictRead(models.Model):
    """An item whose reviews ``reader`` was shown on the conflicts page (its answers, comments and models): they are
    no longer blind to it, so should it go back to review (the campaign asks for more reviews per item), it is not
    served to them (``services.queue_next_item``), as an item they answered is not."""

    item = models.ForeignKey(Item, on_delete=models.CASCADE, related_name="+")
    reader = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    read_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["item", "reader"], name="conflictread_unique_item_reader"),
        ]


class Review(models.Model):
    item = models.ForeignKey(Item, on_delete=models.CASCADE, related_name="reviews")
    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="reviews")
    # An account that has reviewed cannot be deleted (deactivated, it stays): the review is the team's, and
    # the item's ``review_count`` and status count it.
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    shown_first = models.CharField(max_length=1, choices=[("a", "a"), ("b", "b")])
    choice = models.CharField(max_length=10, choices=Choice.choices)
    label = models.CharField(max_length=10, choices=Label.choices)
    # An edited response is a new text; the item's response is never overwritten.
    edited_a = models.TextField(null=True, blank=True)
    edited_b = models.TextField(null=True, blank=True)
    comment = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["item", "created_at"]
        constraints = [
            models.UniqueConstraint(fields=["item", "reviewer"], name="review_unique_item_reviewer"),
        ]
        indexes = [models.Index(fields=["campaign", "reviewer"], name="review_campaign_reviewer")]

    def __str__(self) -> str:
        # Read by the admin for every review blocking an account's deletion: no further query.
        return f"review {self.pk} in campaign {self.campaign_id}"


class ExportStatus(models.TextChoices):
    WRITING = "writing", "Writing"
    VALIDATING = "validating", "Validating"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"


class Export(models.Model):
    """A dataset version made from a campaign's reviews (written by the ``default`` worker), with its
    provenance. Once its version is written the export is ``validating`` until the version's check
    settles it: ``done`` when the version is ready, ``failed`` (with the version's first problem) when
    not (``services.export_settle``)."""

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="exports")
    dataset_name = models.CharField(max_length=100)
    status = models.CharField(max_length=10, choices=ExportStatus.choices, default=ExportStatus.WRITING)
    error = models.TextField(blank=True)
    notice = models.TextField(blank=True, default="", help_text=(
        "A word on the export being written that is no failure: that its worker was lost and it starts over "
        "(services.export_requeued). Its outcome clears it; error holds a failure."))
    version = models.ForeignKey(DatasetVersion, on_delete=models.SET_NULL, null=True, related_name="+")
    options = models.JSONField(default=dict)
    reviewers = models.JSONField(default=list, help_text="Usernames of everyone whose reviews count.")
    agreement = models.JSONField(default=dict, help_text="The campaign's agreement figures at export time.")
    counts = models.JSONField(default=dict, help_text="Rows written and items left out, by reason.")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
