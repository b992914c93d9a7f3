"""JSON request bodies read with a key given twice refused: Python's json keeps the last, so the first was dropped
without a word. The REST API (``webapp.api.views``) and the OpenAI-compatible API (``webapp.chat.openai_api``) read
their bodies through ``loads``, each saying the refusal in its own error shape."""
from __future__ import annotations

import json
from typing import Any

from webapp.core.text import shown_text


class DuplicateKey(ValueError):
    """A JSON object gave one key twice; its message names the key (cut short) and what to do."""


def object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object (``json``'s ``object_pairs_hook``), refusing a key given twice (a spec's YAML and a multipart
    upload refuse theirs too)."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise DuplicateKey(f"{shown_text(key)} is given twice in one object; JSON keeps the last, so send it once")
        found[key] = value
    return found


def loads(data: bytes | str) -> Any:
    """``json.loads`` refusing a key given twice (``DuplicateKey``); its other errors are json's."""
    return json.loads(data, object_pairs_hook=object_without_duplicates)
