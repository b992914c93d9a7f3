"""Project pages: list (home), create, overview, members."""
import pytest
from django.urls import reverse

from webapp.core.bidi import isolated
from webapp.projects.models import Membership, Project, Role


def assert_redirects_to_login(response, url):
    assert response.status_code == 302
    assert response["Location"] == f"{reverse('accounts:login')}?next={url}"


class TestProjectList:
    url = "/"

    def test_it_works(self, team, client_for):
        response = client_for(team.viewer).get(self.url)
        assert response.status_code == 200
        assert b"Project alpha" in response.content
        assert b"Elsewhere" not in response.content

    def test_it_requires_access(self, client, db):
        assert_redirects_to_login(client.get(self.url), self.url)


class TestProjectCreate:
    url = "/projects/new/"

    def test_it_works(self, team, client_for):
        client = client_for(team.viewer)
        assert client.get(self.url).status_code == 200
        response = client.post(self.url, {"name": "Reward models", "slug": "reward-models"})
        assert response.status_code == 302
        assert response["Location"] == "/p/reward-models/"
        project = Project.objects.get(slug="reward-models")
        assert Membership.objects.get(project=project, user=team.viewer).role == Role.OWNER

    def test_a_blank_slug_is_made_from_the_name(self, team, client_for):
        """QA: a newcomer typed a name and pressed Create; the browser only said to fill in the slug."""
        response = client_for(team.viewer).post(self.url, {"name": "Chat tuning: Ärger 2", "slug": ""})
        assert response.status_code == 302 and response["Location"] == "/p/chat-tuning-arger-2/"
        assert Project.objects.get(slug="chat-tuning-arger-2").name == "Chat tuning: Ärger 2"

    @pytest.mark.parametrize(("name", "message"), [
        ("Alpha", "a project with slug 'alpha' already exists; choose another"),
        ("Σοφία", "the name gives no slug (lower-case letters a-z, digits and hyphens); type one"),
    ])
    def test_a_slug_made_from_the_name_that_cannot_be_used_is_asked_for(self, team, client_for, name, message):
        response = client_for(team.viewer).post(self.url, {"name": name, "slug": ""})
        assert response.status_code == 400 and message in response.content.decode().replace("&#x27;", "'")
        assert 'value="Σοφία"' in response.content.decode() or name == "Alpha"

    def test_it_requires_access(self, client, db):
        assert_redirects_to_login(client.get(self.url), self.url)
        assert client.post(self.url, {"name": "x", "slug": "x"}).status_code == 302
        assert not Project.objects.filter(slug="x").exists()

    def test_when_only_staff_may_create_projects_others_are_refused_saying_so(self, team, client_for, settings):
        settings.TEMPER_PROJECT_CREATORS = "staff"
        client = client_for(team.owner)
        assert 'href="/projects/new/"' not in client.get("/").content.decode()
        for response in (client.get(self.url), client.post(self.url, {"name": "Side project", "slug": "side"})):
            assert response.status_code == 403
            assert ("Only staff may create projects on this Temper (TEMPER_PROJECT_CREATORS=staff): ask an "
                    "administrator to create it and make you its owner.") in response.content.decode()
        assert not Project.objects.filter(slug="side").exists()
        assert b"Ask an administrator to create a project" in client.get("/").content

    def test_when_only_staff_may_create_projects_staff_may(self, team, client_for, settings):
        settings.TEMPER_PROJECT_CREATORS = "staff"
        team.viewer.is_staff = True
        team.viewer.save()
        client = client_for(team.viewer)
        assert 'href="/projects/new/"' in client.get("/").content.decode()
        response = client.post(self.url, {"name": "Reward models", "slug": "reward-models"})
        assert (response.status_code, response["Location"]) == (302, "/p/reward-models/")

    def test_by_default_everyone_may_create_projects(self, team, client_for, settings):
        assert settings.TEMPER_PROJECT_CREATORS == "everyone"
        client = client_for(team.outsider)
        assert 'href="/projects/new/"' in client.get("/").content.decode()
        assert client.post(self.url, {"name": "Side project", "slug": "side"}).status_code == 302

    @pytest.mark.parametrize(
        ("data", "message"),
        [
            ({"name": "x", "slug": "Bad Slug"}, b"lower-case letters"),
            ({"name": "x", "slug": "alpha"}, b"already exists"),
            ({"name": "", "slug": "fine"}, b"This field is required"),
        ],
    )
    def test_it_rejects_bad_input(self, team, client_for, data, message):
        response = client_for(team.owner).post(self.url, data)
        assert response.status_code == 400
        assert message in response.content
        assert Project.objects.count() == 2


class TestProjectDetail:
    url = "/p/alpha/"

    def test_it_works(self, team, client_for):
        response = client_for(team.viewer).get(self.url)
        assert response.status_code == 200
        assert b"Project alpha" in response.content
        assert b"alpha-teammate" in response.content

    def test_it_leads_to_every_part_of_the_project_with_its_count(self, team, client_for):
        """The overview offered Datasets, Base models and Members only, with no figure but the members':
        no way to the runs or the review campaigns, nothing to say what the project holds."""
        from tests.webapp.factories import make_base_model, make_ready_version
        from webapp.runs.models import Run, RunStatus

        make_ready_version(team.project, name="chats")
        make_ready_version(team.project, name="pairs", kind="preference",
                           rows=[{"prompt": "p", "chosen": "a", "rejected": "b"}])
        make_base_model(team.project)
        for status, archived in ((RunStatus.RUNNING, False), (RunStatus.SUCCEEDED, False), (RunStatus.FAILED, True)):
            Run.objects.create(project=team.project, name=status, task="sft", status=status, archived=archived,
                               spec={}, resolved_spec={})
        Run.objects.create(project=team.outsider_project, name="theirs", task="sft", status=RunStatus.RUNNING,
                           spec={}, resolved_spec={})
        page = client_for(team.viewer).get(self.url).content.decode()
        tiles = page.split('<div class="grid tiles">')[1].split("</div>")[0]
        assert '<a class="card tile" href="/p/alpha/runs/"><h2>Runs</h2><p><b>2</b> runs, <b>1</b> queued or running.' in tiles
        assert '<a class="card tile" href="/p/alpha/review/"><h2>Review</h2><p><b>0</b> campaigns.' in tiles
        assert "<b>2</b> datasets." in tiles and "<b>1</b> registered." in tiles and "<b>3</b> members." in tiles

    def test_it_leads_to_the_evaluations_with_their_count(self, team, client_for):
        """The overview had a tile for every part but the evaluations: a team that scored its run on held-out
        prompts found no way from the project's page to the scores side by side."""
        from tests.webapp.factories import make_base_model, make_ready_version
        from webapp.evals.models import Evaluation

        version = make_ready_version(team.project, name="held-out", kind="prompts", rows=[{"prompt": "q", "answer": "a"}])
        base_model = make_base_model(team.project)
        for _ in range(2):
            Evaluation.objects.create(project=team.project, dataset_version=version, model_ref=base_model.public_id,
                                      model_label="Base model: tiny", version_label="held-out v1",
                                      metric="exact_match", row_limit=200, max_new_tokens=32)
        page = client_for(team.viewer).get(self.url).content.decode()
        tiles = page.split('<div class="grid tiles">')[1].split("</div>")[0]
        assert '<a class="card tile" href="/p/alpha/evaluations/"><h2>Evaluations</h2><p><b>2</b> evaluations.' in tiles

    def test_a_new_project_says_how_to_start_to_those_who_can(self, team, client_for):
        """The overview of a project with no run was five counters: nothing said what to do first."""
        page = client_for(team.teammate).get(self.url).content.decode()
        assert "Getting started" in page
        assert '<a href="/p/alpha/datasets/new/">Upload a dataset</a>: instruction pairs' in page  # no data yet
        assert '<a href="/p/alpha/models/register/">Register a base model</a>' in page
        assert '<a class="button primary" href="/p/alpha/runs/new/">Launch a run</a>' in page
        assert "/p/alpha/models/upload/" not in page, "a member may not upload a model"
        owner = client_for(team.owner).get(self.url).content.decode()
        assert ('server, or <a href="/p/alpha/models/upload/">upload one</a> as an archive), then launch a run.'
                in owner)
        viewer = client_for(team.viewer).get(self.url).content.decode()
        assert "Getting started" not in viewer and "Launch a run" not in viewer

    def test_it_lists_the_runs_going_on_then_the_newest_and_the_work_in_progress(self, team, client_for,
                                                                              django_assert_max_num_queries):
        """The overview showed counts only: a team opening its project could not see what was training, what
        had just finished, which review campaigns wanted answers or what data had come in."""
        from tests.webapp.factories import make_ready_version
        from tests.webapp.review.conftest import PREFERENCE_ROWS, create_loaded
        from webapp.review.models import Campaign, CampaignStatus
        from webapp.runs.models import Run, RunStatus

        def run(name, status, **fields):
            return Run.objects.create(project=team.project, name=name, task="sft", status=status, spec={},
                                      resolved_spec={}, **fields)

        running = run("training now", RunStatus.RUNNING, current_step=40, total_steps=100)
        for index in range(7):
            run(f"finished {index}", RunStatus.SUCCEEDED, final_metrics={"loss": {"last": 1.5 + index}})
        run("hidden", RunStatus.QUEUED, archived=True)
        make_ready_version(team.project, name="older")
        newest = make_ready_version(team.project, name="newest <b>data</b>")
        prefs = make_ready_version(team.project, name="prefs", kind="preference", rows=PREFERENCE_ROWS)
        create_loaded(project=team.project, name="open judging", guidelines="", required_reviews=1,
                      reviewers=[team.teammate], source_version=prefs, user=team.owner)
        one_pair = make_ready_version(team.project, name="one pair", kind="preference", rows=PREFERENCE_ROWS[:1])
        create_loaded(project=team.project, name="single pair", guidelines="", required_reviews=1,
                      reviewers=[team.teammate], source_version=one_pair, user=team.owner)
        Campaign.objects.create(project=team.project, name="waiting for votes", status=CampaignStatus.READY)
        Campaign.objects.create(project=team.project, name="broken", status=CampaignStatus.FAILED)
        Campaign.objects.create(project=team.project, name="stopped", status=CampaignStatus.CANCELLED)
        viewer = client_for(team.viewer)
        with django_assert_max_num_queries(15):  # a few queries whatever the project holds
            page = viewer.get(self.url).content.decode()
        runs = page.split('class="card overview-runs"')[1].split("</section>")[0]
        names = [row.split("</a>")[0].split(">")[-1] for row in runs.split("<tr data-run=")[1:]]
        assert names == ["training now", "finished 6", "finished 5", "finished 4", "finished 3", "finished 2"]
        assert f'data-run="{running.public_id}"' in runs and "40 / 100" in runs and '<td class="num">7.5</td>' in runs
        assert "hidden" not in runs and '<a class="more" href="/p/alpha/runs/">all runs →</a>' in runs
        data = page.split('class="card overview-versions"')[1].split("</section>")[0]
        assert data.index("<bdi>newest &lt;b&gt;data&lt;/b&gt;</bdi> v1") < data.index("<bdi>older</bdi> v1")  # escaped
        assert f"/p/alpha/datasets/{newest.dataset.public_id}/v/1/" in data
        campaigns = page.split('class="card overview-campaigns"')[1].split("</section>")[0]
        assert f"open judging</a>\n      <span class=\"muted\">0 / {len(PREFERENCE_ROWS)} items complete" in campaigns
        assert "single pair</a>\n      <span class=\"muted\">0 / 1 item complete" in campaigns  # not "1 items"
        assert "broken" not in campaigns and "waiting for votes" not in campaigns  # failed; nothing to review
        assert "stopped" not in campaigns  # its generation was cancelled: it takes no answers
        assert "Getting started" not in page

    def test_it_leaves_each_runs_series_cache_unread(self, team, client_for, django_assert_num_queries):
        """QA (page speed): the overview's runs were read whole, series_cache with them (the buckets a running
        run's writer keeps, the series a finished run keeps for the compare page: most of a megabyte each at ten
        metrics), for them and the runs they started from: 0.7 s at six such runs. Neither is read now, and the
        page reads as much for nine runs as for three."""
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        from webapp.runs.models import Run, RunStatus

        cache = {"buckets": {"width": 1, "metrics": {}}, "max_points": 1000, "series": {}}

        def runs(names: range) -> None:
            for index in names:
                source = Run.objects.create(project=team.project, name=f"source {index}", task="sft",
                                            status=RunStatus.SUCCEEDED, spec={}, resolved_spec={}, series_cache=cache)
                Run.objects.create(project=team.project, name=f"tuned {index}", task="sft", status=RunStatus.RUNNING,
                                   spec={}, resolved_spec={}, series_cache=cache, source_run=source)

        viewer = client_for(team.viewer)
        runs(range(3))
        viewer.get(self.url)  # the first load over (sessions read)
        with CaptureQueriesContext(connection) as for_three:
            page = viewer.get(self.url).content.decode()
        assert not [query["sql"] for query in for_three.captured_queries if "series_cache" in query["sql"]]
        assert "tuned 2" in page and "source 0" in page
        runs(range(3, 9))
        with django_assert_num_queries(len(for_three)):
            page = viewer.get(self.url).content.decode()
        assert "tuned 8" in page

    def test_it_requires_access(self, team, client, client_for):
        assert client_for(team.outsider).get(self.url).status_code == 404
        assert client_for(team.outsider).get("/p/no-such-project/").status_code == 404
        assert_redirects_to_login(client.get(self.url), self.url)


class TestMembers:
    url = "/p/alpha/members/"

    def test_it_works(self, team, client_for):
        response = client_for(team.viewer).get(self.url)
        assert response.status_code == 200
        assert b"alpha-viewer" in response.content
        assert b"Add a member" not in response.content
        owner_page = client_for(team.owner).get(self.url)
        assert b"Add a member" in owner_page.content

    def test_owner_adds_a_member_by_username(self, team, client_for):
        response = client_for(team.owner).post(self.url, {"username": "alpha-outsider", "role": "viewer"})
        assert response.status_code == 302
        assert Membership.objects.get(project=team.project, user=team.outsider).role == Role.VIEWER

    def test_it_requires_access(self, team, client, client_for):
        assert client_for(team.outsider).get(self.url).status_code == 404
        assert client_for(team.outsider).post(self.url, {"username": "alpha-outsider", "role": "owner"}).status_code == 404
        assert_redirects_to_login(client.get(self.url), self.url)
        assert not Membership.objects.filter(project=team.project, user=team.outsider).exists()

    @pytest.mark.parametrize("role_holder", ["viewer", "teammate"])
    def test_only_owners_manage_members(self, team, client_for, role_holder):
        client = client_for(getattr(team, role_holder))
        assert client.post(self.url, {"username": "alpha-outsider", "role": "member"}).status_code == 403
        assert client.post(self.url + "role/", {"username": "alpha-viewer", "role": "owner"}).status_code == 403
        someone_else = "alpha-teammate" if role_holder == "viewer" else "alpha-viewer"  # leaving is theirs to do
        assert client.post(self.url + "remove/", {"username": someone_else}).status_code == 403
        assert client.post(self.url + "remove/", {}).status_code == 403
        assert Membership.objects.filter(project=team.project).count() == 3
        assert Membership.objects.get(project=team.project, user=team.viewer).role == Role.VIEWER

    @pytest.mark.parametrize(
        ("data", "message"),
        [
            ({"username": "nobody", "role": "member"}, b"no active user is named"),
            ({"username": "alpha-teammate", "role": "viewer"}, b"already a member"),
            ({"username": "alpha-outsider", "role": "admin"}, b"not one of the available choices"),
        ],
    )
    def test_it_rejects_bad_member(self, team, client_for, data, message):
        response = client_for(team.owner).post(self.url, data)
        assert response.status_code == 400
        assert message in response.content
        assert Membership.objects.filter(project=team.project).count() == 3

    def test_an_unknown_username_says_who_makes_accounts(self, team, client_for):
        """QA: "check the spelling" left an owner looking for a sign-up page; only an administrator makes
        accounts, in the admin site."""
        response = client_for(team.owner).post(self.url, {"username": "newcomer", "role": "member"})
        assert response.status_code == 400
        assert b"only an administrator makes accounts" in response.content
        assert b"/admin/auth/user/add/" in response.content

    def test_owner_changes_a_role(self, team, client_for):
        response = client_for(team.owner).post(self.url + "role/", {"username": "alpha-viewer", "role": "member"})
        assert response.status_code == 302
        assert Membership.objects.get(project=team.project, user=team.viewer).role == Role.MEMBER

    def test_it_rejects_demoting_or_removing_the_last_owner_on_the_members_page(self, team, client_for):
        """A refused change was shown at the address it was posted to (/members/role/), which a reload
        posts again and a GET answers 405: the members page now says why, at its own address."""
        client = client_for(team.owner)
        for action, data in (("role/", {"username": "alpha-owner", "role": "viewer"}),
                             ("remove/", {"username": "alpha-owner"})):
            response = client.post(self.url + action, data, follow=True)
            assert response.redirect_chain == [(self.url, 302)]
            assert response.status_code == 200 and response.request["PATH_INFO"] == self.url
            assert (f"alpha-owner is the last owner of {isolated('Project alpha')}; make someone else owner "
                    "first") in response.content.decode()  # the project's name, not its slug
            assert b'id="members"' in response.content
        assert Membership.objects.get(project=team.project, user=team.owner).role == Role.OWNER

    def test_removing_a_member_asks_first(self, team, client_for):
        """The Remove button removed at once; it now opens what removing does, with a second button."""
        page = client_for(team.owner).get(self.url).content.decode()
        row = page.split("<td>alpha-viewer</td>")[1].split("</tr>")[0]
        confirm = row.split('<details class="confirm">')[1].split("</details>")[0]
        assert "<summary>Remove…</summary>" in confirm
        assert "<bdi>alpha-viewer</bdi> loses access to <bdi>Project alpha</bdi>" in confirm
        assert ("leaves the reviewers of its review campaigns (their answers stay): added again, they review only "
                "where an owner ticks them.") in confirm
        assert "Their API tokens for this project (<code>tpk_…</code>) are revoked." in confirm
        assert '<button type="submit" class="danger">Remove <bdi>alpha-viewer</bdi></button>' in confirm
        assert '<button type="submit" class="danger">Remove</button>' not in page
        own_row = page.split("<td>alpha-owner</td>")[1].split("</tr>")[0]
        assert "You lose access to <bdi>Project alpha</bdi>" in own_row
        assert "Your API tokens for this project (<code>tpk_…</code>) are revoked." in own_row

    def test_it_rejects_unknown_member(self, team, client_for):
        """QA: a change posted for someone who is not a member answered the 404 page ("it belongs to a project
        you are not a member of"), as if the owner had lost the project. Two owners with the page open: one
        removes a member, the other then changes that member's role or removes them too (or presses Remove
        twice). The members page now says who is not a member and that nothing changed."""
        client = client_for(team.owner)
        for action, data, username in (("role/", {"username": "alpha-outsider", "role": "member"}, "alpha-outsider"),
                                        ("remove/", {"username": "nobody"}, "nobody")):
            response = client.post(self.url + action, data, follow=True)
            assert response.redirect_chain == [(self.url, 302)]
            assert (f"{username} is not a member of {isolated('Project alpha')}: an owner may have removed them "
                    "since this page was shown; nothing changed") in response.content.decode()
            assert b'id="members"' in response.content
        assert not Membership.objects.filter(project=team.project, user=team.outsider).exists()
        response = client.post(self.url + "role/", {"username": "alpha-viewer", "role": "<b>boss</b>"}, follow=True)
        assert response.redirect_chain == [(self.url, 302)]
        assert b"&lt;b&gt;boss&lt;/b&gt; is not one of the available choices" in response.content
        assert Membership.objects.get(project=team.project, user=team.viewer).role == Role.VIEWER

    def test_owner_removes_a_member(self, team, client_for):
        response = client_for(team.owner).post(self.url + "remove/", {"username": "alpha-teammate"})
        assert response.status_code == 302
        assert not Membership.objects.filter(project=team.project, user=team.teammate).exists()
        assert client_for(team.teammate).get("/p/alpha/").status_code == 404

    def test_a_member_leaves_but_removes_no_one_else_and_the_last_owner_stays(self, team, client_for):
        viewer = client_for(team.viewer)
        page = viewer.get(self.url).content.decode()
        assert "Leave this project…" in page and 'name="username" value="alpha-viewer"' in page
        assert "Your API tokens for this project (<code>tpk_…</code>) are revoked." in page
        assert viewer.post(self.url + "remove/", {"username": "alpha-teammate"}).status_code == 403
        assert Membership.objects.filter(project=team.project, user=team.teammate).exists()
        response = viewer.post(self.url + "remove/", {"username": "alpha-viewer"})
        assert response.status_code == 302 and response["Location"] == "/"
        # QA: it read "alpha-viewer removed from …", as if someone else had removed them.
        assert f"You left {isolated(team.project.name)}." in viewer.get("/").content.decode()
        assert not Membership.objects.filter(project=team.project, user=team.viewer).exists()
        assert viewer.get("/p/alpha/").status_code == 404
        # The last owner is refused (the project would have no one to manage it), with the reason.
        owner = client_for(team.owner)
        assert "Leave this project…" not in owner.get(self.url).content.decode()  # owners use the table's Remove
        response = owner.post(self.url + "remove/", {"username": "alpha-owner"}, follow=True)
        assert b"is the last owner of" in response.content
        assert Membership.objects.filter(project=team.project, user=team.owner).exists()

    def test_membership_changes_need_post(self, team, client_for):
        client = client_for(team.owner)
        assert client.get(self.url + "remove/").status_code == 405
        assert client.get(self.url + "role/").status_code == 405


def test_viewers_are_not_offered_chat_and_arena_which_would_answer_403(team, client_for):
    for user, offered in ((team.viewer, False), (team.teammate, True), (team.owner, True)):
        page = client_for(user).get("/p/alpha/datasets/").content.decode()
        assert ('href="/p/alpha/chat/"' in page) is offered and ('href="/p/alpha/arena/"' in page) is offered
        assert client_for(user).get("/p/alpha/chat/").status_code == (200 if offered else 403)
