"""Logging filters used by the Django settings' ``LOGGING``."""
from __future__ import annotations

import logging


class ClientErrorsWithoutTraceback(logging.Filter):
    """Django logs every refused request (a 403 from ``PermissionDenied``, a 400 from a bad request) at
    WARNING with the exception's traceback: an outsider or a viewer clicking about filled the server's log
    with stack traces of nothing wrong. Their one line stays; a traceback stays for server errors. A
    ``django.security`` record (a host name outside ``ALLOWED_HOSTS``) is logged at ERROR, but is the
    client's doing too."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or record.name.startswith("django.security."):
            record.exc_info = None
            record.exc_text = None
        return True
