"""Chat migrations that bring older rows in line with what the services now do."""
import pytest

from tests.webapp.migrating import migrated_back_to

pytestmark = pytest.mark.django_db(transaction=True)


def test_tokens_of_users_no_longer_members_of_their_project_are_revoked():
    """A member removed from a project, or made a viewer, kept their project tokens (refused meanwhile), and
    they worked again once the user was added back or promoted; the migration revokes those of users who may
    not chat in the token's project now."""
    with migrated_back_to(("chat", "0004_battle_blind"), ("projects", "0002_visible_project_names")) as apps:
        User = apps.get_model("auth", "User")
        Project = apps.get_model("projects", "Project")
        Membership = apps.get_model("projects", "Membership")
        ProjectToken = apps.get_model("chat", "ProjectToken")
        owner, member, viewer, gone = (User.objects.create(username=name) for name in ("owner", "member", "viewer", "gone"))
        alpha, beta = (Project.objects.create(name=slug, slug=slug) for slug in ("alpha", "beta"))
        for user, role in ((owner, "owner"), (member, "member"), (viewer, "viewer")):
            Membership.objects.create(project=alpha, user=user, role=role)
        Membership.objects.create(project=beta, user=gone, role="member")
        for user, project in ((owner, alpha), (member, alpha), (viewer, alpha), (gone, alpha), (gone, beta)):
            ProjectToken.objects.create(user=user, project=project, name="cli", digest=f"{user.username}-{project.slug}",
                                        prefix="tpk_")
    from webapp.chat.models import ProjectToken as CurrentProjectToken

    assert sorted(CurrentProjectToken.objects.values_list("user__username", "project__slug")) == [
        ("gone", "beta"), ("member", "alpha"), ("owner", "alpha")]


def test_messages_written_before_they_recorded_whether_they_have_text_get_the_record():
    """``Message.has_text`` (0016) is back-filled from each message's text: none, or whitespace only, is no text."""
    with migrated_back_to(("chat", "0015_battle_order_ties_by_id"),) as apps:
        User = apps.get_model("auth", "User")
        Project = apps.get_model("projects", "Project")
        Conversation = apps.get_model("chat", "Conversation")
        Message = apps.get_model("chat", "Message")
        user = User.objects.create(username="owner")
        conversation = Conversation.objects.create(project=Project.objects.create(name="alpha", slug="alpha"),
                                                   user=user, in_arena=True)
        for content in ("Blue.", "", " \n\t", "  Red  "):
            Message.objects.create(conversation=conversation, role="assistant", content=content)
    from webapp.chat.models import Message as CurrentMessage

    assert dict(CurrentMessage.objects.values_list("content", "has_text")) == {
        "Blue.": True, "": False, " \n\t": False, "  Red  ": True}
