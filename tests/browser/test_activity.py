"""A teammate deletes a run in the browser and the project's Activity page, reached from the project's bar, says
so: who, what (the run's name as text, never markup, "(deleted)" now that it is gone), when; its filters keep it
or leave it out."""
import pytest
from playwright.sync_api import expect

from tests.browser import test_projects
from tests.webapp.factories import make_team
from webapp.runs.models import Run, RunStatus

pytestmark = pytest.mark.browser

NAME = '<img src=x onerror=alert(1)> sft'


def test_a_run_deleted_in_the_browser_is_on_the_activity_page(page, live_server, tmp_path):
    team = make_team(slug="activitylog")
    run = Run.objects.create(project=team.project, name=NAME, task="sft", status=RunStatus.FAILED,
                             spec={"task": "sft"}, resolved_spec={"output_dir": str(tmp_path)},
                             created_by=team.teammate, total_steps=9, current_step=3)
    dialogs = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    test_projects.log_in(page, live_server.url, team.teammate.username)
    page.goto(f"{live_server.url}/p/activitylog/runs/{run.public_id}/")
    page.locator("#delete-confirm summary").click()
    page.locator("#delete-confirm").get_by_role("button", name="Delete").click()
    page.wait_for_url(f"{live_server.url}/p/activitylog/runs/**")

    page.locator("nav.subnav").get_by_role("link", name="Activity", exact=True).click()
    page.wait_for_url(f"{live_server.url}/p/activitylog/activity/")
    rows = page.locator("#activity tbody tr")
    expect(rows).to_have_count(3)  # newest first: the deletion, then the team's members added by make_team (manage.py)
    row = rows.first
    expect(row).to_have_attribute("data-verb", "run.deleted")
    expect(rows.nth(1).locator(".actor")).to_have_text("manage.py")
    expect(row.locator(".actor")).to_have_text("activitylog-teammate")
    expect(row.locator(".what")).to_contain_text(f"deleted run {NAME} (deleted)")
    expect(row.locator("time")).to_have_text("just now")
    assert row.locator("time").get_attribute("title").endswith(" UTC")
    assert row.locator("a").count() == 0, "a deleted run has no page to link"
    assert not Run.objects.filter(pk=run.pk).exists() and dialogs == []

    page.select_option("select[name=kind]", "dataset")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("#activity-empty")).to_have_text("No activity matches these filters.")
    page.select_option("select[name=kind]", "run")
    page.select_option("select[name=actor]", "activitylog-teammate")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("#activity tbody tr")).to_have_count(1)
