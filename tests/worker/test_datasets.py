"""The dataset tasks are thin: run in-process, they leave the same result as the services."""
from django.core.files.uploadedfile import SimpleUploadedFile

from tests.webapp.factories import make_team
from webapp.datasets import services
from webapp.datasets.models import VersionStatus
from worker.tasks.datasets import validate_dataset_version


def test_validate_task_runs_the_service(db):
    team = make_team()
    version = services.dataset_create_with_upload(
        project=team.project, name="t", kind="text", upload=SimpleUploadedFile("t.jsonl", b'{"text": "a"}\n'),
        file_format=None, column_mapping={}, user=team.owner,
    )
    validate_dataset_version.apply(args=[version.pk]).get()
    version.refresh_from_db()
    assert version.status == VersionStatus.READY and version.row_count == 1
