import pytest
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import PermissionDenied
from django.http import Http404

from webapp.projects.access import get_project_for_user
from webapp.projects.models import Role


def test_it_returns_project_and_membership_for_members(team):
    for user, role in [(team.owner, Role.OWNER), (team.teammate, Role.MEMBER), (team.viewer, Role.VIEWER)]:
        project, membership = get_project_for_user(user, "alpha")
        assert project == team.project
        assert membership.role == role


@pytest.mark.parametrize("slug", ["alpha", "does-not-exist"])
def test_outsiders_and_anonymous_get_404_whether_or_not_the_project_exists(team, slug):
    with pytest.raises(Http404):
        get_project_for_user(team.outsider, slug)
    with pytest.raises(Http404):
        get_project_for_user(AnonymousUser(), slug)


def test_members_below_the_minimum_role_get_403(team):
    with pytest.raises(PermissionDenied):
        get_project_for_user(team.viewer, "alpha", min_role=Role.MEMBER)
    with pytest.raises(PermissionDenied, match="owner"):
        get_project_for_user(team.teammate, "alpha", min_role=Role.OWNER)
    project, _ = get_project_for_user(team.teammate, "alpha", min_role=Role.MEMBER)
    assert project == team.project
    project, _ = get_project_for_user(team.owner, "alpha", min_role=Role.OWNER)
    assert project == team.project
