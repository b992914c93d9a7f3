"""An export's model card on its own page (``runs:artifact_card``): front matter as text, body through the safe
Markdown renderer, never raw HTML; the run page links the cards there are; outsiders and missing cards answer 404; the
provenance the worker hands the engine names the run's data."""
from pathlib import Path

from django.conf import settings

from webapp.runs import selectors, services
from webapp.runs.models import Artifact, ArtifactKind, Run, RunStatus

CARD = """---
library_name: transformers
model_name: '<script>alert(1)</script>'
---

# a <img src=x onerror=alert(2)> card

| setting | value |
| --- | --- |
| dataset | chats &lt;script&gt; |

[click](javascript:alert(3))
"""


def exported_run(team, catalog, *, card: str | None = CARD) -> Run:
    spec = {"task": "sft", "model": catalog.base_model.public_id, "data": {"train": catalog.sft.public_id},
            "train": {"max_steps": 2, "batch_size": 2}}
    run = services.run_create(project=team.project, spec=spec, user=team.teammate, name="carded")
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    export = Path(settings.DATA_ROOT) / "runs" / run.public_id / "export"
    export.mkdir(parents=True)
    (export / "config.json").write_text("{}")
    if card is not None:
        (export / "README.md").write_text(card)
    Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, path=str(export), step=2, size_bytes=2)
    return Run.objects.get(pk=run.pk)


def test_it_shows_the_card_escaped_and_the_run_page_links_it(team, catalog, client_for):
    run = exported_run(team, catalog)
    url = f"/p/{team.project.slug}/runs/{run.public_id}/artifacts/model/card/"
    page = client_for(team.viewer).get(url)
    text = page.content.decode()
    assert page.status_code == 200
    assert "model_name: &#x27;&lt;script&gt;alert(1)&lt;/script&gt;&#x27;" in text  # the front matter, as text
    card = text.split('<article class="card model-card markdown">')[1].split("</article>")[0]
    assert "<script>alert" not in text and "<script" not in card and "<img" not in card and "javascript:" not in card
    assert "&lt;img src=x onerror=alert(2)&gt;" in card and "<td>chats &lt;script&gt;</td>" in card
    detail = client_for(team.viewer).get(f"/p/{team.project.slug}/runs/{run.public_id}/").content.decode()
    assert f'href="{url}">Model card</a>' in detail


def test_it_requires_access(team, catalog, client_for):
    run = exported_run(team, catalog)
    assert client_for(team.outsider).get(
        f"/p/{team.project.slug}/runs/{run.public_id}/artifacts/model/card/").status_code == 404


def test_an_export_without_a_card_is_not_linked_and_its_page_says_why(team, catalog, client_for):
    run = exported_run(team, catalog, card=None)
    url = f"/p/{team.project.slug}/runs/{run.public_id}/artifacts/model/card/"
    answer = client_for(team.teammate).get(url)
    assert answer.status_code == 404 and b"exported before exports had one; export it again" in answer.content
    detail = client_for(team.teammate).get(f"/p/{team.project.slug}/runs/{run.public_id}/").content.decode()
    assert "Model card" not in detail


def test_the_provenance_names_the_project_the_run_its_author_its_base_model_and_its_data(team, catalog):
    spec = {"task": "sft", "model": catalog.base_model.public_id,
            "data": {"train": catalog.sft.public_id, "eval": catalog.sft.public_id},
            "train": {"max_steps": 2, "batch_size": 2}}
    run = services.run_create(project=team.project, spec=spec, user=team.teammate, name="with data")
    provenance = selectors.run_provenance(run=run)
    assert provenance | {"temper_version": None} == {
        "project": team.project.name, "run_name": "with data", "run_id": run.public_id,
        "author": team.teammate.get_username(), "temper_version": None,
        "base_model": {"name": catalog.base_model.name, "id": catalog.base_model.public_id},
        "datasets": [{"use": use, "name": "chats", "version": catalog.sft.number, "id": catalog.sft.public_id,
                      "rows": catalog.sft.row_count, "source": "", "licence": "", "description": ""}
                     for use in ("train", "eval")]}
    assert provenance["temper_version"]
    catalog.sft.delete()  # a version deleted since: named as the launch recorded it
    datasets = selectors.run_provenance(run=Run.objects.get(pk=run.pk))["datasets"]
    assert datasets == [{"use": use, "name": "chats", "version": catalog.sft.number, "id": catalog.sft.public_id,
                         "rows": None, "source": "", "licence": "", "description": ""} for use in ("train", "eval")]


def test_the_provenance_of_a_run_started_from_a_run_names_that_run_and_the_base_model_at_the_root(team, catalog):
    first = exported_run(team, catalog)
    spec = {"task": "sft", "model": first.public_id, "data": {"train": catalog.sft.public_id},
            "train": {"max_steps": 2, "batch_size": 2}}
    second = services.run_create(project=team.project, spec=spec, user=team.teammate, name="further")
    provenance = selectors.run_provenance(run=second)
    assert provenance["source_run"] == {"name": "carded", "id": first.public_id}
    assert provenance["base_model"] == {"name": catalog.base_model.name, "id": catalog.base_model.public_id}


def test_the_runs_notes_reach_the_card_as_quoted_text_and_the_page_shows_them_escaped(team, catalog, client_for):
    from tests.jaxengine.test_model_card import facts
    from jaxengine.model_card import build_model_card

    run = exported_run(team, catalog)
    Run.objects.filter(pk=run.pk).update(notes="## Why\n\nTo answer refunds <img src=x onerror=alert(1)> "
                                               "[here](javascript:alert(2)) politely.")
    provenance = selectors.run_provenance(run=Run.objects.get(pk=run.pk))
    assert provenance["notes"].startswith("## Why")
    card = build_model_card(facts(provenance=provenance, evaluated_on_training_data=True))
    (Path(run.artifacts.get().path) / "README.md").write_text(card)
    page = client_for(team.viewer).get(f"/p/{team.project.slug}/runs/{run.public_id}/artifacts/model/card/")
    body = page.content.decode().split('<article class="card model-card markdown">')[1].split("</article>")[0]
    assert "<h2>Intended use and limitations</h2>" in body
    assert ("<blockquote>\n<p>## Why To answer refunds &lt;img src=x onerror=alert(1)&gt; [here](javascript:alert(2)) "
            "politely.</p>\n</blockquote>") in body
    assert "<img" not in body and "javascript:" not in body.replace("[here](javascript:alert(2))", "")
    assert "The evaluation figures were measured on the training data" in body
    assert "notes" not in selectors.run_provenance(run=exported_run(team, catalog))
