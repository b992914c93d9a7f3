"""The Activity page and ``GET /api/v1/projects/<slug>/activity/``: every member reads the log, outsiders get 404;
newest first, a page at a time by keyset; filtered by person and kind of object; names escaped; a target linked
while it exists, said deleted after; a deleted account and manage.py named as such."""
import html
import re

from django.db import transaction
from django.utils.html import escape

from tests.webapp.runs.conftest import sft_spec
from webapp.activity.models import Activity, Verb
from webapp.activity.services import activity_record
from webapp.api.services import token_create
from webapp.runs import services
from webapp.runs.models import RunStatus

PAGE = "/p/alpha/activity/"
API = "/api/v1/projects/alpha/activity/"


def rows(page: str) -> list[str]:
    """The rows' verbs and target ids, top to bottom."""
    return re.findall(r'<tr data-verb="([^"]+)" data-target="([^"]*)">', page)


def api_get(client, user, path):
    _row, secret = token_create(user=user, name="t")
    return client.get(path, HTTP_AUTHORIZATION=f"Bearer {secret}")


def paged_through_its_index(team, client, url: str, index: str) -> list[str]:
    """The target ids of every entry the API's pages from ``url`` list, read by a viewer's token; on SQLite each
    query of the entries is checked to read ``index`` and to sort nothing whole (PostgreSQL plans by the table's
    statistics, which a test's 90 rows do not give)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tests.webapp.chat.test_arena import plan_of

    _row, secret = token_create(user=team.viewer, name="t")
    read = []
    with CaptureQueriesContext(connection) as queries:
        while url:
            answer = client.get(url, HTTP_AUTHORIZATION=f"Bearer {secret}").json()
            read += [entry["target"]["id"] for entry in answer["activity"]]
            url = answer["next"]
    if connection.vendor == "sqlite":
        entry_reads = [query["sql"] for query in queries if query["sql"].startswith('SELECT "activity_activity"."id"')]
        assert entry_reads
        for sql in entry_reads:
            plan = plan_of(sql)
            assert index in plan and "TEMP B-TREE" not in plan, (sql, plan)
    return read


def test_every_member_reads_it_and_outsiders_get_404(team, client_for, client):
    for user in (team.owner, team.teammate, team.viewer):
        page = client_for(user).get(PAGE)
        assert page.status_code == 200 and f'href="{PAGE}"' in page.content.decode()  # in the project's nav
    assert client_for(team.outsider).get(PAGE).status_code == 404
    assert client.get(PAGE).status_code == 302  # to the login page
    assert api_get(client, team.viewer, API).status_code == 200
    assert api_get(client, team.outsider, API).status_code == 404


def test_names_are_escaped_and_a_deleted_target_is_said_deleted(team, catalog, client_for, sent_tasks):
    name = '<script>alert("run")</script>'
    run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate, name=name)
    page = client_for(team.viewer).get(PAGE).content.decode()
    assert "<script>alert" not in page and escape(name) in page
    assert f'<a href="/p/alpha/runs/{run.public_id}/">{escape(name)}</a>' in page
    assert "alpha-teammate" in page and "launched run" in " ".join(page.split())
    services.run_set_archived(runs=[run], archived=False, actor=team.owner)  # nothing changed: nothing logged
    services.run_cancel(run=run, user=team.owner)
    services.run_delete(run=run, actor=team.owner)
    page = client_for(team.viewer).get(PAGE).content.decode()
    assert rows(page) == [(Verb.RUN_DELETED, run.public_id), (Verb.RUN_CANCELLED, run.public_id),
                          (Verb.RUN_LAUNCHED, run.public_id)]
    assert f"/runs/{run.public_id}/" not in page and page.count("(deleted)") == 3
    assert "<script>alert" not in page
    # When: relative, and exact both on hover and written out.
    entry = Activity.objects.order_by("id").first()
    exact = re.search(r'title="([^"]+ UTC)">just now</time><br><small class="muted">([^<]+)</small>', page)
    assert exact and exact[1] == exact[2] and entry.created_at.strftime("%Y-%m-%d") in exact[1]


def test_a_deleted_account_and_manage_py_are_named_as_such(team, client_for, client):
    from tests.webapp.factories import make_user
    from webapp.projects import services as project_services
    from webapp.projects.models import Membership, Role

    dora = make_user("dora")
    project_services.membership_add(project=team.project, user=dora, role=Role.MEMBER)  # manage.py: no actor
    project_services.membership_set_role(membership=Membership.objects.get(user=dora), role=Role.OWNER, actor=dora)
    Membership.objects.filter(user=dora).delete()
    dora.delete()
    entries = list(Activity.objects.order_by("id"))
    assert [entry.actor_name for entry in entries] == ["", "dora"] and entries[1].actor is None
    page = client_for(team.owner).get(PAGE).content.decode()
    assert '<td class="actor">deleted account dora</td>' in page and '<td class="actor">manage.py</td>' in page
    listed = api_get(client, team.owner, API).json()["activity"]
    assert [(each["actor"], each["actor_shown"]) for each in listed] == [("dora", "deleted account dora"),
                                                                         (None, "manage.py")]


def test_pages_follow_on_newest_first_without_overlap(team, client_for):
    for index in range(55):
        activity_record(project=team.project, actor=team.owner, verb=Verb.RUN_LAUNCHED,
                        target=("run", f"run_{index:03}", f"run {index}"))
    client = client_for(team.viewer)
    first = client.get(PAGE).content.decode()
    older = re.search(r'href="([^"]+)" id="activity-older"', first)[1]
    second = client.get(html.unescape(older)).content.decode()
    shown = [target for _verb, target in rows(first) + rows(second)]
    assert shown == [f"run_{index:03}" for index in reversed(range(55))]
    assert len(rows(first)) == 50 and 'id="activity-older"' not in second and "← Newest" in second
    # The API pages the same way.
    listed, address = [], f"{API}?limit=20"
    _row, secret = token_create(user=team.viewer, name="t")
    while address:
        body = client.get(address, HTTP_AUTHORIZATION=f"Bearer {secret}").json()
        listed += [entry["target"]["id"] for entry in body["activity"]]
        address = body["next"]
    assert listed == shown


def test_it_filters_by_person_and_kind(team, catalog, client_for, client, sent_tasks):
    run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate, name="mine")
    services.run_cancel(run=run, user=team.owner)
    activity_record(project=team.project, actor=team.owner, verb=Verb.DATASET_DELETED,
                    target=("dataset", "ds_gone", "old data"))
    viewer = client_for(team.viewer)
    assert rows(viewer.get(f"{PAGE}?actor=alpha-owner").content.decode()) == [
        (Verb.DATASET_DELETED, "ds_gone"), (Verb.RUN_CANCELLED, run.public_id)]
    assert rows(viewer.get(f"{PAGE}?actor=alpha-owner&kind=run").content.decode()) == [
        (Verb.RUN_CANCELLED, run.public_id)]
    assert "No activity matches" in viewer.get(f"{PAGE}?actor=nobody").content.decode()
    refused = viewer.get(f"{PAGE}?kind=runs")
    assert refused.status_code == 400 and "&#x27;runs&#x27; is not a kind of object" in refused.content.decode()
    assert [entry["verb"] for entry in api_get(client, team.viewer, f"{API}?kind=run").json()["activity"]] == [
        Verb.RUN_CANCELLED, Verb.RUN_LAUNCHED]
    body = api_get(client, team.viewer, f"{API}?actor=alpha-teammate").json()["activity"]
    assert body == [{"id": body[0]["id"], "created_at": body[0]["created_at"], "actor": "alpha-teammate",
                     "actor_shown": "alpha-teammate", "verb": "run.launched", "details": {},
                     "target": {"kind": "run", "id": run.public_id, "label": "mine", "exists": True,
                                "url": f"http://testserver/p/alpha/runs/{run.public_id}/"}}]
    bad = api_get(client, team.viewer, f"{API}?kind=runs")
    assert bad.status_code == 400 and "kind" in bad.json()["errors"]
    assert api_get(client, team.viewer, f"{API}?who=x").status_code == 400  # unknown parameter


def test_the_openapi_document_describes_it(team, client):
    from pydantic import TypeAdapter

    from webapp.api import schemas

    document = client.get("/api/v1/openapi.json").json()
    operation = document["paths"]["/api/v1/projects/{slug}/activity/"]["get"]
    assert {parameter["name"] for parameter in operation["parameters"]} >= {"slug", "limit", "cursor", "actor", "kind"}
    activity_record(project=team.project, actor=team.owner, verb=Verb.RUN_DELETED, target=("run", "run_x", "x"))
    TypeAdapter(schemas.ActivityList).validate_json(api_get(client, team.owner, API).content)


def test_deleting_the_project_deletes_its_log(team):
    from webapp.projects.models import Project

    activity_record(project=team.project, actor=team.owner, verb=Verb.RUN_DELETED, target=("run", "run_x", "x"))
    Project.objects.filter(pk=team.project.pk).delete()
    assert not Activity.objects.exists()


def test_an_ended_run_shown_cancelled_keeps_its_link(team, catalog, client_for, sent_tasks):
    run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate, name="kept")
    services.run_cancel(run=run, user=team.teammate)
    assert run.__class__.objects.get(pk=run.pk).status == RunStatus.CANCELLED
    page = client_for(team.viewer).get(PAGE).content.decode()
    assert page.count(f'href="/p/alpha/runs/{run.public_id}/"') == 2 and "(deleted)" not in page


def test_details_are_said_in_words():
    from webapp.activity.selectors import details_text

    assert details_text({"step": 10, "bytes_freed": 2048, "steps": [20, 30]}) == (
        "step: 10; bytes freed: 2.0 KB; steps: 20, 30")
    assert details_text({}) == ""


def test_it_filters_by_what_was_done_so_who_deleted_a_run_is_found_among_many_launches(team, client_for, client):
    """QA (a member asking who deleted a run): the log filtered by person and kind only, a deletion sat among every
    launch and cancel of the project's runs, a page of 50 at a time; "What: deleted" with "Kind: run" lists it
    alone, on the page and in the API."""
    with transaction.atomic():
        activity_record(project=team.project, actor=team.teammate, verb=Verb.RUN_DELETED,
                        target=("run", "run_gone", "the lost one"))
        activity_record(project=team.project, actor=team.owner, verb=Verb.DATASET_DELETED,
                        target=("dataset", "ds_gone", "old data"))
        for index in range(60):
            activity_record(project=team.project, actor=team.owner, verb=Verb.RUN_LAUNCHED,
                            target=("run", f"run_{index:03}", f"run {index}"))
    viewer = client_for(team.viewer)
    page = viewer.get(f"{PAGE}?action=deleted&kind=run").content.decode()
    assert rows(page) == [(Verb.RUN_DELETED, "run_gone")] and "alpha-teammate" in page
    assert '<option selected>deleted</option>' in page  # the form keeps what was asked
    assert rows(viewer.get(f"{PAGE}?action=deleted").content.decode()) == [
        (Verb.DATASET_DELETED, "ds_gone"), (Verb.RUN_DELETED, "run_gone")]
    refused = viewer.get(f"{PAGE}?action=removed+by+mistake")
    assert refused.status_code == 400 and "action" in refused.content.decode() and rows(refused.content.decode()) == []
    listed = api_get(client, team.viewer, f"{API}?action=deleted&kind=run").json()["activity"]
    assert [entry["target"]["id"] for entry in listed] == ["run_gone"]
    bad = api_get(client, team.viewer, f"{API}?action=nuked")
    assert bad.status_code == 400 and "action" in bad.json()["errors"]


def test_a_deleted_runs_page_points_a_member_to_the_activity_log(team, catalog, client_for, sent_tasks):
    """QA (a member following an old link to a run someone deleted): the 404 said only "no such run"; it now says
    where to read who deleted it. An outsider's 404 names no project's page."""
    run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate, name="gone soon")
    services.run_cancel(run=run, user=team.owner)
    services.run_delete(run=run, actor=team.owner)
    answer = client_for(team.teammate).get(f"/p/alpha/runs/{run.public_id}/")
    assert answer.status_code == 404
    assert ("if it was deleted, the project&#x27;s activity log says who deleted it and when (its Activity page, "
            "/p/alpha/activity/, or GET /api/v1/projects/alpha/activity/?kind=run&amp;action=deleted)") in (
        answer.content.decode())
    outsider = client_for(team.outsider).get(f"/p/alpha/runs/{run.public_id}/")
    assert outsider.status_code == 404 and "activity" not in outsider.content.decode().lower()


def test_the_page_reads_as_much_for_200_entries_of_every_kind_as_for_a_few(team, client_for, catalog, sent_tasks,
                                                                           django_assert_num_queries):
    """QA (page speed): 200 entries of mixed kinds, their targets there or gone, cost the same queries as a page of
    one entry of each kind: one per kind, never one per row."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from webapp.activity.models import TargetKind

    run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate, name="kept")
    targets = [run, catalog.sft, catalog.sft.dataset, catalog.base_model, (TargetKind.SWEEP, "lr-sweep", "lr-sweep"), (TargetKind.MEMBER, "alpha-viewer", "alpha-viewer"),
               (TargetKind.CHAT_TOKEN, "tp_abc…", "bot"), (TargetKind.RUN, "run_gone", "gone"),
               (TargetKind.DATASET_VERSION, "dv_gone", "data v1"), (TargetKind.PIPELINE, "pl_gone", "p"),
               (TargetKind.BASE_MODEL, "bm_gone", "m"), (TargetKind.CAMPAIGN, "cp_gone", "c"), None]

    def entries(count: int) -> None:
        with transaction.atomic():
            for index in range(count):
                activity_record(project=team.project, actor=(team.owner, team.teammate, None)[index % 3],
                                verb=Verb.RUN_CANCELLED, target=targets[index % len(targets)],
                                details={"step": index})

    viewer = client_for(team.viewer)
    Activity.objects.all().delete()
    entries(len(targets))
    viewer.get(PAGE)
    with CaptureQueriesContext(connection) as for_few:
        viewer.get(PAGE + "?limit=200")
    entries(200 - len(targets))
    with django_assert_num_queries(len(for_few)):
        page = viewer.get(PAGE + "?limit=200").content.decode()
    assert len(rows(page)) == 200


def test_a_rare_action_is_read_from_its_verbs_index_page_after_page_in_order(team, client):
    """Bench (bench/activity_page.py): ``?action=deleted`` on a log where deletions are 0.1% of entries read the
    project's whole log newest first until 50 matched (one ``verb IN (…)`` query, ordered by the log's index). Each verb
    is read from the (project, verb, newest) index, none sorted whole; the pages merge them in the log's order."""
    deletions = [Verb.RUN_DELETED, Verb.DATASET_DELETED, Verb.WEBHOOK_DELETED]
    with transaction.atomic():
        for index in range(90):
            verb = deletions[index % 3] if index % 2 else Verb.RUN_LAUNCHED
            activity_record(project=team.project, actor=team.owner, verb=verb, target=("run", f"x_{index:03}", "x"))
    deleted = [f"x_{index:03}" for index in reversed(range(90)) if index % 2]
    # 45, newest first, in three pages: none twice, none left out
    assert paged_through_its_index(team, client, f"{API}?action=deleted&limit=20", "activity_verb_newest") == deleted


def test_a_rare_action_of_one_kind_is_read_from_the_kind_and_verb_index(team, client):
    """Bench (bench/activity_page.py): ``?kind=run&action=deleted`` read the project's run entries newest first along
    the (project, kind, newest) index until 50 deletions matched (42 ms at 100,000 entries). Each verb is read from the
    (project, kind, verb, newest) index, a verb of another kind (a dataset's deletion) finding nothing at once, and the
    pages merge them in the log's order."""
    with transaction.atomic():
        for index in range(90):
            verb, kind = ((Verb.RUN_DELETED, "run") if index % 3 == 1 else (Verb.DATASET_DELETED, "dataset")
                          if index % 3 == 2 else (Verb.RUN_LAUNCHED, "run"))
            activity_record(project=team.project, actor=team.owner, verb=verb, target=(kind, f"x_{index:03}", "x"))
    deleted_runs = [f"x_{index:03}" for index in reversed(range(90)) if index % 3 == 1]
    # 30, newest first, in three pages: none twice, none left out
    assert paged_through_its_index(team, client, f"{API}?kind=run&action=deleted&limit=12",
                                   "activity_kind_verb_newest") == deleted_runs


def test_every_bad_filter_is_named_at_once(team, client_for, client):
    """QA (an edited address): a bad kind and a bad action were refused naming the kind alone; fixed, the action's
    refusal came next."""
    page = client_for(team.viewer).get(f"{PAGE}?kind=nothing&action=zapped")
    assert page.status_code == 400
    text = html.unescape(page.content.decode())
    assert "'nothing' is not a kind of object" in text and "'zapped' is not something the activity log records" in text
    answer = api_get(client, team.viewer, f"{API}?kind=nothing&action=zapped")
    assert answer.status_code == 400 and {"kind", "action"} <= answer.json()["errors"].keys()


def test_a_person_with_no_entries_stays_shown_in_the_filter(team, client_for):
    """QA (a link with ``?actor=`` of someone who did nothing here): the page said "No activity matches these
    filters" while its person filter showed "anyone", the name asked for gone from the form."""
    page = client_for(team.viewer).get(f"{PAGE}?actor=%3Cb%3Eghost%3C/b%3E").content.decode()
    assert 'id="activity-empty">No activity matches these filters.' in page
    assert "<option selected>&lt;b&gt;ghost&lt;/b&gt;</option>" in page
