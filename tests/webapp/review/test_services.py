"""Review services: campaigns from a dataset version, the reviewer queue, reviews, conflicts,
resolution and export."""
import json
import threading

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection

from tests.webapp.factories import make_ready_version, make_user
from tests.webapp.review.conftest import (PREFERENCE_ROWS, answer, choice_for, create_loaded, expire_leases,
                                         in_conflict_with_a_second_owner)
from webapp.core.bidi import isolated
from webapp.datasets import services as dataset_services
from webapp.datasets.models import Dataset, VersionStatus
from webapp.projects import services as project_services
from webapp.projects.models import Role
from webapp.review import selectors, services
from webapp.runs import selectors as run_selectors
from webapp.review.models import (
    CampaignReviewer, CampaignStatus, ExportStatus, Item, ItemStatus, Label, Lease, Review,
)
from worker.tasks.datasets import validate_dataset_version


def test_a_campaign_gets_one_item_per_row_of_its_version(campaign):
    items = list(Item.objects.filter(campaign=campaign).order_by("sequence"))
    assert [item.sequence for item in items] == [1, 2, 3, 4]
    assert [item.source_row for item in items] == [1, 2, 3, 4]
    assert items[0].prompt == "What is 2+2?" and items[0].response_a == "4" and items[0].response_b == "5"
    assert items[2].response_a == [{"role": "assistant", "content": "Hi!"}]
    assert {item.original_label for item in items} == {"a"}
    assert {item.status for item in items} == {ItemStatus.PENDING}
    assert campaign.next_sequence == 5


def test_a_campaign_loads_its_items_in_the_worker(team, carol, preference_version, sent_tasks,
                                                  django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        campaign = services.campaign_create(project=team.project, name="later", guidelines="", required_reviews=1,
                                            reviewers=[carol], source_version=preference_version, user=team.owner)
    assert campaign.status == CampaignStatus.LOADING and not campaign.items.exists()
    assert sent_tasks == [(services.LOAD_TASK, [campaign.pk, 1], "default")]
    assert services.queue_next_item(campaign=campaign, user=carol) is None, "nothing is served while loading"
    campaign = services.campaign_load_items(campaign_id=campaign.pk)
    assert campaign.status == CampaignStatus.READY and campaign.items.count() == 4
    assert services.queue_next_item(campaign=campaign, user=carol).sequence == 1
    assert services.campaign_load_items(campaign_id=campaign.pk).items.count() == 4, "a redelivery changes nothing"


def test_queueing_the_load_again_while_it_runs_leaves_one_load_writing(team, carol, preference_version, monkeypatch,
                                                                      sent_tasks, django_capture_on_commit_callbacks):
    """'Queue the load again' is on the campaign page for as long as items load. Pressed while the load ran
    (demo-preference, 10,838 rows), both loads wrote items from sequence 1 and both died on the unique
    (campaign, sequence): the campaign stayed 'loading' for good with 4,000 of its items. A load now stops
    once a later one is asked for, and that one makes every item once."""
    with django_capture_on_commit_callbacks(execute=True):
        campaign = services.campaign_create(project=team.project, name="later", guidelines="", required_reviews=1,
                                            reviewers=[carol], source_version=preference_version, user=team.owner)
    monkeypatch.setattr(services, "ITEM_BATCH", 3)
    real_items_add = services.items_add

    def asked_again_after_one_batch(**kwargs):
        real_items_add(**kwargs)
        with django_capture_on_commit_callbacks(execute=True):
            services.campaign_load_request(campaign=campaign)  # the owner presses the button meanwhile

    monkeypatch.setattr(services, "items_add", asked_again_after_one_batch)
    first = services.campaign_load_items(campaign_id=campaign.pk, attempt=1)
    assert first.status == CampaignStatus.LOADING and first.items.count() == 3, "the first load stopped"
    assert sent_tasks[-1] == (services.LOAD_TASK, [campaign.pk, 2], "default")
    monkeypatch.setattr(services, "items_add", real_items_add)
    assert services.campaign_load_items(campaign_id=campaign.pk, attempt=1).items.count() == 3, "a stale one waits"
    campaign = services.campaign_load_items(campaign_id=campaign.pk, attempt=2)
    assert campaign.status == CampaignStatus.READY
    assert [item.sequence for item in campaign.items.order_by("sequence")] == [1, 2, 3, 4]


class _StillRunning(Exception):
    """Stands for a delivery that has started over and is still reading the file."""


def test_a_delivery_overtaken_by_a_redelivery_of_its_message_writes_nothing_more(
        team, carol, preference_version, monkeypatch):
    """One message delivered twice at once (the worker's broker connection dropped mid-load): the second
    delivery's start deleted the items the first had made, then the first marked the campaign ready, and
    the second, finding it no longer loading, stopped: 'ready' with 0 items (seen in CI). The earlier
    delivery now stops once a later one has claimed the load, and only the later one ends it."""
    campaign = services.campaign_create(project=team.project, name="twice", guidelines="", required_reviews=1,
                                        reviewers=[carol], source_version=preference_version, user=team.owner)
    monkeypatch.setattr(services, "ITEM_BATCH", 3)
    real_items_add, real_pairs = services.items_add, services._version_pairs

    def still_reading(version, *, read):
        raise _StillRunning
        yield  # a generator, as the real one

    def redelivered_after_the_first_batch(**kwargs):
        real_items_add(**kwargs)
        monkeypatch.setattr(services, "_version_pairs", still_reading)
        with pytest.raises(_StillRunning):
            services.campaign_load_items(campaign_id=campaign.pk, attempt=1)  # the same message, again
        monkeypatch.setattr(services, "_version_pairs", real_pairs)

    monkeypatch.setattr(services, "items_add", redelivered_after_the_first_batch)
    first = services.campaign_load_items(campaign_id=campaign.pk, attempt=1)
    assert first.status == CampaignStatus.LOADING, "the overtaken delivery does not end the load"
    assert not first.items.exists(), "it wrote no batch after the later delivery started over"
    monkeypatch.setattr(services, "items_add", real_items_add)
    campaign = services.campaign_load_items(campaign_id=campaign.pk, attempt=1)  # the later one, to the end
    assert campaign.status == CampaignStatus.READY
    assert [item.sequence for item in campaign.items.order_by("sequence")] == [1, 2, 3, 4]


def test_a_load_that_died_half_way_starts_over(team, carol, preference_version, monkeypatch):
    campaign = services.campaign_create(project=team.project, name="later", guidelines="", required_reviews=1,
                                        reviewers=[carol], source_version=preference_version, user=team.owner)
    monkeypatch.setattr(services, "ITEM_BATCH", 3)
    real_items_add = services.items_add

    batches = []

    def dies_after_one_batch(**kwargs):
        if batches:
            raise KeyboardInterrupt  # the worker process killed mid-load, its first batch committed
        batches.append(real_items_add(**kwargs))

    monkeypatch.setattr(services, "items_add", dies_after_one_batch)
    with pytest.raises(KeyboardInterrupt):
        services.campaign_load_items(campaign_id=campaign.pk)
    assert campaign.items.count() == 3
    monkeypatch.setattr(services, "items_add", real_items_add)
    campaign = services.campaign_load_items(campaign_id=campaign.pk)
    assert [item.sequence for item in campaign.items.order_by("sequence")] == [1, 2, 3, 4]
    assert campaign.next_sequence == 5


def test_a_version_gone_from_storage_fails_the_campaign(team, carol, preference_version):
    preference_version.absolute_path.unlink()
    campaign = create_loaded(project=team.project, name="gone", guidelines="", required_reviews=1,
                             reviewers=[carol], source_version=preference_version, user=team.owner)
    assert campaign.status == CampaignStatus.FAILED
    assert campaign.load_error.startswith("could not read prefs v1: ")


def test_it_rejects_a_version_that_is_not_preference_or_not_ready(team, carol):
    sft = make_ready_version(team.project, name="chats", kind="sft")
    with pytest.raises(ValidationError, match="sft dataset; review campaigns need a preference dataset"):
        services.campaign_create(project=team.project, name="x", guidelines="", required_reviews=1,
                                 reviewers=[carol], source_version=sft, user=team.owner)
    waiting = make_ready_version(team.project, name="p", kind="preference", rows=PREFERENCE_ROWS)
    waiting.status = VersionStatus.VALIDATING
    waiting.save()
    with pytest.raises(ValidationError, match="is being checked; wait until it is ready"):
        services.campaign_create(project=team.project, name="x", guidelines="", required_reviews=1,
                                 reviewers=[carol], source_version=waiting, user=team.owner)
    # "is failed; wait until it is ready": a failed version never is.
    waiting.status = VersionStatus.FAILED
    waiting.save()
    with pytest.raises(ValidationError, match="failed its check; choose a ready version, or fix the file and upload "
                                              "it again"):
        services.campaign_create(project=team.project, name="x", guidelines="", required_reviews=1,
                                 reviewers=[carol], source_version=waiting, user=team.owner)


def test_it_rejects_viewers_and_outsiders_as_reviewers(team, preference_version):
    for user in (team.viewer, team.outsider):
        with pytest.raises(ValidationError, match=f"{user.username} cannot review"):
            services.campaign_create(project=team.project, name="x", guidelines="", required_reviews=1,
                                     reviewers=[user], source_version=preference_version, user=team.owner)


def test_it_rejects_a_required_review_count_out_of_range(team, carol, preference_version):
    with pytest.raises(ValidationError, match="reviews per item must be 1 to 10, got 0"):
        services.campaign_create(project=team.project, name="x", guidelines="", required_reviews=0,
                                 reviewers=[carol], source_version=preference_version, user=team.owner)


def test_arena_and_run_pairs_are_appended_by_item_add(campaign):
    item = services.item_add(campaign=campaign, prompt="Hi", response_a="Hello", response_b="Hey",
                             source="arena", metadata={"models": ["run_a", "run_b"], "voter": "ann"},
                             original_label="b")
    assert (item.sequence, item.source, item.original_label) == (5, "arena", "b")
    assert item.metadata == {"models": ["run_a", "run_b"], "voter": "ann"}
    with pytest.raises(ValidationError, match="source 'chat' is not one of dataset, arena, runs"):
        services.item_add(campaign=campaign, prompt="Hi", response_a="a", response_b="b", source="chat")


def drain(campaign, user, label="a"):
    """Review everything the queue gives ``user``; returns the sequences in the order served."""
    served = []
    while (item := services.queue_next_item(campaign=campaign, user=user)) is not None:
        served.append(item.sequence)
        assert len(served) <= 10, "the queue served an item twice"
        answer(item, user, label)
    return served


def test_the_queue_serves_every_item_once_and_never_repeats(campaign, team, carol):
    assert drain(campaign, team.teammate) == [1, 2, 3, 4]
    assert drain(campaign, carol, "b") == [1, 2, 3, 4]
    assert services.queue_next_item(campaign=campaign, user=carol) is None
    assert Review.objects.filter(campaign=campaign).count() == 8
    assert set(Item.objects.filter(campaign=campaign).values_list("status", flat=True)) == {ItemStatus.CONFLICT}


def test_a_skip_is_never_served_again_and_does_not_count(campaign, team):
    item = services.queue_next_item(campaign=campaign, user=team.teammate)
    services.review_submit(item=item, user=team.teammate, choice="skip")
    item.refresh_from_db()
    assert item.review_count == 0 and item.status == ItemStatus.PENDING
    assert services.queue_next_item(campaign=campaign, user=team.teammate).sequence == 2


def test_reviewers_working_at_once_get_different_items(team, carol, preference_version):
    campaign = create_loaded(project=team.project, name="single", guidelines="", required_reviews=1,
                                        reviewers=[team.teammate, carol], source_version=preference_version,
                                        user=team.owner)
    first = services.queue_next_item(campaign=campaign, user=team.teammate)
    second = services.queue_next_item(campaign=campaign, user=carol)
    assert (first.sequence, second.sequence) == (1, 2)
    assert services.queue_next_item(campaign=campaign, user=team.teammate).sequence == 1, "a reload keeps the item"
    answer(second, carol, "a")
    assert services.queue_next_item(campaign=campaign, user=carol).sequence == 3
    answer(first, team.teammate, "a")
    assert services.queue_next_item(campaign=campaign, user=team.teammate).sequence == 4


def test_an_item_leased_to_another_is_shared_only_while_it_has_room(team, carol, preference_version):
    one_row = make_ready_version(team.project, name="one", kind="preference", rows=PREFERENCE_ROWS[:1])
    for required, carol_gets in ((1, None), (2, 1)):
        campaign = create_loaded(project=team.project, name=f"needs {required}", guidelines="",
                                            required_reviews=required, reviewers=[team.teammate, carol],
                                            source_version=one_row, user=team.owner)
        assert services.queue_next_item(campaign=campaign, user=team.teammate).sequence == 1
        served = services.queue_next_item(campaign=campaign, user=carol)
        assert (served.sequence if served else None) == carol_gets


def more_reviewers(team, *names):
    users = [make_user(name) for name in names]
    for user in users:
        project_services.membership_add(project=team.project, user=user, role=Role.MEMBER)
    return users


def test_an_item_is_handed_to_no_more_reviewers_than_it_still_needs(team, carol, preference_version):
    """QA: an item leased to one reviewer was shared, while it had room, with every reviewer who asked: an
    item needing 3 answers went to 4 reviewers at once. Answers and live leases together never pass the
    answers needed; a lease that runs out frees its place."""
    dave, erin = more_reviewers(team, "dave", "erin")
    one_row = make_ready_version(team.project, name="one", kind="preference", rows=PREFERENCE_ROWS[:1])
    campaign = create_loaded(project=team.project, name="needs 3", guidelines="", required_reviews=3,
                             reviewers=[team.teammate, carol, dave, erin], source_version=one_row, user=team.owner)
    for reviewer in (team.teammate, carol, dave):
        assert services.queue_next_item(campaign=campaign, user=reviewer).sequence == 1
    assert services.queue_next_item(campaign=campaign, user=erin) is None
    assert services.queue_next_item(campaign=campaign, user=carol).sequence == 1, "a reload keeps the item"
    item = Item.objects.get(campaign=campaign)
    answer(item, team.teammate, "a")
    assert services.queue_next_item(campaign=campaign, user=erin) is None, "carol and dave hold the places left"
    expire_leases(item, dave)
    assert services.queue_next_item(campaign=campaign, user=erin).sequence == 1, "a lease run out frees its place"
    assert services.queue_next_item(campaign=campaign, user=dave) is None, "and its holder must ask again"
    services.review_submit(item=item, user=carol, choice="skip")
    assert services.queue_next_item(campaign=campaign, user=dave).sequence == 1, "a skip gives its place back"
    assert Lease.objects.filter(item=item).count() == 2


def test_two_reviewers_asking_at_once_for_the_last_place_get_it_once(transactional_db, team, carol,
                                                                     preference_version):
    """QA: two requests at once could both lease an item with one place left. The database decides: the
    item's row is locked while its live leases are counted (SQLite takes its write lock when the
    transaction begins; PostgreSQL: ``tests/postgres/test_review_postgres.py``)."""
    dave, = more_reviewers(team, "dave")
    rows = 12
    version = make_ready_version(team.project, name="many", kind="preference", rows=PREFERENCE_ROWS * (rows // 4))
    campaign = create_loaded(project=team.project, name="needs 2", guidelines="", required_reviews=2,
                             reviewers=[team.teammate, carol, dave], source_version=version, user=team.owner)
    for item in Item.objects.filter(campaign=campaign):
        answer(item, dave, "a")
    served, errors, barrier = [], [], threading.Barrier(2, timeout=30)

    def ask(user):
        try:
            for _ in range(rows):
                barrier.wait()
                item = services.queue_next_item(campaign=campaign, user=user)
                served.append(item.sequence if item else None)
                barrier.wait()  # both have asked before either answers
                if item is not None:
                    answer(item, user, "a")
        except Exception as error:  # noqa: BLE001  (reported below; the other thread must not wait on it)
            errors.append(error)
            barrier.abort()
        finally:
            connection.close()

    threads = [threading.Thread(target=ask, args=(user,)) for user in (team.teammate, carol)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not [error for error in errors if not isinstance(error, threading.BrokenBarrierError)], errors
    handed = [sequence for sequence in served if sequence is not None]
    assert sorted(handed) == list(range(1, rows + 1)), "each item was handed to one of the two, once"
    assert set(Item.objects.filter(campaign=campaign).values_list("review_count", flat=True)) == {2}


def test_it_rejects_an_answer_to_an_item_that_got_its_reviews_while_the_page_was_open(team, carol,
                                                                                      preference_version):
    one_row = make_ready_version(team.project, name="one", kind="preference", rows=PREFERENCE_ROWS[:1])
    campaign = create_loaded(project=team.project, name="single", guidelines="", required_reviews=1,
                             reviewers=[team.teammate, carol], source_version=one_row, user=team.owner)
    item = services.queue_next_item(campaign=campaign, user=team.teammate)
    expire_leases(item)
    answer(services.queue_next_item(campaign=campaign, user=carol), carol, "a")
    with pytest.raises(ValidationError, match="already has the 1 review it needs"):
        answer(item, team.teammate, "b")
    item.refresh_from_db()
    assert (item.status, item.review_count) == (ItemStatus.COMPLETE, 1), "a late answer must not make a conflict"
    assert not Review.objects.filter(item=item, reviewer=team.teammate).exists()


def test_the_cursor_moves_past_finished_items_and_resets_when_more_reviews_are_needed(team, carol,
                                                                                       preference_version):
    campaign = create_loaded(project=team.project, name="single", guidelines="", required_reviews=1,
                                        reviewers=[team.teammate, carol], source_version=preference_version,
                                        user=team.owner)
    for _ in range(3):
        answer(services.queue_next_item(campaign=campaign, user=carol), carol, "a")
    assert services.queue_next_item(campaign=campaign, user=team.teammate).sequence == 4
    assert CampaignReviewer.objects.get(campaign=campaign, user=team.teammate).cursor == 3
    campaign = services.campaign_update(campaign=campaign, guidelines="", required_reviews=2,
                                        reviewers=[team.teammate, carol]).campaign
    assert CampaignReviewer.objects.get(campaign=campaign, user=team.teammate).cursor == 0
    assert Item.objects.get(campaign=campaign, sequence=1).status == ItemStatus.IN_REVIEW
    assert services.queue_next_item(campaign=campaign, user=team.teammate).sequence == 1


def test_only_reviewers_get_a_queue_or_review(campaign, team):
    item = Item.objects.get(campaign=campaign, sequence=1)
    with pytest.raises(PermissionDenied, match="not a reviewer"):
        services.queue_next_item(campaign=campaign, user=team.owner)
    with pytest.raises(PermissionDenied, match="not a reviewer"):
        services.review_submit(item=item, user=team.owner, choice="first")


def test_a_review_stores_the_order_shown_and_the_answer_in_item_terms(campaign, team):
    item = Item.objects.get(campaign=campaign, sequence=1)
    shown_first = services.shown_first_for(item_public_id=item.public_id, user_id=team.teammate.pk)
    review = services.review_submit(item=item, user=team.teammate, choice="second", comment="  close call ")
    assert review.shown_first == shown_first
    assert review.label == ("b" if shown_first == "a" else "a")
    assert review.comment == "close call"
    with pytest.raises(ValidationError, match="already reviewed this item"):
        services.review_submit(item=item, user=team.teammate, choice="first")


def test_the_order_shown_is_random_across_reviewers_and_items_but_fixed_per_pair():
    draws = [services.shown_first_for(item_public_id=f"ri_{index}", user_id=user)
             for index in range(200) for user in (1, 2)]
    assert 160 < draws.count("a") < 240  # a fair coin: 400 draws, mean 200, sd 10
    assert services.shown_first_for(item_public_id="ri_7", user_id=1) == services.shown_first_for(
        item_public_id="ri_7", user_id=1)


def test_an_edit_is_kept_as_a_new_text(campaign, team):
    item = Item.objects.get(campaign=campaign, sequence=3)  # chat responses: the last turn is edited
    shown_first = services.shown_first_for(item_public_id=item.public_id, user_id=team.teammate.pk)
    review = services.review_submit(item=item, user=team.teammate, choice="first", edited_first="Hello there!",
                                    edited_second="No." if shown_first == "a" else "Hi!")
    assert (review.edited_a, review.edited_b) == (("Hello there!", None) if shown_first == "a"
                                                  else (None, "Hello there!"))
    item.refresh_from_db()
    assert item.response_a == [{"role": "assistant", "content": "Hi!"}], "the original is never overwritten"


@pytest.mark.parametrize("sequence", [1, 3])  # a plain response; a chat's last turn
def test_it_rejects_an_edit_that_blanks_a_response(campaign, team, sequence):
    """QA: an edit that left a response empty or only whitespace was stored (and the item then left out of
    the export); it is refused, naming the response, and nothing of the answer is kept."""
    item = Item.objects.get(campaign=campaign, sequence=sequence)
    for edits, fields in (({"edited_first": "  \r\n\t"}, {"edited_first"}),
                          ({"edited_second": ""}, {"edited_second"}),
                          ({"edited_first": "", "edited_second": " "}, {"edited_first", "edited_second"})):
        with pytest.raises(ValidationError) as refused:
            services.review_submit(item=item, user=team.teammate, choice="first", comment="kept?", **edits)
        assert set(refused.value.message_dict) == fields
        for field in fields:
            shown = "first" if field == "edited_first" else "second"
            assert refused.value.message_dict[field] == [
                f"your edit leaves the {shown} response empty: type the text it should have, or put its "
                "original text back to leave it unedited"]
    assert not Review.objects.exists()
    item.refresh_from_db()
    assert (item.status, item.review_count) == (ItemStatus.PENDING, 0)


@pytest.mark.parametrize(("labels", "required", "status"), [
    ([], 2, ItemStatus.PENDING),
    (["a"], 2, ItemStatus.IN_REVIEW),
    (["a", "a"], 2, ItemStatus.COMPLETE),
    (["a", "b"], 2, ItemStatus.CONFLICT),
    (["a", "tie"], 2, ItemStatus.CONFLICT),  # no majority
    (["a", "a", "tie"], 3, ItemStatus.COMPLETE),
    (["a", "a", "b"], 3, ItemStatus.CONFLICT),  # opposite decisive answers always need the owner
    (["tie"], 1, ItemStatus.COMPLETE),
])
def test_item_status_rules(labels, required, status):
    assert services.item_status(labels, required=required, resolved_label="") == status


def test_reviewers_disagreeing_make_a_conflict_the_owner_resolves(campaign, team, carol):
    item = Item.objects.get(campaign=campaign, sequence=2)
    answer(item, team.teammate, "a")
    item.refresh_from_db()
    assert item.status == ItemStatus.IN_REVIEW
    answer(item, carol, "b")
    item.refresh_from_db()
    assert item.status == ItemStatus.CONFLICT
    assert list(selectors.conflict_list(campaign=campaign)) == [item]
    services.conflict_resolve(item=item, label=Label.B, user=team.owner)
    item.refresh_from_db()
    assert (item.status, item.resolved_label, item.resolved_by) == (ItemStatus.COMPLETE, "b", team.owner)
    assert list(selectors.conflict_list(campaign=campaign)) == []


def test_a_resolution_stays_final_when_more_reviews_are_asked_for(campaign, team, carol):
    """Raising Reviews per item from 2 to 3 put an owner-resolved item back 'in review' with no final label
    (and lowering it again brought the label back)."""
    resolved, open_conflict = (Item.objects.get(campaign=campaign, sequence=sequence) for sequence in (2, 3))
    for item in (resolved, open_conflict):
        answer(item, team.teammate, "a")
        answer(item, carol, "b")
    services.conflict_resolve(item=resolved, label=Label.A, user=team.owner)
    services.campaign_update(campaign=campaign, guidelines="", required_reviews=3, reviewers=[team.teammate, carol])
    resolved.refresh_from_db()
    open_conflict.refresh_from_db()
    assert (resolved.status, resolved.resolved_label) == (ItemStatus.COMPLETE, "a")
    assert open_conflict.status == ItemStatus.IN_REVIEW  # a third review may settle it
    assert services.item_status(["a", "b"], required=3, resolved_label="a") == ItemStatus.COMPLETE


def test_an_answer_to_a_conflict_read_on_the_conflicts_page_is_refused(campaign, team, carol):
    """The queue serves no reviewer a conflict sent back to review whose answers they read on the conflicts page; an
    answer sent all the same (a reviewing page open from before, a hand-made request) was recorded, the deciding
    review of someone who had read the others. It is refused, nothing recorded."""
    owner_reviewer = team.owner
    services.campaign_update(campaign=campaign, guidelines="", required_reviews=2,
                             reviewers=[team.teammate, carol, owner_reviewer])
    item = Item.objects.get(campaign=campaign, sequence=2)
    answer(item, team.teammate, "a")
    answer(item, carol, "b")
    services.conflicts_read(items=[item], user=owner_reviewer)
    campaign = services.campaign_update(campaign=campaign, guidelines="", required_reviews=3,
                                        reviewers=[team.teammate, carol, owner_reviewer]).campaign
    item.refresh_from_db()
    assert item.status == ItemStatus.IN_REVIEW
    with pytest.raises(ValidationError, match="you read the answers to item 2 on the conflicts page"):
        answer(item, owner_reviewer, "a")
    assert not Review.objects.filter(item=item, reviewer=owner_reviewer).exists()


def test_a_skip_is_not_counted_as_an_answer(campaign, team):
    """'You answered 12 items' counted the one the reviewer skipped."""
    first, second = (Item.objects.get(campaign=campaign, sequence=sequence) for sequence in (1, 2))
    answer(first, team.teammate, "a")
    answer(second, team.teammate, "skip")
    assert selectors.reviewer_done(campaign=campaign, user=team.teammate) == selectors.ReviewerTally(answered=1,
                                                                                                     skipped=1)


def test_a_reviewer_who_left_the_project_is_not_listed(campaign, team, carol):
    """The campaign page still named a reviewer removed from the project; its Settings form did not."""
    from webapp.projects import services as project_services
    from webapp.projects.models import Membership

    assert selectors.reviewer_names(campaign=campaign) == ["alpha-teammate", "carol"]
    project_services.membership_remove(membership=Membership.objects.get(project=team.project, user=carol))
    assert selectors.reviewer_names(campaign=campaign) == ["alpha-teammate"]
    project_services.membership_set_role(membership=Membership.objects.get(project=team.project, user=team.teammate),
                                         role="viewer")
    assert selectors.reviewer_names(campaign=campaign) == []


def test_a_member_made_a_viewer_leaves_its_campaigns_and_is_not_put_back_when_promoted(campaign, team, carol):
    """QA: a reviewer made a viewer kept their reviewer rows (only hidden), so promoting them back to member
    made them a reviewer again unasked. A viewer cannot review: the demotion takes them off, as removal does."""
    from webapp.projects import services as project_services
    from webapp.projects.models import Membership, Role

    held = services.queue_next_item(campaign=campaign, user=carol)
    membership = Membership.objects.get(project=team.project, user=carol)
    project_services.membership_set_role(membership=membership, role=Role.VIEWER)
    assert not CampaignReviewer.objects.filter(campaign=campaign, user=carol).exists()
    held.refresh_from_db()
    assert not Lease.objects.filter(item=held).exists()
    project_services.membership_set_role(membership=membership, role=Role.MEMBER)
    assert not selectors.is_reviewer(campaign=campaign, user=carol)
    assert selectors.reviewer_names(campaign=campaign) == ["alpha-teammate"]
    project_services.membership_set_role(membership=Membership.objects.get(project=team.project, user=team.teammate),
                                         role=Role.OWNER)  # another change of role leaves reviewers be
    assert selectors.is_reviewer(campaign=campaign, user=team.teammate)


def test_a_member_removed_from_the_project_leaves_its_campaigns_and_is_not_put_back(campaign, team, carol):
    """QA: a reviewer removed from the project and later added again was silently a reviewer of their
    campaigns again. Removal takes them off the reviewers of every campaign of the project (their answers
    stay and count; the item they held goes back to the queue at once); being added again puts them on
    none, and an owner ticks them again where they should review."""
    from django.utils import timezone

    from webapp.projects import services as project_services
    from webapp.projects.models import Membership, Role

    elsewhere = project_services.project_create(name="Elsewhere", slug="elsewhere", owner=carol)
    their_own = services.campaign_create(project=elsewhere, name="theirs", guidelines="", required_reviews=1,
                                         reviewers=[carol], source_version=None, user=carol)
    arena = services.campaign_create(project=team.project, name="arena", guidelines="", required_reviews=1,
                                     reviewers=[carol], source_version=None, user=team.owner)
    first = Item.objects.get(campaign=campaign, sequence=1)
    answer(first, team.teammate, "a")
    answer(first, carol, "a")
    held = services.queue_next_item(campaign=campaign, user=carol)
    assert list(Lease.objects.filter(item=held).values_list("reviewer", flat=True)) == [carol.pk]

    project_services.membership_remove(membership=Membership.objects.get(project=team.project, user=carol))
    assert set(CampaignReviewer.objects.filter(user=carol).values_list("campaign__name", flat=True)) == {"theirs"}
    first.refresh_from_db()
    assert first.status == ItemStatus.COMPLETE and Review.objects.filter(reviewer=carol).count() == 1
    assert selectors.campaign_agreement(campaign=campaign).items_rated_twice == 1
    held.refresh_from_db()
    assert not Lease.objects.filter(item=held).exists()

    project_services.membership_add(project=team.project, user=carol, role=Role.MEMBER)
    for each in (campaign, arena):
        assert not selectors.is_reviewer(campaign=each, user=carol)
        with pytest.raises(PermissionDenied):
            services.queue_next_item(campaign=each, user=carol)
    assert selectors.reviewer_names(campaign=campaign) == ["alpha-teammate"]
    assert selectors.is_reviewer(campaign=their_own, user=carol)
    services.campaign_update(campaign=campaign, guidelines="", required_reviews=2, reviewers=[team.teammate, carol])
    assert services.queue_next_item(campaign=campaign, user=carol).sequence == held.sequence
    assert timezone.now() < Lease.objects.get(item=held, reviewer=carol).until


def test_a_reviewer_unticked_in_settings_gives_back_the_item_they_held(team, carol, preference_version):
    """QA: unticking a reviewer in Settings left their lease: the item they were shown stayed held for up to
    ten minutes by someone who could no longer answer it, and the reviewers left were told "held by another
    reviewer" and to come back later. Unticked, they hold nothing (as when they leave the project)."""
    one_row = make_ready_version(team.project, name="one", kind="preference", rows=PREFERENCE_ROWS[:1])
    campaign = create_loaded(project=team.project, name="needs 1", guidelines="", required_reviews=1,
                             reviewers=[team.teammate, carol], source_version=one_row, user=team.owner)
    assert services.queue_next_item(campaign=campaign, user=carol).sequence == 1
    assert services.queue_next_item(campaign=campaign, user=team.teammate) is None, "carol holds its only place"

    services.campaign_update(campaign=campaign, guidelines="", required_reviews=1, reviewers=[team.teammate])
    assert not Lease.objects.filter(campaign=campaign, reviewer=carol).exists()
    assert selectors.items_held_by_others(campaign=campaign, user=team.teammate) is None
    assert services.queue_next_item(campaign=campaign, user=team.teammate).sequence == 1


def test_only_conflicts_are_resolved(campaign, team):
    item = Item.objects.get(campaign=campaign, sequence=1)
    with pytest.raises(ValidationError, match="item 1 is not in conflict: it is pending, for 2 answers"):
        services.conflict_resolve(item=item, label="a", user=team.owner)


def test_the_agreement_figures_follow_new_reviews(campaign, team, carol):
    item = Item.objects.get(campaign=campaign, sequence=1)
    answer(item, team.teammate, "a")
    assert selectors.campaign_agreement(campaign=campaign).reviews == 1
    assert selectors.campaign_agreement(campaign=campaign).pairs == ()
    answer(item, carol, "b")
    report = selectors.campaign_agreement(campaign=campaign)
    assert report.reviews == 2 and report.pairs[0].agreement == 0.0


def test_the_agreement_figures_follow_a_changed_answer(campaign, team, carol):
    """QA: a reviewer who changed an answer ("Your last answer … Change it to") changed the item's status,
    but the campaign page kept the agreement figures of the answer as first given for a day: the report was
    cached under the count and the last id of the reviews, which a change leaves as they were."""
    item = Item.objects.get(campaign=campaign, sequence=1)
    answer(item, team.teammate, "a")
    answer(item, carol, "b")
    assert selectors.campaign_agreement(campaign=campaign).pairs[0].agreement == 0.0
    services.review_change(item=item, user=carol, choice=choice_for(item, carol, "a"))
    campaign.refresh_from_db()
    assert selectors.campaign_agreement(campaign=campaign).pairs[0].agreement == 1.0
    services.review_change(item=item, user=carol, choice="skip")
    campaign.refresh_from_db()
    report = selectors.campaign_agreement(campaign=campaign)
    assert report.reviews == 1 and report.pairs == ()


def review_all(campaign, team, carol):
    """Item 1 both a; item 2 a vs b (conflict, owner says b); item 3 both tie; item 4 both a with
    the teammate's edit of response a."""
    items = {item.sequence: item for item in Item.objects.filter(campaign=campaign)}
    for reviewer in (team.teammate, carol):
        answer(items[1], reviewer, "a")
        answer(items[3], reviewer, "tie")
    answer(items[2], team.teammate, "a")
    answer(items[2], carol, "b")
    shown_first = services.shown_first_for(item_public_id=items[4].public_id, user_id=team.teammate.pk)
    edit = {"edited_first": "c-a-t (three letters)"} if shown_first == "a" else {
        "edited_second": "c-a-t (three letters)"}
    answer(items[4], team.teammate, "a", **edit)
    answer(items[4], carol, "a")
    return items


def export_now(campaign, user, **options):
    """``export_create`` and then the worker's ``export_write``."""
    export = services.export_create(campaign=campaign, user=user, options=services.ExportOptions(**options))
    return services.export_write(export_id=export.pk)


def exported_rows(export):
    return [json.loads(line) for line in export.version.absolute_path.read_text().splitlines()]


def test_export_writes_a_preference_version_that_validates(campaign, team, carol, sent_tasks,
                                                          django_capture_on_commit_callbacks):
    sent_tasks.clear()
    items = review_all(campaign, team, carol)
    services.conflict_resolve(item=items[2], label="b", user=team.owner)
    with django_capture_on_commit_callbacks(execute=True):
        export = services.export_create(campaign=campaign, user=team.owner,
                                        options=services.ExportOptions(dataset_name="prefs reviewed"))
    assert export.status == ExportStatus.WRITING and export.version is None
    assert sent_tasks == [(services.EXPORT_TASK, [export.pk], "default")]
    sent_tasks.clear()
    with django_capture_on_commit_callbacks(execute=True):
        export = services.export_write(export_id=export.pk)
    assert export.status == ExportStatus.VALIDATING
    assert services.export_write(export_id=export.pk).version == export.version, "a redelivery changes nothing"
    rows = exported_rows(export)
    assert [(row["prompt"], row["chosen"], row["rejected"]) for row in rows] == [
        ("What is 2+2?", "4", "5"),
        ("Capital of France?", "Lyon", "Paris"),  # the owner's b
        ("Spell cat", "c-a-t (three letters)", "k-a-t"),  # the edit applied
    ]
    assert rows[1]["review"] == {"campaign": campaign.public_id, "item": items[2].public_id, "label": "b",
                                 "resolved": True, "source": "dataset", "source_row": 2}
    assert export.counts == {"written": 3, "tie": 1, "both_bad": 0, "no_majority": 0, "empty_response": 0,
                             "identical": 0, "unresolved_conflict": 0, "not_complete": 0}
    assert export.reviewers == ["alpha-teammate", "carol"]
    assert export.agreement["pairs"][0]["items"] == 4 and export.agreement["fleiss_raters"] == 2
    assert export.options == {"drop_ties": True, "drop_both_bad": True, "apply_edits": True}
    version = export.version
    assert version.dataset.kind == "preference" and version.dataset.name == "prefs reviewed"
    assert version.status == VersionStatus.UPLOADED
    assert sent_tasks == [(dataset_services.VALIDATE_TASK, [version.pk], "default")]
    validate_dataset_version.apply(args=[version.pk]).get()
    version.refresh_from_db()
    assert version.status == VersionStatus.READY and version.row_count == 3
    export.refresh_from_db()
    assert export.status == ExportStatus.DONE
    # ...and the DPO / reward launch form offers it.
    offered = dict(run_selectors.dataset_choices(project=team.project, kinds=("preference",)))
    assert offered[version.public_id] == f"{isolated('prefs reviewed')} v1 (preference, 3 rows)"


def test_export_keeps_ties_and_originals_when_asked_and_adds_versions_to_the_same_dataset(campaign, team, carol):
    review_all(campaign, team, carol)
    first = export_now(campaign, team.owner, dataset_name="prefs reviewed")
    second = export_now(campaign, team.owner, dataset_name="prefs reviewed", drop_ties=False, apply_edits=False)
    rows = exported_rows(second)
    assert [(row["chosen"], row["review"]["label"]) for row in rows] == [
        ("4", "a"), ([{"role": "assistant", "content": "Hi!"}], "tie"), ("c-a-t", "a")]
    assert second.counts["unresolved_conflict"] == 1 and second.counts["written"] == 3
    assert (first.version.dataset_id, first.version.number, second.version.number) == (
        second.version.dataset_id, 1, 2)


def test_export_refuses_a_campaign_with_nothing_complete_and_a_dataset_of_another_kind(campaign, team):
    with pytest.raises(ValidationError, match="no item is complete yet"):
        services.export_create(campaign=campaign, options=services.ExportOptions(dataset_name="out"), user=team.owner)
    make_ready_version(team.project, name="chats", kind="sft")
    item = Item.objects.get(campaign=campaign, sequence=1)
    for reviewer in campaign.reviewers.all():
        answer(item, reviewer, "a")
    with pytest.raises(ValidationError, match="'chats' is an sft dataset"):
        services.export_create(campaign=campaign, options=services.ExportOptions(dataset_name="chats"),
                               user=team.owner)
    # A name the dataset could not take is refused here, keyed by the form's field, not by the worker later.
    for bad, reason in (("x" * 101, "at most 100"), ("pairs\u200b", "invisible character")):
        with pytest.raises(ValidationError, match=reason) as refused:
            services.export_create(campaign=campaign, options=services.ExportOptions(dataset_name=bad), user=team.owner)
        assert list(refused.value.message_dict) == ["dataset_name"]
    assert not campaign.exports.exists()


def test_an_export_with_no_pair_left_fails_and_says_why(campaign, team):
    item = Item.objects.get(campaign=campaign, sequence=1)
    for reviewer in campaign.reviewers.all():
        answer(item, reviewer, "tie")
    export = export_now(campaign, team.owner, dataset_name="out")
    assert export.status == ExportStatus.FAILED and export.version is None
    assert export.error.startswith("no pair was left to write: every complete item is a tie")
    assert export.counts["tie"] == 1
    assert not Dataset.objects.filter(name="out").exists()


def test_choice_for_helper_matches_the_service_mapping(campaign, team):
    item = Item.objects.get(campaign=campaign, sequence=1)
    shown_first = services.shown_first_for(item_public_id=item.public_id, user_id=team.teammate.pk)
    assert services.label_for_choice(choice_for(item, team.teammate, "b"), shown_first=shown_first) == "b"


def test_an_export_is_done_only_once_its_version_validates(campaign, team, carol):
    """QA: the Exports table said 'prefs reviewed v1' and its pairs, status done, while the version it linked
    had failed validation. An export waits for its version's check and takes its outcome."""
    review_all(campaign, team, carol)
    good = export_now(campaign, team.owner, dataset_name="prefs reviewed")
    assert good.status == ExportStatus.VALIDATING and good.version is not None
    validate_dataset_version.apply(args=[good.version.pk]).get()
    good.refresh_from_db()
    assert (good.status, good.error) == (ExportStatus.DONE, "")

    bad = export_now(campaign, team.owner, dataset_name="prefs reviewed")
    bad.version.absolute_path.write_text('{"prompt": "2+2?", "chosen": "4", "rejected": "  "}\n{"prompt": 1}\n')
    validate_dataset_version.apply(args=[bad.version.pk]).get()
    bad.refresh_from_db()
    assert bad.status == ExportStatus.FAILED
    assert bad.error == ("prefs reviewed v2 failed validation: line 1, row 1, field 'rejected': is an empty string; "
                         "give it text or drop the row (and 3 more problems); its page lists them")
    validate_dataset_version.apply(args=[bad.version.pk]).get()  # a redelivery changes nothing
    bad.refresh_from_db()
    assert bad.status == ExportStatus.FAILED


def test_a_campaign_whose_version_is_deleted_before_it_loads_fails_and_names_it(team, carol, preference_version):
    """The load read the version it no longer had and died, leaving the campaign 'loading' for good."""
    campaign = services.campaign_create(project=team.project, name="later", guidelines="", required_reviews=1,
                                        reviewers=[carol], source_version=preference_version, user=team.owner)
    preference_version.delete()
    campaign = services.campaign_load_items(campaign_id=campaign.pk)
    assert campaign.status == CampaignStatus.FAILED
    assert campaign.load_error == "the dataset version prefs v1 was deleted before its items were loaded"


def test_a_resolution_made_meanwhile_is_not_overwritten_silently(campaign, team, carol):
    """QA: two owners resolving the same conflict at once (or one from an older tab) were both told their label
    stood; the later one silently replaced the earlier. A resolution says which one it was chosen over."""
    item, alice = in_conflict_with_a_second_owner(campaign, team, carol, username="alice")
    services.conflict_resolve(item=item, label="a", user=alice, shown_label="")
    with pytest.raises(services.AlreadyResolved, match="item 2 is already resolved as A better by alice") as raised:
        services.conflict_resolve(item=item, label="b", user=team.owner, shown_label="")
    assert (raised.value.label, raised.value.resolved_by) == ("a", "alice")
    item.refresh_from_db()
    assert (item.resolved_label, item.resolved_by) == ("a", alice), "the earlier resolution stands"
    # The same label chosen meanwhile: nothing to change, nothing to confirm.
    assert services.conflict_resolve(item=item, label="a", user=team.owner, shown_label="").resolved_by == alice
    # Confirmed over the resolution now shown, it changes.
    item = services.conflict_resolve(item=item, label="b", user=team.owner, shown_label="a")
    assert (item.resolved_label, item.resolved_by) == ("b", team.owner)


def test_a_resolution_by_a_deleted_account_is_named_as_such(campaign, team, carol):
    item, gone = in_conflict_with_a_second_owner(campaign, team, carol, username="gone")
    services.conflict_resolve(item=item, label="tie", user=gone, shown_label="")
    gone.delete()
    with pytest.raises(services.AlreadyResolved, match="already resolved as Tie by an account since deleted"):
        services.conflict_resolve(item=item, label="a", user=team.owner, shown_label="")


def test_a_reviewer_changes_their_answer_and_the_item_follows(team, carol, campaign):
    """A key pressed by mistake sent an answer that no one could take back (QA): the reviewer now changes it,
    the item's count and status follow, and what cannot change is refused in words."""
    item = campaign.items.order_by("sequence").first()
    answer(item, team.teammate, "a")
    answer(item, carol, "a")
    item.refresh_from_db()
    assert (item.status, item.review_count) == (ItemStatus.COMPLETE, 2)
    services.review_change(item=item, user=carol, choice=choice_for(item, carol, "b"))
    item.refresh_from_db()
    assert item.status == ItemStatus.CONFLICT and Review.objects.get(item=item, reviewer=carol).label == Label.B
    services.review_change(item=item, user=carol, choice="skip")  # a skip frees the place
    item.refresh_from_db()
    assert (item.status, item.review_count) == (ItemStatus.IN_REVIEW, 1)
    assert selectors.last_answer(campaign=campaign, user=carol).item == item

    with pytest.raises(ValidationError, match="you have not answered item 2"):
        services.review_change(item=campaign.items.get(sequence=2), user=carol, choice="tie")
    with pytest.raises(ValidationError, match="is not one of"):
        services.review_change(item=item, user=carol, choice="best")
    with pytest.raises(PermissionDenied):
        services.review_change(item=item, user=team.viewer, choice="tie")

    # The skip turned back into an answer once another reviewer has filled the item: refused, the skip stays.
    dave = make_user("dave")
    project_services.membership_add(project=team.project, user=dave, role=Role.MEMBER)
    CampaignReviewer.objects.create(campaign=campaign, user=dave)
    expire_leases(item)
    answer(item, dave, "a")
    with pytest.raises(ValidationError, match="already has the 2 reviews it needs from others since you skipped it"):
        services.review_change(item=item, user=carol, choice=choice_for(item, carol, "a"))
    # An owner's resolution is final.
    services.review_change(item=item, user=dave, choice=choice_for(item, dave, "b"))
    item.refresh_from_db()
    assert item.status == ItemStatus.CONFLICT
    services.conflict_resolve(item=item, label=Label.A, user=team.owner)
    with pytest.raises(ValidationError) as refused:
        services.review_change(item=item, user=dave, choice="tie")
    assert f"was resolved by {isolated('alpha-owner')}, whose label is final" in refused.value.messages[0]


def test_a_campaign_named_in_a_sentence_reorders_nothing_after_it(team, carol, preference_version):
    """QA: a right-to-left campaign name in "you are not a reviewer of …; ask a project owner" (the
    reviewing page's 403), in the refusal to load it again and in a project deletion's list of work in
    flight was put in bare, so the words after it could be drawn inside it; its neighbours isolate theirs."""
    from webapp.projects.selectors import project_readers

    name = "סקירה 1"
    campaign = create_loaded(project=team.project, name=name, guidelines="", required_reviews=1, reviewers=[carol],
                             source_version=preference_version, user=team.owner)
    with pytest.raises(PermissionDenied) as refused:
        services.queue_next_item(campaign=campaign, user=team.teammate)
    assert str(refused.value) == f"you are not a reviewer of {isolated(name)}; ask a project owner to add you"
    with pytest.raises(ValidationError) as refused:
        services.campaign_load_request(campaign=campaign)
    assert refused.value.messages == [f"campaign {isolated(name)} is ready, not waiting for its items"]
    answer(campaign.items.get(sequence=1), carol, "a")
    services.export_create(campaign=campaign, options=services.ExportOptions(dataset_name="out"), user=team.owner)
    assert (f"an export of review campaign {isolated(name)} is being written; wait until it is done"
            in project_readers(project=team.project))
