import pytest
from django.core.exceptions import ValidationError

from tests.webapp.factories import make_user
from webapp.projects import selectors, services
from webapp.projects.models import Membership, Project, Role


def test_project_create_makes_the_creator_owner(db):
    owner = make_user("ada")
    project = services.project_create(name="  Chat tuning ", slug="chat-tuning", owner=owner)
    assert project.name == "Chat tuning"
    membership = Membership.objects.get(project=project)
    assert (membership.user, membership.role) == (owner, Role.OWNER)


@pytest.mark.parametrize(("name", "slug"), [("Chat tuning", "chat-tuning"), ("  Ärger -- 2!", "arger-2"),
                                         ("x" * 49 + " y", "x" * 49)])
def test_project_create_makes_a_blank_slug_from_the_name(db, name, slug):
    assert services.project_create(name=name, slug="", owner=make_user("ada")).slug == slug


@pytest.mark.parametrize("slug", ["Upper", "under_score", "-lead", "trail-", "a" * 51, "new", "admin"])
def test_project_create_rejects_bad_slug(db, slug):
    with pytest.raises(ValidationError) as excinfo:
        services.project_create(name="x", slug=slug, owner=make_user("ada"))
    assert "slug" in excinfo.value.message_dict


def test_project_create_rejects_taken_slug(team):
    with pytest.raises(ValidationError, match="already exists"):
        services.project_create(name="again", slug=team.project.slug, owner=team.outsider)


def test_project_create_rejects_empty_name(db):
    with pytest.raises(ValidationError) as excinfo:
        services.project_create(name="   ", slug="ok", owner=make_user("ada"))
    assert "name" in excinfo.value.message_dict


def test_membership_add_rejects_duplicate_and_bad_role(team):
    with pytest.raises(ValidationError, match="already a member"):
        services.membership_add(project=team.project, user=team.teammate, role=Role.VIEWER)
    with pytest.raises(ValidationError) as excinfo:
        services.membership_add(project=team.project, user=team.outsider, role="admin")
    assert "role" in excinfo.value.message_dict
    assert not Membership.objects.filter(project=team.project, user=team.outsider).exists()


def test_last_owner_cannot_be_demoted_or_removed(team):
    owner_membership = Membership.objects.get(project=team.project, user=team.owner)
    with pytest.raises(ValidationError, match="last owner"):
        services.membership_set_role(membership=owner_membership, role=Role.MEMBER)
    with pytest.raises(ValidationError, match="last owner"):
        services.membership_remove(membership=owner_membership)
    owner_membership.refresh_from_db()
    assert owner_membership.role == Role.OWNER


def test_an_owner_can_step_down_once_another_owner_exists(team):
    teammate = Membership.objects.get(project=team.project, user=team.teammate)
    services.membership_set_role(membership=teammate, role=Role.OWNER)
    owner_membership = Membership.objects.get(project=team.project, user=team.owner)
    services.membership_set_role(membership=owner_membership, role=Role.VIEWER)
    owner_membership.refresh_from_db()
    assert owner_membership.role == Role.VIEWER


def test_project_list_for_user_shows_own_projects_with_role_and_size(team):
    listed = list(selectors.project_list_for_user(user=team.viewer))
    assert [(p.slug, p.role, p.member_count) for p in listed] == [("alpha", "viewer", 3)]
    assert [p.slug for p in selectors.project_list_for_user(user=team.outsider)] == ["alpha-elsewhere"]


def test_membership_list_orders_owners_first(team):
    names = [m.user.username for m in selectors.membership_list(project=team.project)]
    assert names == ["alpha-owner", "alpha-teammate", "alpha-viewer"]


def test_project_create_turns_a_lost_slug_race_into_a_validation_error(team, monkeypatch):
    class NothingFound:
        def exists(self):
            return False

    # As if another request created "alpha" between our check and our insert.
    monkeypatch.setattr(Project.objects, "filter", lambda **lookups: NothingFound())
    with pytest.raises(ValidationError, match="already exists"):
        services.project_create(name="again", slug="alpha", owner=team.outsider)
    monkeypatch.undo()
    assert Project.objects.filter(slug="alpha").count() == 1
    assert not Membership.objects.filter(project__slug="alpha", user=team.outsider).exists()


def test_project_create_refuses_a_slug_whose_models_folder_is_left_over(db, settings, tmp_path):
    """A deleted project's folder under the models root (projects/<slug>/) stays: a new project given its slug would
    see the deleted team's private models as its own."""
    settings.MODELS_ROOT = tmp_path / "models"
    (tmp_path / "models" / "projects" / "heron" / "private-ft").mkdir(parents=True)
    with pytest.raises(ValidationError) as excinfo:
        services.project_create(name="Heron", slug="", owner=make_user("ada"))
    assert excinfo.value.message_dict["slug"] == [
        f"the models root already has a folder for slug 'heron' ({tmp_path}/models/projects/heron), left by a "
        "deleted project or made ahead of this one: its models would be this project's; choose another slug, or "
        "ask an administrator to move that folder away first"]
    assert not Project.objects.filter(slug="heron").exists()
    assert services.project_create(name="Heron", slug="heron-2", owner=make_user("bob")).slug == "heron-2"


def test_project_update_renames_and_describes_a_project_keeping_its_slug(team):
    project = services.project_update(project=team.project, user=team.owner, name="  Reward models ",
                                      description="Tuning the RM.\r\nSecond line.\n")
    project.refresh_from_db()
    assert (project.name, project.slug, project.description) == ("Reward models", "alpha",
                                                                 "Tuning the RM.\nSecond line.")


@pytest.mark.parametrize(("name", "description", "field", "says"), [
    ("   ", "", "name", "must not be empty"),
    ("x" * 101, "", "name", "101 characters; at most 100"),
    ("Project\u200balpha", "", "name", "U+200B (ZERO WIDTH SPACE)"),
    ("\u202eahpla", "", "name", "U+202E (RIGHT-TO-LEFT OVERRIDE)"),
    ("Renamed", "x" * 2001, "description", "2,001 characters; at most 2,000"),
    ("Renamed", "nul \x00 here", "description", "a NUL character"),
])
def test_project_update_refuses_what_creation_refuses_and_saves_nothing(team, name, description, field, says):
    from webapp.activity.models import Activity

    logged = Activity.objects.count()
    with pytest.raises(ValidationError) as excinfo:
        services.project_update(project=team.project, user=team.owner, name=name, description=description)
    assert list(excinfo.value.message_dict) == [field] and says in excinfo.value.message_dict[field][0]
    team.project.refresh_from_db()
    assert (team.project.name, team.project.description) == ("Project alpha", "")
    assert Activity.objects.count() == logged


def test_project_names_need_not_be_unique(team):
    services.project_update(project=team.project, user=team.owner, name="Elsewhere", description="")
    assert Project.objects.filter(name="Elsewhere").count() == 2


def test_project_update_is_logged_once_naming_the_fields_changed_not_the_old_text(team):
    from webapp.activity.models import Activity, Verb

    services.project_update(project=team.project, user=team.owner, name="Project alpha", description="secret plan")
    services.project_update(project=team.project, user=team.owner, name="Renamed", description="new plan")
    services.project_update(project=team.project, user=team.owner, name="Renamed", description="new plan")
    entries = list(Activity.objects.filter(project=team.project, verb=Verb.PROJECT_CHANGED).order_by("id"))
    assert [(entry.actor_name, entry.target_kind, entry.details) for entry in entries] == [
        ("alpha-owner", "", {"changed": ["description"]}),
        ("alpha-owner", "", {"changed": ["name", "description"], "name_was": "Project alpha",
                             "renamed_to": "Renamed"}),
    ]
    assert "secret plan" not in str(entries[1].details)
