"""The key Django signs with (sessions, CSRF, messages, the REST API's page cursors).

``TEMPER_SECRET_KEY`` when it is set (the same on every web host behind one address). Otherwise the key in
``$TEMPER_DATA/secret_key``: made at random, readable by its owner only, the first time any Temper process
starts on that data root, and read by every process after it, so that a fresh ``make up`` (or a compose
stack, whose containers share the data volume) signs with a key of its own, never a default that anyone who
read this repository knows (with which they could forge a session's messages or a page cursor)."""
from __future__ import annotations

import os
import secrets
from pathlib import Path

KEY_FILE = "secret_key"


class SecretKeyError(Exception):
    """The key file can be neither read nor made."""


def secret_key(given: str, data_root: Path) -> str:
    """``given`` when not blank, else the data root's key, made the first time (see the module note)."""
    if given.strip():
        return given
    path = data_root / KEY_FILE
    try:
        if not path.exists():
            _make_once(path)
        key = path.read_text(encoding="ascii").strip()
    except OSError as error:
        raise SecretKeyError(f"cannot read or make the secret key file {path} ({error.strerror or error}): make "
                             "TEMPER_DATA writable, or set TEMPER_SECRET_KEY") from error
    if len(key) < 32:
        raise SecretKeyError(f"the secret key file {path} holds no key ({len(key)} characters): delete it to have "
                             "a new one made (every session then ends), or set TEMPER_SECRET_KEY")
    return key


def _make_once(path: Path) -> None:
    """Writes a new key to a file of its own, then links it in place: a process starting at the same moment
    either links first (and every process reads its key) or finds the file there; none reads half a key."""
    path.parent.mkdir(parents=True, exist_ok=True)
    draft = path.with_name(f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
    descriptor = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "w", encoding="ascii") as draft_file:
            draft_file.write(secrets.token_urlsafe(50) + "\n")
        try:
            os.link(draft, path)
        except FileExistsError:
            pass
    finally:
        draft.unlink(missing_ok=True)
