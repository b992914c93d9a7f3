"""Deleting an account, in the admin (one user's Delete page, or "Delete selected users") and on the model:
what was the team's stays, what was the person's own goes, and no project is left without an owner.

QA: deleting a user in /admin/ deleted their reviews (the items' review counts and statuses then wrong),
their arena battles and votes, and their owner membership (the project left with no owner)."""
import pytest
from django.contrib.auth import get_user_model
from django.db.models import ProtectedError
from django.urls import reverse
from django.utils import timezone

from tests.webapp.factories import make_ready_version, make_user
from tests.webapp.review.conftest import PREFERENCE_ROWS, answer, create_loaded
from webapp.api.models import ApiToken
from webapp.api.services import token_create
from webapp.chat.models import Battle, Conversation, ProjectToken
from webapp.chat.tokens import project_token_create
from webapp.core.bidi import isolated
from webapp.core.models import Submission
from webapp.projects import services as project_services
from webapp.projects.models import Membership, Role
from webapp.review import services as review_services
from webapp.review.models import CampaignReviewer, Item, ItemStatus, Lease, Review

REFUSED = "would require deleting the following protected related objects"
ADVICE = "Deactivate it instead"


@pytest.fixture(autouse=True)
def no_tasks_sent(monkeypatch):
    from webapp.celery import app as celery_app

    monkeypatch.setattr(celery_app, "send_task", lambda *args, **kwargs: None)


def delete_in_admin(admin_client, user):
    """Open ``user``'s Delete page in the admin and confirm it, as an administrator would."""
    url = reverse("admin:auth_user_delete", args=[user.pk])
    page = admin_client.get(url)
    assert page.status_code == 200
    return page, admin_client.post(url, {"post": "yes"})


def delete_selected_in_admin(admin_client, *users):
    """Tick ``users`` on the admin's user list and confirm "Delete selected users"."""
    return admin_client.post(reverse("admin:auth_user_changelist"), {
        "action": "delete_selected", "_selected_action": [user.pk for user in users], "post": "yes"})


def still_there(user) -> bool:
    return get_user_model().objects.filter(pk=user.pk).exists()


@pytest.fixture
def reviewed(team):
    """A campaign of two items needing two reviews each: the teammate answered both, the owner the first
    (complete: 2 reviews), the second is in review (1 review)."""
    version = make_ready_version(team.project, name="prefs", kind="preference", rows=PREFERENCE_ROWS[:2],
                                 user=team.owner)
    campaign = create_loaded(project=team.project, name="pass 1", guidelines="", required_reviews=2,
                             reviewers=[team.teammate, team.owner], source_version=version, user=team.owner)
    first, second = campaign.items.order_by("sequence")
    answer(first, team.teammate, "a")
    answer(second, team.teammate, "b")
    answer(first, team.owner, "a")
    return campaign


def counts_and_statuses(campaign):
    return list(Item.objects.filter(campaign=campaign).order_by("sequence").values_list("review_count", "status"))


def test_a_reviewer_cannot_be_deleted_in_the_admin_and_their_reviews_still_count(team, reviewed, admin_client):
    before = counts_and_statuses(reviewed)
    assert before == [(2, ItemStatus.COMPLETE), (1, ItemStatus.IN_REVIEW)]
    page, response = delete_in_admin(admin_client, team.teammate)
    for answered in (page, response):
        text = answered.content.decode()
        assert REFUSED in text and ADVICE in text
        assert text.count("Review: ") == 2
    assert still_there(team.teammate)
    assert Review.objects.filter(reviewer=team.teammate).count() == 2
    assert counts_and_statuses(reviewed) == before
    response = delete_selected_in_admin(admin_client, team.teammate, team.viewer)
    assert REFUSED in response.content.decode() and ADVICE in response.content.decode()
    assert still_there(team.teammate) and still_there(team.viewer)
    with pytest.raises(ProtectedError):
        team.teammate.delete()
    assert counts_and_statuses(reviewed) == before


def test_an_arena_voter_cannot_be_deleted_in_the_admin_and_their_battles_stay(team, admin_client):
    def side(model):
        return Conversation.objects.create(project=team.project, user=team.teammate, model_ref=model,
                                           model_label=model, in_arena=True)

    battle = Battle.objects.create(project=team.project, user=team.teammate, prompt="Name a colour.",
                                   side_a=side("bm_a"), side_b=side("bm_b"), outcome="a", voted_at=timezone.now())
    page, response = delete_in_admin(admin_client, team.teammate)
    assert REFUSED in response.content.decode() and f"Battle: arena battle {battle.public_id}" in page.content.decode()
    assert still_there(team.teammate)
    with pytest.raises(ProtectedError):
        team.teammate.delete()
    assert Battle.objects.get(pk=battle.pk).outcome == "a"
    assert Conversation.objects.filter(user=team.teammate, in_arena=True).count() == 2


def test_a_projects_last_owner_cannot_be_deleted_until_someone_else_is_owner(team, admin_client):
    page, response = delete_in_admin(admin_client, team.owner)
    text = response.content.decode()
    assert REFUSED in text and "Membership: alpha-owner in alpha (owner)" in text
    assert "make someone else owner" in text and ADVICE in text
    assert still_there(team.owner)
    with pytest.raises(ProtectedError):
        team.owner.delete()
    # Two owners deleted together would leave the project ownerless just as well.
    project_services.membership_set_role(membership=Membership.objects.get(user=team.teammate), role=Role.OWNER)
    response = delete_selected_in_admin(admin_client, team.owner, team.teammate)
    assert REFUSED in response.content.decode()
    assert still_there(team.owner) and still_there(team.teammate)
    # With another owner left, the account goes and its membership with it.
    _page, response = delete_in_admin(admin_client, team.owner)
    assert response.status_code == 302 and not still_there(team.owner)
    assert list(Membership.objects.filter(project=team.project, role=Role.OWNER).values_list(
        "user__username", flat=True)) == ["alpha-teammate"]


def test_deleting_an_account_takes_its_own_data_and_leaves_the_teams(team, admin_client):
    """A member who reviewed and voted nothing: their chats, tokens, memberships, reviewer ticks and held items
    go (the item they held is free for others at once); what they made for the team (a dataset, a campaign)
    stays, its author empty; the reviews of others keep counting."""
    dave = make_user("dave")
    project_services.membership_add(project=team.project, user=dave, role=Role.MEMBER)
    version = make_ready_version(team.project, name="prefs", kind="preference", rows=PREFERENCE_ROWS[:2], user=dave)
    campaign = create_loaded(project=team.project, name="pass 1", guidelines="", required_reviews=2,
                             reviewers=[team.teammate, dave], source_version=version, user=dave)
    first, _second = campaign.items.order_by("sequence")
    answer(first, team.teammate, "a")
    held = review_services.queue_next_item(campaign=campaign, user=dave)
    assert Lease.objects.filter(reviewer=dave, item=held).exists()
    Conversation.objects.create(project=team.project, user=dave, model_ref="bm_a", model_label="a")
    token_create(user=dave, name="laptop")
    project_token_create(user=dave, project=team.project, name="notebook")
    Submission.objects.create(user=dave, key="k" * 64, result="/p/alpha/")
    before = counts_and_statuses(campaign)

    page, response = delete_in_admin(admin_client, dave)
    assert "Are you sure you want to delete" in page.content.decode()
    assert response.status_code == 302 and not still_there(dave)
    for private in (Conversation.objects.filter(model_ref="bm_a"), ApiToken.objects.filter(name="laptop"),
                    ProjectToken.objects.filter(name="notebook"), Submission.objects.filter(result="/p/alpha/"),
                    Membership.objects.filter(project=team.project, user_id=dave.pk),
                    CampaignReviewer.objects.filter(user_id=dave.pk), Lease.objects.filter(reviewer_id=dave.pk)):
        assert not private.exists(), private.model.__name__
    campaign.refresh_from_db()
    version.refresh_from_db()
    assert campaign.created_by is None and version.created_by is None and version.dataset.created_by is None
    assert counts_and_statuses(campaign) == before == [(1, ItemStatus.IN_REVIEW), (0, ItemStatus.PENDING)]


def test_deleting_an_account_on_the_model_keeps_the_teams_data_too(team):
    """Deletion outside the admin (a shell, a script) follows the same rules."""
    carol = make_user("carol")
    project_services.membership_add(project=team.project, user=carol, role=Role.MEMBER)
    version = make_ready_version(team.project, name="prefs", kind="preference", rows=PREFERENCE_ROWS[:1], user=carol)
    campaign = create_loaded(project=team.project, name="pass 1", guidelines="", required_reviews=1,
                             reviewers=[carol], source_version=version, user=team.owner)
    answer(campaign.items.get(), carol, "a")
    with pytest.raises(ProtectedError):
        carol.delete()
    assert counts_and_statuses(campaign) == [(1, ItemStatus.COMPLETE)]
    assert Membership.objects.filter(user=carol).exists()


def test_the_project_admin_adds_members_but_removes_and_changes_them_only_on_the_members_page(team, admin_client):
    """The project's admin page could delete its last owner's membership, or demote them, leaving the project
    with no owner, and removed members kept their project tokens and reviewer places: the Members page's rules
    were skipped. Existing memberships are now read-only there; adding one (an owner for a project whose
    owners left) still works."""
    project_token_create(user=team.teammate, project=team.project, name="notebook")
    memberships = list(Membership.objects.filter(project=team.project).order_by("pk"))
    data = {"name": team.project.name, "slug": team.project.slug, "memberships-TOTAL_FORMS": len(memberships) + 1,
            "memberships-INITIAL_FORMS": len(memberships), "memberships-MIN_NUM_FORMS": 0,
            "memberships-MAX_NUM_FORMS": 1000}
    for index, membership in enumerate(memberships):
        data.update({f"memberships-{index}-id": membership.pk, f"memberships-{index}-project": team.project.pk,
                     f"memberships-{index}-user": membership.user_id, f"memberships-{index}-role": Role.VIEWER,
                     f"memberships-{index}-DELETE": "on"})
    new = len(memberships)
    data.update({f"memberships-{new}-project": team.project.pk, f"memberships-{new}-user": team.outsider.pk,
                 f"memberships-{new}-role": Role.OWNER})
    response = admin_client.post(reverse("admin:projects_project_change", args=[team.project.pk]), data)
    assert response.status_code == 302
    assert sorted(Membership.objects.filter(project=team.project).values_list("user__username", "role")) == [
        ("alpha-outsider", "owner"), ("alpha-owner", "owner"), ("alpha-teammate", "member"),
        ("alpha-viewer", "viewer")]
    assert ProjectToken.objects.filter(user=team.teammate, project=team.project).exists()


def test_an_unvoted_arena_battle_goes_with_its_account(team, admin_client):
    """An arena battle never voted on is no one's data but its author's (the leaderboard and the preference
    pairs read votes only): it went on blocking the account's deletion, in the admin and on the model. It now
    goes with the account, its two sides with it; a voted battle of the same account still refuses it."""
    def battle(user, **vote):
        sides = [Conversation.objects.create(project=team.project, user=user, model_ref=model, model_label=model,
                                             in_arena=True) for model in ("bm_a", "bm_b")]
        return Battle.objects.create(project=team.project, user=user, prompt="Name a colour.", side_a=sides[0],
                                     side_b=sides[1], **vote)

    dave, erin = make_user("dave"), make_user("erin")
    for user in (dave, erin):
        project_services.membership_add(project=team.project, user=user, role=Role.MEMBER)
    battle(dave)
    page, response = delete_in_admin(admin_client, dave)
    assert "Are you sure you want to delete" in page.content.decode()
    assert response.status_code == 302 and not still_there(dave)
    assert not Battle.objects.filter(user_id=dave.pk).exists()
    assert not Conversation.objects.filter(user_id=dave.pk).exists()

    unvoted, voted = battle(erin), battle(erin, outcome="b", voted_at=timezone.now())
    with pytest.raises(ProtectedError) as refused:
        erin.delete()
    assert refused.value.protected_objects == {voted}
    assert still_there(erin)
    assert set(Battle.objects.filter(user=erin)) == {unvoted, voted}
    assert Conversation.objects.filter(user=erin, in_arena=True).count() == 4


def test_deleteaccount_deletes_an_account_or_says_in_words_what_keeps_it(team, reviewed):
    """``user.delete()`` in a shell refused with Django's "Cannot delete some instances of model 'User' because
    they are referenced through protected foreign keys: 'Battle.user'", which says neither what the rows are nor
    what to do. ``manage.py deleteaccount`` deletes by the same rules and, when refused, says so in words."""
    from django.core.management import CommandError, call_command

    def side(user):
        return Conversation.objects.create(project=team.project, user=user, model_ref="bm_a", model_label="a",
                                           in_arena=True)

    Battle.objects.create(project=team.project, user=team.teammate, prompt="Hi", side_a=side(team.teammate),
                          side_b=side(team.teammate), outcome="tie", voted_at=timezone.now())
    with pytest.raises(CommandError) as refused:
        call_command("deleteaccount", "alpha-teammate")
    assert str(refused.value) == (
        f"{isolated('alpha-teammate')} was not deleted: they reviewed 2 items (review campaign {isolated('pass 1')}), "
        f"which count in the items' reviews and agreement, and voted in 1 arena battle (project alpha), which counts "
        "in the leaderboard and preference pairs. Deactivate the account instead (its Active box in the admin): it "
        "can no longer log in, and what it did for the team stays.")
    with pytest.raises(CommandError) as refused:
        call_command("deleteaccount", "alpha-owner")
    assert "Also they are the last owner of project alpha: make someone else owner first" in str(refused.value)
    assert still_there(team.teammate) and still_there(team.owner)

    with pytest.raises(CommandError, match="no user named 'nobody'"):
        call_command("deleteaccount", "nobody")
    dave = make_user("dave")
    call_command("deleteaccount", "dave")
    assert not still_there(dave)
