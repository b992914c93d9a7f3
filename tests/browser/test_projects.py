"""A team forms in the browser: the owner adds a teammate by username and changes
their role, the teammate sees the project, a removed member loses it, and everyone
can log out and change their password."""
import pytest
from playwright.sync_api import expect

from tests.webapp.factories import PASSWORD, make_user
from webapp.projects.models import Membership, Role

pytestmark = pytest.mark.browser


def log_in(page, base_url, username, password=PASSWORD):
    page.goto(f"{base_url}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base_url}/")


def log_out(page):
    page.get_by_role("button", name="Log out").click()
    page.wait_for_url("**/accounts/login/")


def test_owner_manages_the_team(page, live_server):
    base = live_server.url
    make_user("olga")
    make_user("tom")
    log_in(page, base, "olga")
    page.get_by_role("link", name="New project").click()
    page.fill("#id_name", "Reward models")
    page.fill("#id_slug", "reward-models")
    page.get_by_role("button", name="Create project").click()
    page.wait_for_url(f"{base}/p/reward-models/")

    page.locator("nav.subnav").get_by_role("link", name="Members").click()
    page.fill("#id_username", "tom")
    page.select_option("#id_role", "viewer")
    page.get_by_role("button", name="Add member").click()
    assert "\u2068tom\u2069 added as viewer" in page.locator(".messages").inner_text(), "the name is isolated"
    page.select_option("select[aria-label='Role of tom']", "member")
    page.locator("tr", has_text="tom").get_by_role("button", name="Change").click()
    assert "\u2068tom\u2069 is now member" in page.locator(".messages").inner_text()
    assert Membership.objects.get(project__slug="reward-models", user__username="tom").role == Role.MEMBER

    page.fill("#id_username", "nobody")
    page.get_by_role("button", name="Add member").click()
    assert "no active user is named 'nobody'" in page.locator(".field .error").inner_text()
    log_out(page)

    log_in(page, base, "tom")
    page.get_by_role("link", name="Reward models").click()
    assert page.locator("nav.subnav .role").text_content() == "Member"
    page.locator("nav.subnav").get_by_role("link", name="Members").click()
    assert page.get_by_role("button", name="Add member").count() == 0, "members do not manage members"
    log_out(page)

    log_in(page, base, "olga")
    page.goto(f"{base}/p/reward-models/members/")
    row = page.locator("tr", has_text="tom")
    assert not row.get_by_role("button", name="Remove tom").is_visible(), "removing asks first"
    row.locator("summary", has_text="Remove…").click()
    assert "tom loses access to Reward models" in row.inner_text()
    row.get_by_role("button", name="Remove tom").click()
    assert "\u2068tom\u2069 removed from \u2068Reward models\u2069" in page.locator(".messages").inner_text()
    log_out(page)

    log_in(page, base, "tom")
    assert page.locator("table").count() == 0 and "not a member of any project" in page.content()
    response = page.goto(f"{base}/p/reward-models/")
    assert response.status == 404


def test_password_change(page, live_server):
    base = live_server.url
    make_user("pat")
    log_in(page, base, "pat")
    page.get_by_role("link", name="pat").click()
    page.fill("#id_old_password", PASSWORD)
    page.fill("#id_new_password1", "a-brand-new-phrase")
    page.fill("#id_new_password2", "a-brand-new-phrase")
    expect(page.get_by_label("Also revoke my API tokens")).to_be_checked()
    page.get_by_role("button", name="Change password").click()
    page.wait_for_url("**/accounts/password/done/")
    expect(page.get_by_text("Your other sessions were signed out.")).to_be_visible()
    log_out(page)
    log_in(page, base, "pat", "a-brand-new-phrase")
    assert page.get_by_role("heading", name="Projects").is_visible()


def test_an_owner_deletes_the_project_by_typing_its_slug(page, live_server):
    """The confirmation opens, a wrong slug deletes nothing and says so, the right one deletes the project."""
    from tests.webapp.factories import make_team
    from webapp.projects.models import Project

    team = make_team()
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/alpha/")
    page.get_by_role("link", name="Settings").click()
    page.get_by_text("Delete this project…").click()
    page.fill("#confirm-slug", "alpha-elsewhere")
    page.get_by_role("button", name="Delete Project alpha").click()
    page.wait_for_url("**/p/alpha/settings/")
    assert ("Nothing was deleted: 'alpha-elsewhere' is not the project's slug; type alpha to confirm."
            in page.locator(".messages").inner_text())
    page.get_by_text("Delete this project…").click()
    page.fill("#confirm-slug", "alpha")
    page.get_by_role("button", name="Delete Project alpha").click()
    page.wait_for_url(f"{live_server.url}/")
    assert ("Deleted the project \u2068Project alpha\u2069 (alpha) with everything in it."
            in page.locator(".messages").inner_text())
    assert not Project.objects.filter(slug="alpha").exists() and Project.objects.filter(slug="alpha-elsewhere").exists()


def test_an_owner_renames_and_describes_the_project(page, live_server):
    """From the project bar's Settings: a refused name is said beside its field, what was typed kept; then the new
    name and description show on the project page (the description escaped, its line break kept) and in the list."""
    from tests.webapp.factories import make_team

    team = make_team()
    log_in(page, live_server.url, team.owner.username)
    page.goto(f"{live_server.url}/p/alpha/")
    page.get_by_role("link", name="Settings").click()
    page.wait_for_url("**/p/alpha/settings/")
    expect(page.get_by_role("navigation", name="Project").locator("[aria-current]")).to_have_text("Settings")
    page.fill("#id_name", "Reward\u200bmodels")
    page.fill("#id_description", "Scores answers <b>fairly</b>.\nSecond line.")
    page.get_by_role("button", name="Save").click()
    expect(page.locator("#id_name_error")).to_contain_text("an invisible character, U+200B (ZERO WIDTH SPACE)")
    expect(page.locator("#id_description")).to_have_value("Scores answers <b>fairly</b>.\nSecond line.")
    page.fill("#id_name", "Reward models")
    page.get_by_role("button", name="Save").click()
    expect(page.locator(".messages")).to_contain_text("Saved the settings of \u2068Reward models\u2069.")
    page.locator(".project-name").click()
    page.wait_for_url("**/p/alpha/")
    expect(page.get_by_role("heading", level=1)).to_have_text("Reward models")
    description = page.locator(".project-description")
    assert description.inner_text() == "Scores answers <b>fairly</b>.\nSecond line."
    assert description.locator("br").count() == 1 and description.locator("b").count() == 0
    page.goto(f"{live_server.url}/")
    expect(page.locator(".project-excerpt")).to_contain_text("Scores answers <b>fairly</b>.")
