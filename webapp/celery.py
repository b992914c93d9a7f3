"""The Celery application shared by the web process (which only enqueues, by task
name) and the workers (which import ``worker.tasks``).

Queues:
- ``train``: accelerator hosts, one job at a time per worker (prefetch 1, acks late);
- ``serve``: model serving;
- ``default``: dataset validation and statistics, exports, webhook deliveries, housekeeping;
- ``train-<pool>``: the train workers of host pool <pool> (``train`` is pool "default");
- ``<worker name>.dq2``: each worker's own queue (``worker_direct``), where the processes of a
  multi-host run go to the workers reserved for it (``webapp.runs.placement``).
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
app.conf.worker_direct = True
app.conf.task_routes = {
    "worker.tasks.train.*": {"queue": "train"},
    "worker.tasks.serve.*": {"queue": "serve"},
}
