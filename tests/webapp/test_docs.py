"""docs/architecture.md's table of apps names every model and every page (URL name) of each app, so a
reader who meets one in the code finds it described."""
import re
from pathlib import Path

import pytest
from django.apps import apps
from django.urls import URLPattern, get_resolver

ROOT = Path(__file__).resolve().parents[2]


def app_rows() -> dict[str, str]:
    """``{app label: its table row}``: the rows that start with an app name in backticks."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    return {match.group(1): match.group(0) for match in re.finditer(r"^\| `(\w+)` \|.*$", text, re.M)}


def url_names(namespace: str) -> list[str]:
    """The URL names of ``namespace``, less its REST endpoints (the table sums them up as ``/api/v1/``)."""
    patterns = get_resolver().namespace_dict[namespace][1].url_patterns
    return [pattern.name for pattern in patterns
            if isinstance(pattern, URLPattern) and pattern.name and not str(pattern.pattern).startswith("api/v1/")]


def webapp_labels() -> list[str]:
    """Every app of ``webapp/``: parametrizing over the table's own rows let an app with no row (``chat``) pass."""
    return [config.label for config in apps.get_app_configs() if config.name.startswith("webapp.")]


def test_the_architecture_table_has_a_row_for_every_app():
    assert sorted(set(webapp_labels()) - set(app_rows())) == []


@pytest.mark.parametrize("label", webapp_labels())
def test_the_architecture_table_names_every_model_of_the_app(label):
    row = app_rows().get(label, "")
    missing = [model.__name__ for model in apps.get_app_config(label).get_models() if f"`{model.__name__}`" not in row]
    assert missing == []


@pytest.mark.parametrize("label", [label for label in webapp_labels() if label in get_resolver().namespace_dict])
def test_the_architecture_table_names_every_page_of_the_app(label):
    row = app_rows().get(label, "")
    missing = [name for name in url_names(label) if f"`{label}:{name}`" not in row and f"`{name}`" not in row]
    assert missing == []
