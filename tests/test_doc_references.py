"""Every dotted name of the code that README.md and docs/architecture.md give in full (``webapp.…``, ``worker.…``,
``jaxengine.…``) names a module, or an attribute of one, that exists: a reader greps for them."""
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/architecture.md")


def dotted_names(doc: str) -> list[str]:
    text = (ROOT / doc).read_text(encoding="utf-8")
    return sorted(set(re.findall(r"`((?:webapp|worker|jaxengine)(?:\.\w+)+)", text)))


def resolves(name: str) -> bool:
    """Whether the longest importable prefix of ``name`` has the rest as attributes."""
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


@pytest.mark.parametrize("doc", DOCS)
def test_every_dotted_name_of_the_code_in_the_doc_exists(doc):
    """docs/architecture.md named worker.tasks.serve._server_for, renamed server_for long before."""
    assert [name for name in dotted_names(doc) if not resolves(name)] == []


WEB_APPS = "accounts|projects|basemodels|datasets|review|workers|runs|chat|api|core"


@pytest.mark.parametrize("doc", DOCS)
def test_every_name_the_doc_gives_under_a_web_app_exists(doc):
    """The map names most of the web's code by app (`core.addresses.client_address`, `review.services.item_add`),
    without `webapp.`; those resolve too (a migration's number and a stylesheet, `runs.css`, are no names)."""
    from webapp.webhooks.models import EVENTS

    text = (ROOT / doc).read_text(encoding="utf-8")
    names = sorted(set(re.findall(rf"`((?:{WEB_APPS})(?:\.(?!\d|css`|js`)\w+)+)`?", text)))
    # A webhook event (`review.exported`) reads like a name of the review app; it is a word of the payload.
    assert [name for name in names if name not in EVENTS and not resolves(f"webapp.{name}")] == []


def file_references(doc: str) -> list[str]:
    """The repository paths the doc writes in code (`worker/tasks/serve.py`, `static/runs.js`), and the
    `path/module.attribute` form (`worker/multihost.HostLiveness`); none with a placeholder (`<id>`) or a glob."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    top = "webapp|worker|jaxengine|tests|scripts|bench|static|templates|docs"
    return sorted(set(re.findall(rf"`((?:{top})/[\w./-]*\w)(?=[`: ,)])", text)))


def names_a_file_or_a_definition(reference: str) -> bool:
    if (ROOT / reference).exists():
        return True
    module, _, attribute = reference.rpartition(".")
    source = ROOT / f"{module}.py"
    return bool(module) and source.is_file() and re.search(
        rf"^\s*(?:(?:async )?def |class )?{re.escape(attribute)}\b(?:\s*[(:=]|\s*$)",
        source.read_text(encoding="utf-8"), re.M) is not None


@pytest.mark.parametrize("doc", DOCS)
def test_every_file_the_doc_names_exists(doc):
    """Docs audit: the dotted names were checked, the paths (`tests/postgres/test_project_delete_postgres.py`,
    `worker/tasks/train._pool_process_died`) were not; a moved file left its old path in the map."""
    references = file_references(doc)
    assert len(references) > 10
    assert [reference for reference in references if not names_a_file_or_a_definition(reference)] == []
