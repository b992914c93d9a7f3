"""Every page says where its scripts may come from: Temper's own files only. A slip in escaping (model
output, a dataset's text, a run's name) would then put a script in the page that the browser does not
run; the browser test in tests/browser/test_hostile_text.py checks the pages keep working under it."""
from __future__ import annotations

import pytest


def _directives(response) -> dict[str, list[str]]:
    policy = response["Content-Security-Policy"]
    return {name: values for name, *values in (part.split() for part in policy.split(";") if part.strip())}


@pytest.mark.parametrize("path", ["/accounts/login/", "/admin/login/", "/p/alpha/", "/p/alpha/runs/",
                                  "/api/v1/openapi.json", "/healthz"])
def test_every_response_allows_only_temper_s_own_scripts(team, client_for, path):
    response = client_for(team.owner).get(path)
    assert response.status_code in (200, 302)  # the login page sends one logged in already on
    directives = _directives(response)
    assert directives["script-src"] == ["'self'", "'unsafe-eval'"]  # Plotly's WebGL charts compile shaders' glue code
    assert directives["default-src"] == ["'self'"]
    assert directives["object-src"] == ["'none'"]
    assert directives["base-uri"] == ["'none'"]
    assert directives["frame-ancestors"] == ["'none'"]
    assert directives["form-action"] == ["'self'"]


def test_a_404_carries_it_too(team, client_for):
    response = client_for(team.owner).get("/p/alpha/runs/run_nosuch/")
    assert response.status_code == 404
    assert "script-src 'self'" in response["Content-Security-Policy"]
