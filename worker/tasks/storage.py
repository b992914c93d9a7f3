"""``default`` queue task of the Storage page: pruning the checkpoints of a project's ended runs. Thin: ids in, a
service call, nothing returned (each deletion is in its run's log)."""
from __future__ import annotations

import logging

from django.contrib.auth import get_user_model

from webapp.celery import app
from webapp.projects.models import Project
from webapp.runs import services

logger = logging.getLogger(__name__)


@app.task(name="worker.tasks.storage.prune_project_checkpoints", acks_late=True)
def prune_project_checkpoints(project_id: int, user_id: int) -> None:
    """Prune every ended run's checkpoints in project ``project_id`` (safe to redeliver: what is pruned has nothing
    left to go); nothing for a project deleted since it was asked for."""
    project = Project.objects.filter(pk=project_id).first()
    if project is None:
        return
    result = services.project_checkpoints_prune(project=project, user=get_user_model().objects.filter(
        pk=user_id).first())
    logger.info("pruned %d checkpoints of %d runs of project %s (%d bytes freed); skipped while active: %s",
                result.checkpoints, len(result.pruned), project.slug, result.bytes_freed,
                ", ".join(run.public_id for run, _why in result.skipped) or "none")
