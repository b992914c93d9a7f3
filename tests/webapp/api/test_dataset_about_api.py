"""The REST API's side of a dataset's "About this dataset" (GET shows it, PATCH sets it, as the dataset page does)
and of a base model's licence (GET base-models/<id>/ answers what its exports carry), against the OpenAPI
document's schemas."""
import json

from pydantic import TypeAdapter

from tests.webapp.factories import make_base_model, make_ready_version
from webapp.activity.models import Activity, Verb
from webapp.api import schemas
from webapp.datasets.models import Dataset


def dataset_path(dataset) -> str:
    return f"/api/v1/projects/alpha/datasets/{dataset.public_id}/"


def test_members_set_the_about_and_every_member_reads_it(world):
    team, apis, _sent = world
    dataset = make_ready_version(team.project, user=team.teammate).dataset
    status, body = apis["teammate"].call("PATCH", dataset_path(dataset), {
        "source": "HuggingFaceH4/ultrafeedback_binarized", "licence": "mit", "description": "<b>chats</b>"})
    assert status == 200, body
    assert (body["source"], body["licence"], body["description"]) == (
        "HuggingFaceH4/ultrafeedback_binarized", "mit", "<b>chats</b>")  # JSON: the text as written
    TypeAdapter(schemas.DatasetDetail).validate_json(json.dumps(body))
    status, body = apis["teammate"].call("PATCH", dataset_path(dataset), {"licence": ""})  # "" clears, the rest kept
    assert status == 200 and (body["source"], body["licence"]) == ("HuggingFaceH4/ultrafeedback_binarized", "")
    status, read = apis["viewer"].call("GET", dataset_path(dataset))
    assert status == 200 and read["source"] == "HuggingFaceH4/ultrafeedback_binarized"
    status, listed = apis["viewer"].call("GET", "/api/v1/projects/alpha/datasets/")
    assert listed["datasets"][0]["description"] == "<b>chats</b>"
    TypeAdapter(schemas.DatasetList).validate_json(json.dumps(listed))
    assert [entry.details for entry in Activity.objects.filter(verb=Verb.DATASET_CHANGED).order_by("id")] == [
        {"changed": ["source", "licence", "description"]}, {"changed": ["licence"]}]


def test_a_refused_patch_names_the_field_and_changes_nothing(world):
    team, apis, _sent = world
    dataset = make_ready_version(team.project, user=team.teammate).dataset
    for sent, field, said in (({"source": "org/chats", "licence": "x" * 101}, "licence", "at most 100"),
                              ({"licence": None}, "licence", "null is not a value of licence"),
                              ({"licence": 4}, "licence", ""),
                              ({"name": "renamed"}, "name", ""),
                              ({}, "__all__", "give at least one of source, licence, description")):
        status, body = apis["teammate"].call("PATCH", dataset_path(dataset), sent)
        assert status == 400 and field in body["errors"], (sent, body)
        assert said in " ".join(body["errors"][field]), (sent, body)
    refreshed = Dataset.objects.get(pk=dataset.pk)
    assert (refreshed.source, refreshed.licence, refreshed.name) == ("", "", dataset.name)


def test_a_patch_requires_a_member_and_outsiders_get_404(world):
    team, apis, _sent = world
    dataset = make_ready_version(team.project, user=team.teammate).dataset
    assert apis["viewer"].call("PATCH", dataset_path(dataset), {"licence": "mit"})[0] == 403
    assert apis["outsider"].call("PATCH", dataset_path(dataset), {"licence": "mit"})[0] == 404
    assert apis["anonymous"].call("PATCH", dataset_path(dataset), {"licence": "mit"})[0] == 401
    assert Dataset.objects.get(pk=dataset.pk).licence == ""


def test_the_openapi_document_describes_the_patch_and_the_licence(world):
    _team, apis, _sent = world
    document = apis["anonymous"].call("GET", "/api/v1/openapi.json")[1]
    dataset = document["paths"]["/api/v1/projects/{slug}/datasets/{dataset_id}/"]
    assert set(dataset) == {"get", "patch", "delete"}
    assert dataset["patch"]["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/DatasetUpdate")
    components = document["components"]["schemas"]
    assert {"source", "licence", "description"} <= set(components["DatasetOut"]["properties"])
    base_model = document["paths"]["/api/v1/projects/{slug}/base-models/{model_id}/"]["get"]
    assert base_model["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/BaseModelOut")
    assert components["BaseModelOut"]["properties"]["licence"]  # the list's items carry it too
    assert components["BaseModelList"]["properties"]["base_models"]["items"]["$ref"].endswith("/BaseModelOut")
    assert {"license", "license_name", "license_link", "files"} <= set(components["LicenceOut"]["properties"])


def test_a_base_model_answers_the_licence_its_exports_carry(world, models_root):
    team, apis, _sent = world
    folder = models_root / "licensed"
    folder.mkdir()
    (folder / "README.md").write_text("---\nlicense: llama3.2\nlicense_name: <b>Llama</b>\n"
                                      "license_link: https://www.llama.com/llama3_2/license/\n---\n# Llama\n")
    (folder / "LICENSE").write_text("terms")
    (folder / "NOTICE").write_bytes(b"x" * (2 << 20))
    licensed = make_base_model(team.project, name="licensed", path=str(folder))
    status, body = apis["viewer"].call("GET", f"/api/v1/projects/alpha/base-models/{licensed.public_id}/")
    assert status == 200, body
    assert body["licence"] == {"license": "llama3.2", "license_name": "<b>Llama</b>",
                               "license_link": "https://www.llama.com/llama3_2/license/", "files": ["LICENSE"],
                               "not_copied": [{"name": "NOTICE", "bytes": 2 << 20}], "stated": True,
                               "built_with_llama": True}
    TypeAdapter(schemas.BaseModelOut).validate_json(json.dumps(body))

    bare = models_root / "bare"
    bare.mkdir()
    unstated = make_base_model(team.project, name="bare", path=str(bare))
    body = apis["viewer"].call("GET", f"/api/v1/projects/alpha/base-models/{unstated.public_id}/")[1]
    assert body["licence"] == {"license": None, "license_name": None, "license_link": None, "files": [],
                               "not_copied": [], "stated": False, "built_with_llama": False}

    # A folder in another project's place is not read for this one: its README.md and files are theirs.
    theirs = models_root / "projects" / "alpha-elsewhere" / "theirs"
    theirs.mkdir(parents=True)
    (theirs / "README.md").write_text("---\nlicense: secret-terms\n---\n")
    borrowed = make_base_model(team.project, name="borrowed", path=str(theirs))
    body = apis["viewer"].call("GET", f"/api/v1/projects/alpha/base-models/{borrowed.public_id}/")[1]
    assert body["licence"] is None and "secret-terms" not in json.dumps(body)
    assert apis["outsider"].call("GET", f"/api/v1/projects/alpha/base-models/{licensed.public_id}/")[0] == 404

    # The list answers each model's licence as its detail does (one serializer), against the document's schema.
    status, listed = apis["viewer"].call("GET", "/api/v1/projects/alpha/base-models/")
    assert status == 200, listed
    TypeAdapter(schemas.BaseModelList).validate_json(json.dumps(listed))
    for model in (licensed, unstated, borrowed):
        detail = apis["viewer"].call("GET", f"/api/v1/projects/alpha/base-models/{model.public_id}/")[1]
        assert [one for one in listed["base_models"] if one["id"] == model.public_id] == [detail]
    assert "secret-terms" not in json.dumps(listed)
