"""``default`` queue task of the Storage page: pruning the checkpoints of a project's ended runs. Thin: ids in, a
service call that writes its progress and outcome to the prune's row (the Storage page reads it), nothing returned
(each deletion is in its run's log)."""
from __future__ import annotations

import logging

from django.contrib.auth import get_user_model

from webapp.celery import app
from webapp.projects.models import Project
from webapp.runs import services
from webapp.runs.models import ProjectCheckpointPrune

logger = logging.getLogger(__name__)


@app.task(name="worker.tasks.storage.prune_project_checkpoints", acks_late=True)
def prune_project_checkpoints(project_id: int, user_id: int, prune_id: int | None = None) -> None:
    """Prune every ended run's checkpoints in project ``project_id`` (safe to redeliver: what is pruned has nothing
    left to go), recording how it goes in ``ProjectCheckpointPrune`` ``prune_id`` (None from a message queued before
    there were such rows); nothing for a project deleted since it was asked for."""
    project = Project.objects.filter(pk=project_id).first()
    if project is None:
        return
    progress = ProjectCheckpointPrune.objects.filter(pk=prune_id, project=project).first() if prune_id else None
    result = services.project_checkpoints_prune(project=project, user=get_user_model().objects.filter(
        pk=user_id).first(), progress=progress)
    logger.info("pruned %d checkpoints of %d runs of project %s (%d bytes freed); skipped: %s",
                result.checkpoints, len(result.pruned), project.slug, result.bytes_freed,
                ", ".join(run.public_id for run, _why in result.skipped) or "none")
