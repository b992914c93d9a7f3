"""Review migrations that fill new fields from what older rows hold."""
import pytest

from tests.webapp.migrating import migrated_back_to

pytestmark = pytest.mark.django_db(transaction=True)


# Datasets as these review migrations knew them: before the stored name_key, which historical models
# (they have no save()) would leave empty.
DATASETS_BEFORE_NAME_KEY = ("datasets", "0003_unique_name_in_any_case")


def test_exports_marked_done_take_their_versions_outcome():
    """Exports were marked done as soon as their version was written, whatever its check said."""
    with migrated_back_to(("review", "0006_campaign_generation_progress_at"), DATASETS_BEFORE_NAME_KEY) as apps:
        Project = apps.get_model("projects", "Project")
        Dataset = apps.get_model("datasets", "Dataset")
        Campaign = apps.get_model("review", "Campaign")
        Export = apps.get_model("review", "Export")
        project = Project.objects.create(name="Alpha", slug="alpha")
        dataset = Dataset.objects.create(project=project, name="gen-reviewed", kind="preference")
        campaign = Campaign.objects.create(project=project, name="pass 1")
        errors = [{"code": "empty_string", "message": "is an empty string; give it text or drop the row", "line": 3,
                   "row": 3, "field": "chosen"}]
        for number, status in enumerate(["failed", "ready", "uploaded"], start=1):
            version = dataset.versions.create(number=number, original_filename="x.jsonl", format="jsonl", size_bytes=1,
                                              file_path=f"x{number}", status=status, errors=errors if status == "failed" else [],
                                              error_count=2 if status == "failed" else 0)
            Export.objects.create(campaign=campaign, dataset_name="gen-reviewed", status="done", version=version)
    from webapp.review.models import Export as CurrentExport

    exports = list(CurrentExport.objects.order_by("pk"))
    assert [export.status for export in exports] == ["failed", "done", "validating"]
    assert exports[0].error == ("gen-reviewed v1 failed validation: line 3, row 3, field 'chosen': is an empty string; "
                                "give it text or drop the row (and 1 more problem); its page lists them")


def test_campaigns_keep_the_name_of_their_source_version():
    """A campaign whose source was deleted read 'arena votes'; it now keeps its source's name."""
    with migrated_back_to(("review", "0007_export_validating"), DATASETS_BEFORE_NAME_KEY) as apps:
        Project = apps.get_model("projects", "Project")
        Dataset = apps.get_model("datasets", "Dataset")
        Campaign = apps.get_model("review", "Campaign")
        project = Project.objects.create(name="Alpha", slug="alpha")
        dataset = Dataset.objects.create(project=project, name="prefs", kind="preference")
        version = dataset.versions.create(number=2, original_filename="x.jsonl", format="jsonl", size_bytes=1,
                                          file_path="x", status="ready")
        Campaign.objects.create(project=project, name="on prefs", source_version=version)
        orphan = Campaign.objects.create(project=project, name="source gone")
        orphan.items.create(sequence=1, source="dataset", response_a="a", response_b="b")
        Campaign.objects.create(project=project, name="arena")
        Campaign.objects.create(project=project, name="generated", generation={"prompts": {"label": "chats v1"}})
    from webapp.review.models import Campaign as CurrentCampaign

    assert dict(CurrentCampaign.objects.values_list("name", "source_label")) == {
        "on prefs": "prefs v2", "source gone": "a dataset version", "arena": "", "generated": ""}


def test_reviewers_no_longer_members_of_the_project_leave_its_campaigns():
    """A member removed from a project, or made a viewer, stayed a reviewer of its campaigns, and was one
    again, unasked, once added back or promoted; the migration takes off those who may not review now."""
    with migrated_back_to(("review", "0008_campaign_source_label"), DATASETS_BEFORE_NAME_KEY) as apps:
        User = apps.get_model("auth", "User")
        Project = apps.get_model("projects", "Project")
        Membership = apps.get_model("projects", "Membership")
        Campaign = apps.get_model("review", "Campaign")
        owner, member, viewer, gone = (User.objects.create(username=name) for name in ("owner", "member", "viewer", "gone"))
        alpha, beta = (Project.objects.create(name=slug, slug=slug) for slug in ("alpha", "beta"))
        for user, role in ((owner, "owner"), (member, "member"), (viewer, "viewer")):
            Membership.objects.create(project=alpha, user=user, role=role)
        Membership.objects.create(project=beta, user=gone, role="member")
        campaign = Campaign.objects.create(project=alpha, name="pass 1")
        for user in (owner, member, viewer, gone):
            campaign.reviewer_rows.create(user=user)
        item = campaign.items.create(sequence=1, source="dataset", response_a="a", response_b="b")
        campaign.reviews.create(item=item, reviewer=gone, shown_first="a", choice="first", label="a")
        Campaign.objects.create(project=beta, name="theirs").reviewer_rows.create(user=gone)
    from webapp.review.models import CampaignReviewer, Review

    assert sorted(CampaignReviewer.objects.values_list("campaign__name", "user__username")) == [
        ("pass 1", "member"), ("pass 1", "owner"), ("theirs", "gone")]
    assert Review.objects.filter(reviewer__username="gone").count() == 1


def test_live_item_leases_become_lease_rows():
    """An item held one lease in two columns, so a second reviewer handed an item with room held nothing;
    leases are now rows. Live leases are kept (one item per reviewer and campaign: the one leased last);
    those run out go."""
    from datetime import timedelta

    from django.utils import timezone

    now = timezone.now()
    with migrated_back_to(("review", "0010_visible_campaign_names"), DATASETS_BEFORE_NAME_KEY) as apps:
        User = apps.get_model("auth", "User")
        Project = apps.get_model("projects", "Project")
        Campaign = apps.get_model("review", "Campaign")
        carol, dave = (User.objects.create(username=name) for name in ("carol", "dave"))
        campaign = Campaign.objects.create(project=Project.objects.create(name="alpha", slug="alpha"), name="pass 1")
        for sequence, holder, minutes in ((1, carol, 5), (2, carol, 8), (3, dave, -1), (4, None, None)):
            campaign.items.create(sequence=sequence, source="dataset", response_a="a", response_b="b", leased_by=holder,
                                  leased_until=now + timedelta(minutes=minutes) if minutes else None)
    from webapp.review.models import Lease

    assert [(lease.item.sequence, lease.reviewer.username, lease.until) for lease in Lease.objects.all()] == [
        (2, "carol", now + timedelta(minutes=8))]


def test_the_note_that_a_loads_or_exports_worker_was_lost_moves_from_the_error_to_the_notice_and_back():
    """The note that a campaign's load or generation, or an export, lost its worker and started over was stored in
    ``load_error`` and ``error``, where it read as a failure: a campaign still loading or generating, and an export
    still being written, have it as their ``notice`` instead, and those fields hold failures only. Migrated back,
    the notice is in its error field again."""
    before = ("review", "0018_campaign_delete_when_stopped")
    with migrated_back_to(before) as apps:
        Project = apps.get_model("projects", "Project")
        Campaign = apps.get_model("review", "Campaign")
        Export = apps.get_model("review", "Export")
        project = Project.objects.create(name="alpha", slug="alpha")
        for public_id, status, load_error in (("rc_loading", "loading", "the worker loading its items was lost"),
                                              ("rc_generating", "generating", "its prompts were queued again"),
                                              ("rc_failed", "failed", "could not read prefs v1"),
                                              ("rc_cancelled", "cancelled", "alpha-owner cancelled the generation"),
                                              ("rc_ready", "ready", "")):
            Campaign.objects.create(public_id=public_id, project=project, name=public_id, status=status,
                                    load_error=load_error)
        campaign = Campaign.objects.get(public_id="rc_ready")
        for name, status, error in (("writing", "writing", "the worker writing this export was lost"),
                                    ("failed", "failed", "no pair was left to write"), ("done", "done", "")):
            Export.objects.create(campaign=campaign, dataset_name=name, status=status, error=error)
    from webapp.review.models import Campaign as CurrentCampaign, Export as CurrentExport

    assert {public_id: (load_error, notice) for public_id, load_error, notice
            in CurrentCampaign.objects.values_list("public_id", "load_error", "notice")} == {
        "rc_loading": ("", "the worker loading its items was lost"),
        "rc_generating": ("", "its prompts were queued again"), "rc_failed": ("could not read prefs v1", ""),
        "rc_cancelled": ("alpha-owner cancelled the generation", ""), "rc_ready": ("", "")}
    assert {name: (error, notice) for name, error, notice
            in CurrentExport.objects.values_list("dataset_name", "error", "notice")} == {
        "writing": ("", "the worker writing this export was lost"), "failed": ("no pair was left to write", ""),
        "done": ("", "")}
    with migrated_back_to(before) as apps:
        assert dict(apps.get_model("review", "Campaign").objects.values_list("public_id", "load_error")) == {
            "rc_loading": "the worker loading its items was lost", "rc_generating": "its prompts were queued again",
            "rc_failed": "could not read prefs v1", "rc_cancelled": "alpha-owner cancelled the generation",
            "rc_ready": ""}
        assert dict(apps.get_model("review", "Export").objects.values_list("dataset_name", "error")) == {
            "writing": "the worker writing this export was lost", "failed": "no pair was left to write", "done": ""}


def test_complete_items_whose_edits_differ_become_conflicts():
    """The export took the latest of two reviewers' different edits of one response, a disagreement nobody saw:
    such complete items are conflicts for an owner to resolve; agreeing edits (once stripped) and a skip's edit are
    none."""
    with migrated_back_to(("review", "0020_conflict_reads")) as apps:
        Project = apps.get_model("projects", "Project")
        Campaign = apps.get_model("review", "Campaign")
        User = apps.get_model("auth", "User")
        project = Project.objects.create(name="Alpha", slug="alpha")
        campaign = Campaign.objects.create(project=project, name="pass 1")
        ann, bob = User.objects.create(username="ann"), User.objects.create(username="bob")
        cases = {1: ("x", "y", "a"), 2: ("x", "x\n", "a"), 3: ("x", "y", "skip"), 4: (None, "y", "a")}
        for sequence, (first, second, second_label) in cases.items():
            item = campaign.items.create(sequence=sequence, source="dataset", response_a="a", response_b="b",
                                         status="complete", resolved_label="a" if sequence == 1 else "")
            for user, text, label in ((ann, first, "a"), (bob, second, second_label)):
                item.reviews.create(campaign=campaign, reviewer=user, shown_first="a", choice="first", label=label,
                                    edited_b=text)
    from webapp.review.models import Item

    assert dict(Item.objects.values_list("sequence", "status")) == {
        1: "conflict", 2: "complete", 3: "complete", 4: "complete"}
