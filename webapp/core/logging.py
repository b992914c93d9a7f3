"""Logging filters used by the Django settings' ``LOGGING``."""
from __future__ import annotations

import logging


class ClientErrorsWithoutTraceback(logging.Filter):
    """Django logs every refused request (a 403 from ``PermissionDenied``, a 400 from a bad request) at
    WARNING with the exception's traceback: an outsider or a viewer clicking about filled the server's log
    with stack traces of nothing wrong. Their one line stays; a traceback stays for server errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            record.exc_info = None
            record.exc_text = None
        return True
