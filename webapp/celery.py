"""The Celery application shared by the web process (which only enqueues, by task
name) and the workers (which import ``worker.tasks``).

Queues:
- ``train``: accelerator hosts, one job at a time per worker (prefetch 1, acks late);
- ``serve``: model serving;
- ``default``: dataset validation and statistics, exports, housekeeping.
"""
from __future__ import annotations

import os

from celery import Celery
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

app = Celery("temper")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_queues = (Queue("default"), Queue("train"), Queue("serve"))
app.conf.task_default_queue = "default"
app.conf.task_routes = {
    "worker.tasks.train.*": {"queue": "train"},
    "worker.tasks.serve.*": {"queue": "serve"},
}
