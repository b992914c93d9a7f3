"""ASGI entry point: ``uvicorn webapp.asgi:application``."""
import logging
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
django.setup(set_prefix=False)  # as django.core.asgi.get_asgi_application does

from django.conf import settings  # noqa: E402  (configured by django.setup)

from webapp.core.asgi_requests import MeasuredBodyASGIHandler  # noqa: E402

# A body sent chunked (no Content-Length) is read as sent: webapp.core.asgi_requests.
application = MeasuredBodyASGIHandler()

from webapp.core.streaming import LeaveCutDownloadsUnfinished, QuietAboutCutDownloads  # noqa: E402
from webapp.datasets.uploads import RequestBodyLimit  # noqa: E402

application = LeaveCutDownloadsUnfinished(RequestBodyLimit(application,
                                                          max_upload_bytes=settings.TEMPER_MAX_UPLOAD_BYTES,
                                                          max_other_bytes=settings.DATA_UPLOAD_MAX_MEMORY_SIZE,
                                                          max_model_upload_bytes=settings.TEMPER_MODEL_UPLOAD_MAX_BYTES))
# uvicorn configures its loggers before it imports the application: the filter added here stays.
logging.getLogger("uvicorn.error").addFilter(QuietAboutCutDownloads())
