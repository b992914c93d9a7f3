"""The final texts an owner sent with a resolution refused because another was made meanwhile
(``services.AlreadyResolved``), kept in their session until they decide on the page asking them (a GET, so that
reloading it sends nothing and loses nothing).

Pure functions over the session's value, a dict by item public id of ``{"label", "texts", "resolution", "at"}``:
``resolution`` is the stamp (``services.resolution_stamp``) of the resolution the texts were refused over, ``at`` when
(seconds since the epoch). Texts are only ever offered on their own item, with the label pressed, against that very
resolution: once the item is resolved again, by anyone, they were never weighed against what stands and are dropped,
as are texts a day old; at most ``MAX_KEPT`` items are kept (the latest), so the session stays small however many
refusals an owner meets."""
from __future__ import annotations

from typing import Any

SESSION_KEY = "review-resolve-kept"
MAX_KEPT = 10
MAX_AGE_SECONDS = 24 * 3600

Store = dict[str, dict[str, Any]]


def kept(store: Store, *, item: str, label: str, resolution: str) -> dict[str, str]:
    """The texts kept for ``item`` sent with ``label``, where they were refused over ``resolution`` (the item's now)."""
    entry = store.get(item) or {}
    if entry.get("label") != label or entry.get("resolution") != resolution:
        return {}
    return dict(entry.get("texts") or {})


def with_kept(store: Store, *, item: str, label: str, texts: dict[str, str], resolution: str, now: float) -> Store:
    """``store`` with ``texts`` kept for ``item`` (replacing what it held), the oldest entries beyond ``MAX_KEPT``
    dropped."""
    entries = {key: entry for key, entry in store.items() if key != item}
    entries[item] = {"label": label, "texts": dict(texts), "resolution": resolution, "at": now}
    latest = sorted(entries, key=lambda key: entries[key].get("at", 0), reverse=True)[:MAX_KEPT]
    return {key: entries[key] for key in latest}


def without(store: Store, *, item: str) -> Store:
    return {key: entry for key, entry in store.items() if key != item}


def fresh(store: Store, *, resolutions: dict[str, str], now: float) -> Store:
    """The entries of ``store`` still standing: their item's resolution now (``resolutions``, by item; an item gone
    has none) the one they were refused over, and kept less than ``MAX_AGE_SECONDS``."""
    return {key: entry for key, entry in store.items()
            if resolutions.get(key) == entry.get("resolution") and now - entry.get("at", 0) < MAX_AGE_SECONDS}
