"""Opaque public ids for URLs.

Every object except a project (addressed by its slug) appears in URLs under an
opaque id such as ``ds_4f9KxQ2mTzL0aB7c``: a short type prefix, an underscore and
16 random letters and digits (95 bits). The random part has no ``_`` or ``-`` so that
an id splits unambiguously at its first underscore and reads cleanly in a URL. Database primary keys never leave the
server, so ids reveal neither how many objects exist nor which ones do.
"""
from __future__ import annotations

import re
import secrets
import string

PUBLIC_ID_RANDOM_CHARS = 16
# Long enough for any prefix of up to 8 letters, the underscore and the random part.
PUBLIC_ID_MAX_LENGTH = 32

_PREFIX_RE = re.compile(r"^[a-z]{1,8}_?$")
_ALPHABET = string.ascii_letters + string.digits


def new_public_id(prefix: str) -> str:
    """Return ``<prefix>_<16 random letters and digits>``.

    ``prefix`` is 1-8 lower-case letters naming the kind (``"ds"`` for datasets,
    ``"bm"`` for base models, ...); a trailing underscore is accepted and not doubled.
    """
    if not _PREFIX_RE.match(prefix):
        raise ValueError(f"public id prefix {prefix!r} must be 1-8 lower-case letters, e.g. 'ds'")
    random_part = "".join(secrets.choice(_ALPHABET) for _ in range(PUBLIC_ID_RANDOM_CHARS))
    return f"{prefix.rstrip('_')}_{random_part}"
