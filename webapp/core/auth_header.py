"""The credentials of an ``Authorization`` header, shared by the REST API and the OpenAI-compatible API."""
from __future__ import annotations


def bearer_secret(header: str) -> str | None:
    """The secret of ``Authorization: Bearer <secret>``, else None. The scheme's name is case-insensitive
    (RFC 9110, 11.1): clients that send ``bearer`` are answered like those that send ``Bearer``."""
    scheme, _, secret = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        return None
    return secret.strip()
