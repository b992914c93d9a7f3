"""A dataset's "About this dataset" (source, licence, description): set by members on the dataset page
(``datasets:about``) through ``services.dataset_about_update``, refused field by field with nothing half-saved, shown
escaped (a source a link only when http(s)), logged by the names of the fields changed; and recorded at a run's
launch, so the model card's provenance says what the data's terms were then."""
import pytest
from django.core.exceptions import ValidationError

from tests.webapp.factories import make_base_model, make_ready_version
from webapp.activity.models import Activity, Verb
from webapp.datasets import services
from webapp.datasets.models import Dataset
from webapp.runs import selectors as run_selectors
from webapp.runs import services as run_services
from webapp.runs.models import Run

HOSTILE = '<script>alert(1)</script> "quoted" & <b>bold</b>'


@pytest.fixture
def dataset(team):
    return make_ready_version(team.project, user=team.teammate).dataset


def about_url(team, dataset):
    return f"/p/{team.project.slug}/datasets/{dataset.public_id}/about/"


def page_url(team, dataset):
    return f"/p/{team.project.slug}/datasets/{dataset.public_id}/"


def about_of(dataset):
    dataset = Dataset.objects.get(pk=dataset.pk)
    return dataset.source, dataset.licence, dataset.description


def test_it_works(team, dataset):
    services.dataset_about_update(dataset=dataset, user=team.teammate, source="  https://data.example/chats ",
                                  licence="cc-by-4.0", description="Support chats,\r\nanonymised.\n")
    assert about_of(dataset) == ("https://data.example/chats", "cc-by-4.0", "Support chats,\nanonymised.")
    entry = Activity.objects.get(verb=Verb.DATASET_CHANGED)
    assert (entry.actor, entry.target_id, entry.details) == (team.teammate, dataset.public_id,
                                                            {"changed": ["source", "licence", "description"]})


def test_a_field_left_out_is_kept_and_only_changed_fields_are_logged(team, dataset):
    services.dataset_about_update(dataset=dataset, user=team.teammate, source="org/chats", licence="mit")
    services.dataset_about_update(dataset=dataset, user=team.owner, licence="apache-2.0", source="org/chats")
    services.dataset_about_update(dataset=dataset, user=team.owner, licence="apache-2.0")  # nothing changed
    assert about_of(dataset) == ("org/chats", "apache-2.0", "")
    assert [entry.details for entry in Activity.objects.filter(verb=Verb.DATASET_CHANGED).order_by("id")] == [
        {"changed": ["source", "licence"]}, {"changed": ["licence"]}]


@pytest.mark.parametrize("fields, field, said", [
    ({"source": "https://x.example/" + "a" * 500}, "source", "at most 500"),
    ({"licence": "x" * 101}, "licence", "at most 100"),
    ({"description": "x" * 2001}, "description", "at most 2,000"),
    ({"licence": "cc-by\n4.0"}, "licence", "the licence is one line"),
    ({"source": "org/na\u200bme"}, "source", "U+200B"),
    ({"description": "a\x00b"}, "description", "NUL"),
])
def test_it_rejects_bad_input_naming_the_field_and_saves_nothing(team, dataset, fields, field, said):
    with pytest.raises(ValidationError) as refused:
        services.dataset_about_update(dataset=dataset, user=team.teammate, **{"source": "kept/nothing", **fields})
    assert list(refused.value.message_dict) == [field] and said in refused.value.message_dict[field][0]
    assert about_of(dataset) == ("", "", "") and not Activity.objects.filter(verb=Verb.DATASET_CHANGED).exists()


def test_members_edit_it_on_the_page_and_everyone_reads_it_escaped(team, dataset, client_for):
    answer = client_for(team.teammate).post(about_url(team, dataset), {
        "source": "https://data.example/chats?a=1&b=2", "licence": HOSTILE, "description": f"line one\n{HOSTILE}"})
    assert answer.status_code == 302 and answer["Location"] == page_url(team, dataset)
    page = client_for(team.viewer).get(page_url(team, dataset)).content.decode()
    assert '<a href="https://data.example/chats?a=1&amp;b=2" rel="noopener noreferrer nofollow">' in page
    assert "<script>alert(1)" not in page and "<b>bold" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &quot;quoted&quot; &amp; &lt;b&gt;bold&lt;/b&gt;" in page
    assert "line one<br>&lt;script&gt;" in page
    assert 'id="about-form"' not in page  # a viewer reads it, and has no form


@pytest.mark.parametrize("source", ["javascript:alert(1)", "data:text/html,<script>alert(1)</script>",
                                    "ftp://files.example/x", "our S3 bucket"])
def test_a_source_that_is_no_web_address_is_shown_as_text(team, dataset, client_for, source):
    services.dataset_about_update(dataset=dataset, user=team.teammate, source=source)
    page = client_for(team.teammate).get(page_url(team, dataset)).content.decode()
    about = page.split('id="about"')[1].split("</dl>")[0]
    assert "<a " not in about and "<script>" not in about


def test_a_refusal_on_the_page_names_the_field_keeps_what_was_sent_and_saves_nothing(team, dataset, client_for):
    answer = client_for(team.teammate).post(about_url(team, dataset), {
        "source": "https://data.example/chats", "licence": "x" * 101, "description": "kept in the form"})
    text = answer.content.decode()
    assert answer.status_code == 400 and 'id="id_licence_error"' in text
    assert "kept in the form</textarea>" in text and "<details open>" in text
    answer = client_for(team.teammate).post(about_url(team, dataset), {"source": "org/na\u200bme"})
    assert answer.status_code == 400 and "U+200B" in answer.content.decode()
    assert about_of(dataset) == ("", "", "")


def test_it_requires_a_member(team, dataset, client_for):
    sent = {"licence": "mit"}
    assert client_for(team.viewer).post(about_url(team, dataset), sent).status_code == 403
    assert client_for(team.outsider).post(about_url(team, dataset), sent).status_code == 404
    assert client_for(team.outsider).get(page_url(team, dataset)).status_code == 404
    other = make_ready_version(team.outsider_project, name="theirs").dataset
    assert client_for(team.teammate).post(about_url(team, other), sent).status_code == 404
    assert about_of(dataset) == ("", "", "") and about_of(other) == ("", "", "")
    assert client_for(team.owner).post(about_url(team, dataset), sent).status_code == 302
    assert about_of(dataset) == ("", "mit", "")


def test_a_runs_provenance_carries_the_about_its_launch_saw(team, dataset):
    services.dataset_about_update(dataset=dataset, user=team.teammate, source="org/chats", licence="cc-by-4.0",
                                  description="chats")
    version = dataset.versions.get()
    spec = {"task": "sft", "model": make_base_model(team.project).public_id, "data": {"train": version.public_id},
            "train": {"max_steps": 2, "batch_size": 2}}
    run = run_services.run_create(project=team.project, spec=spec, user=team.teammate, name="launched")
    services.dataset_about_update(dataset=dataset, user=team.teammate, licence="changed after launch")
    launched = {"source": "org/chats", "licence": "cc-by-4.0", "description": "chats"}
    (entry,) = run_selectors.run_provenance(run=Run.objects.get(pk=run.pk))["datasets"]
    assert entry == {"use": "train", "name": "chats", "version": 1, "id": version.public_id, "rows": 8, **launched}
    version.delete()  # deleted since: still named with what its launch recorded
    (entry,) = run_selectors.run_provenance(run=Run.objects.get(pk=run.pk))["datasets"]
    assert entry == {"use": "train", "name": "chats", "version": 1, "id": version.public_id, "rows": None, **launched}


def test_a_run_launched_before_launches_recorded_it_reads_the_datasets_about_now(team, dataset):
    version = dataset.versions.get()
    spec = {"task": "sft", "model": make_base_model(team.project).public_id, "data": {"train": version.public_id},
            "train": {"max_steps": 2, "batch_size": 2}}
    run = run_services.run_create(project=team.project, spec=spec, user=team.teammate, name="older")
    Run.objects.filter(pk=run.pk).update(dataset_names={version.public_id: {"name": "chats", "number": 1}})
    services.dataset_about_update(dataset=dataset, user=team.teammate, licence="mit")
    (entry,) = run_selectors.run_provenance(run=Run.objects.get(pk=run.pk))["datasets"]
    assert (entry["source"], entry["licence"], entry["description"]) == ("", "mit", "")
