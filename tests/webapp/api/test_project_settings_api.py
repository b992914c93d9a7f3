"""``GET``/``PATCH /api/v1/projects/<slug>/``: the project with its description, renamed and described by its owners
as on its Settings page (members and viewers 403, outsiders 404), and ``GET /api/v1/projects/`` listing the
description; each answer is what the OpenAPI document says."""
from __future__ import annotations

import json

from pydantic import TypeAdapter

from webapp.activity.models import Activity, Verb
from webapp.api import schemas
from webapp.projects.models import Project

ADDRESS = "/api/v1/projects/alpha/"


def test_an_owner_renames_and_describes_the_project(world):
    team, apis, _sent = world
    status, body = apis["owner"].call("PATCH", ADDRESS, {"description": "Scoring answers.\nSecond line."})
    assert status == 200, body
    assert (body["slug"], body["name"], body["description"], body["role"]) == (
        "alpha", "Project alpha", "Scoring answers.\nSecond line.", "owner")
    assert "webhooks" in body["urls"]
    status, body = apis["owner"].call("PATCH", ADDRESS, {"name": " Reward models "})
    assert status == 200 and (body["name"], body["description"]) == ("Reward models", "Scoring answers.\nSecond line.")
    TypeAdapter(schemas.ProjectOut).validate_json(json.dumps(body))
    assert Activity.objects.filter(project=team.project, verb=Verb.PROJECT_CHANGED).count() == 2
    # Every member reads it, and the list carries the description too.
    status, read = apis["viewer"].call("GET", ADDRESS)
    assert status == 200 and read["description"] == "Scoring answers.\nSecond line." and read["role"] == "viewer"
    TypeAdapter(schemas.ProjectOut).validate_json(json.dumps(read))
    listed = apis["viewer"].call("GET", "/api/v1/projects/")[1]
    assert [(project["name"], project["description"]) for project in listed["projects"]] == [
        ("Reward models", "Scoring answers.\nSecond line.")]
    TypeAdapter(schemas.ProjectList).validate_json(json.dumps(listed))


def test_a_bad_body_is_a_400_naming_the_field_and_changes_nothing(world):
    team, apis, _sent = world
    for sent, field, says in (
            ({"name": "  "}, "name", "must not be empty"),
            ({"name": "Project\u200balpha", "description": "kept?"}, "name", "U+200B"),
            ({"description": "x" * 2001}, "description", "2,001 characters; at most 2,000"),
            ({"description": None}, "description", "null is not a value of description"),
            ({"slug": "renamed"}, "slug", "unknown key"),
            ({}, "__all__", "give at least one of name, description")):
        status, body = apis["owner"].call("PATCH", ADDRESS, sent)
        assert status == 400 and list(body["errors"]) == [field] and says in body["errors"][field][0], (sent, body)
    project = Project.objects.get(pk=team.project.pk)
    assert (project.name, project.slug, project.description) == ("Project alpha", "alpha", "")
    assert not Activity.objects.filter(verb=Verb.PROJECT_CHANGED).exists()


def test_only_owners_change_it_and_outsiders_learn_nothing(world):
    team, apis, _sent = world
    for role in ("teammate", "viewer"):
        status, body = apis[role].call("PATCH", ADDRESS, {"name": "taken over"})
        assert status == 403 and "owner" in body["detail"], body
    assert apis["outsider"].call("PATCH", ADDRESS, {"name": "taken over"})[0] == 404
    assert apis["outsider"].call("GET", ADDRESS)[0] == 404
    assert apis["anonymous"].call("GET", ADDRESS)[0] == 401
    assert Project.objects.get(pk=team.project.pk).name == "Project alpha"


def test_the_openapi_document_describes_it(world):
    _team, apis, _sent = world
    document = apis["anonymous"].call("GET", "/api/v1/openapi.json")[1]
    operations = document["paths"]["/api/v1/projects/{slug}/"]
    assert set(operations) == {"get", "patch"}
    assert operations["patch"]["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ProjectUpdate"}
    assert "403" in operations["patch"]["responses"] and "slug never changes" in operations["patch"]["summary"]
    assert "description" in document["components"]["schemas"]["ProjectOut"]["required"]
