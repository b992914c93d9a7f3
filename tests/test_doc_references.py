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
