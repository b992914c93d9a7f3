"""The project's Settings page (``/p/<slug>/settings/``): owners rename and describe the project (the slug stays);
members and viewers get 403, outsiders 404; the overview shows the description under the name and the project list
its first words, escaped."""
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils.html import escape

from webapp.activity.models import Activity, Verb
from webapp.api.services import token_create
from webapp.projects.models import Project

PAGE = "/p/alpha/settings/"


def test_an_owner_renames_and_describes_the_project(team, client_for):
    client = client_for(team.owner)
    page = client.get(PAGE).content.decode()
    assert 'value="Project alpha"' in page and "<code>alpha</code>, stays as it is" in page
    response = client.post(PAGE, {"name": "Reward models", "description": "Scoring answers.\r\nSecond line."})
    assert response.status_code == 302 and response["Location"] == PAGE
    project = Project.objects.get(pk=team.project.pk)
    assert (project.name, project.slug, project.description) == ("Reward models", "alpha",
                                                                 "Scoring answers.\nSecond line.")
    assert "Saved the settings of \u2068Reward models\u2069." in client.get(PAGE).content.decode()
    overview = client.get("/p/alpha/").content.decode()
    assert '<p class="project-description text">Scoring answers.<br>Second line.</p>' in overview
    assert Activity.objects.filter(project=project, verb=Verb.PROJECT_CHANGED).count() == 1
    log = client_for(team.viewer).get("/p/alpha/activity/").content.decode()
    assert "changed the project" in log
    assert "changed: name, description; name was: Project alpha; renamed to: Reward models" in log


def test_a_refusal_names_the_field_and_keeps_what_was_typed(team, client_for):
    response = client_for(team.owner).post(PAGE, {"name": "Project\u200balpha", "description": "kept text"})
    assert response.status_code == 400
    page = response.content.decode()
    assert 'id="id_name_error"' in page and "U+200B (ZERO WIDTH SPACE)" in page
    assert 'value="Project\u200balpha"' in page and "\nkept text</textarea>" in page
    project = Project.objects.get(pk=team.project.pk)
    assert (project.name, project.description) == ("Project alpha", "")
    assert not Activity.objects.filter(verb=Verb.PROJECT_CHANGED).exists()


def test_it_is_the_owners_alone(team, client_for):
    for user in (team.teammate, team.viewer):
        client = client_for(user)
        assert client.get(PAGE).status_code == 403
        assert client.post(PAGE, {"name": "taken over", "description": ""}).status_code == 403
        assert 'href="/p/alpha/settings/"' not in client.get("/p/alpha/").content.decode()
    outsider = client_for(team.outsider)
    assert outsider.get(PAGE).status_code == 404
    assert outsider.post(PAGE, {"name": "taken over", "description": ""}).status_code == 404
    assert Project.objects.get(pk=team.project.pk).name == "Project alpha"
    assert 'href="/p/alpha/settings/"' in client_for(team.owner).get("/p/alpha/").content.decode()


def test_the_description_is_escaped_on_the_overview_and_in_the_list(team, client_for):
    hostile = '<script>alert("x")</script> and **not markdown**'
    Project.objects.filter(pk=team.project.pk).update(description=hostile)
    client = client_for(team.viewer)
    for address in ("/p/alpha/", "/"):
        page = client.get(address).content.decode()
        assert "<script>alert" not in page and escape('<script>alert("x")</script>') in page, address
        assert "**not markdown**" in page and "<strong>" not in page, address


def test_the_list_shows_a_one_line_excerpt(team, client_for):
    Project.objects.filter(pk=team.project.pk).update(description="First words. " + "more " * 100)
    page = client_for(team.owner).get("/").content.decode()
    excerpt = page.split('class="muted project-excerpt text">')[1].split("</small>")[0]
    assert excerpt.startswith("First words. ") and excerpt.endswith("…") and len(excerpt) == 120


def test_a_blank_name_is_refused_in_the_services_words(team, client_for):
    # The page said Django's generic "This field is required."; the API and the service say what is wrong.
    client = client_for(team.owner)
    for blank in ("", "   "):
        response = client.post(PAGE, {"name": blank, "description": "kept text"})
        assert response.status_code == 400
        page = response.content.decode()
        assert "the project name must not be empty" in page and "This field is required." not in page
        assert 'id="id_name_error"' in page and "\nkept text</textarea>" in page
    token = token_create(user=team.owner, name="settings")[1]
    api = Client(headers={"Authorization": f"Bearer {token}"}).patch(
        "/api/v1/projects/alpha/", {"name": " "}, content_type="application/json")
    assert api.status_code == 400 and api.json()["errors"]["name"] == ["the project name must not be empty"]
    assert Project.objects.get(pk=team.project.pk).name == "Project alpha"
    assert not Activity.objects.filter(verb=Verb.PROJECT_CHANGED).exists()


def test_the_admin_site_shows_name_and_description_read_only_pointing_to_the_settings_page(team, client_for):
    # Saved there, a rename skipped project_update's checks and left no activity entry.
    Project.objects.filter(pk=team.project.pk).update(description="<b>not bold</b>")
    client = client_for(get_user_model().objects.create_superuser("root", password="unused-password"))
    address = f"/admin/projects/project/{team.project.pk}/change/"
    page = client.get(address).content.decode()
    assert 'name="name"' not in page and 'name="description"' not in page
    assert "Project alpha" in page and escape("<b>not bold</b>") in page and "<b>not bold</b>" not in page
    assert f'href="{PAGE}"' in page
    response = client.post(address, {"name": "Renamed in admin", "description": "<i>changed</i>",
                                     "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0"})
    assert response.status_code == 302
    project = Project.objects.get(pk=team.project.pk)
    assert (project.name, project.description) == ("Project alpha", "<b>not bold</b>")
    assert not Activity.objects.filter(verb=Verb.PROJECT_CHANGED).exists()
    # A new project is still named in the admin: the add page has no Settings page to point to.
    assert 'name="name"' in client.get("/admin/projects/project/add/").content.decode()


def test_a_long_name_is_refused_in_the_services_words(team, client_for):
    # Past the form's max_length the page said Django's "Ensure this value has at most 100 characters (it has 101)."
    response = client_for(team.owner).post(PAGE, {"name": "n" * 101, "description": ""})
    assert response.status_code == 400
    page = response.content.decode()
    assert "101 characters; at most 100" in page and "Ensure this value" not in page
    assert 'maxlength="100"' in page  # the browser still stops at 100
    assert Project.objects.get(pk=team.project.pk).name == "Project alpha"


def test_the_admin_site_deletes_no_project_pointing_to_the_settings_page(team, client_for, tmp_path, settings):
    # Deleted there, a project went without project_delete: no refusal while its work was in flight, and its dataset
    # files and run directories stayed on disk with nothing pointing to them.
    client = client_for(get_user_model().objects.create_superuser("root", password="unused-password"))
    change = f"/admin/projects/project/{team.project.pk}/change/"
    page = client.get(change).content.decode()
    assert f"/admin/projects/project/{team.project.pk}/delete/" not in page and "danger zone" in page
    assert client.post(f"/admin/projects/project/{team.project.pk}/delete/", {"post": "yes"}).status_code == 403
    listing = client.get("/admin/projects/project/").content.decode()
    assert 'value="delete_selected"' not in listing
    assert client.post("/admin/projects/project/", {"action": "delete_selected", "_selected_action": [team.project.pk],
                                                    "post": "yes"}).status_code in (200, 302)
    assert Project.objects.filter(pk=team.project.pk).exists()

def test_the_admin_site_adds_a_project_through_the_service_with_its_owner(team, client_for, models_root):
    """QA: the admin's add page saved the row itself: no slug rules, reserved names or left-over models folder
    refused, and the project had no owner until a membership was added inline. It now asks for an owner and calls
    services.project_create, whose refusals show on the form, naming the field, with nothing saved."""
    client = client_for(get_user_model().objects.create_superuser("root", password="unused-password"))
    address = "/admin/projects/project/add/"
    page = client.get(address).content.decode()
    assert 'name="owner"' in page and 'name="memberships-TOTAL_FORMS"' not in page
    (models_root / "projects" / "left-over").mkdir(parents=True)
    slugs = set(Project.objects.values_list("slug", flat=True))
    for fields, message in (
            ({"name": "Reserved", "slug": "new"}, "slug &#x27;new&#x27; is reserved; choose another"),
            ({"name": "Bad slug", "slug": "Bad_Slug"}, "must be 1-50 lower-case letters"),
            ({"name": "Taken", "slug": "alpha"}, "a project with slug &#x27;alpha&#x27; already exists"),
            ({"name": "Left over", "slug": "left-over"}, "the models root already has a folder"),
            ({"name": "Project\u200bbeta", "slug": "beta"}, "U+200B (ZERO WIDTH SPACE)"),
            ({"name": "No owner", "slug": "no-owner", "owner": ""}, "This field is required.")):
        response = client.post(address, {"owner": team.teammate.pk, **fields})
        assert response.status_code == 200 and message in response.content.decode(), fields
        assert 'class="errorlist' in response.content.decode(), fields
    assert set(Project.objects.values_list("slug", flat=True)) == slugs
    response = client.post(address, {"name": "Side project", "slug": "", "owner": team.teammate.pk})
    project = Project.objects.get(slug="side-project")
    assert response.status_code == 302 and response["Location"] == "/admin/projects/project/"
    assert list(project.memberships.values_list("user__username", "role")) == [(team.teammate.username, "owner")]
    assert client_for(team.teammate).get("/p/side-project/settings/").status_code == 200
