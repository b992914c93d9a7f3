"""Review migrations that fill new fields from what older rows hold."""
import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def test_exports_marked_done_take_their_versions_outcome():
    """Exports were marked done as soon as their version was written, whatever its check said."""
    apps = migrate([("review", "0006_campaign_generation_progress_at")])
    try:
        Project = apps.get_model("projects", "Project")
        Dataset = apps.get_model("datasets", "Dataset")
        Campaign = apps.get_model("review", "Campaign")
        Export = apps.get_model("review", "Export")
        project = Project.objects.create(name="Alpha", slug="alpha")
        dataset = Dataset.objects.create(project=project, name="gen-reviewed", kind="preference")
        campaign = Campaign.objects.create(project=project, name="pass 1")
        errors = [{"code": "empty_string", "message": "is an empty string; give it text or drop the row", "line": 3,
                   "row": 3, "field": "chosen"}]
        for number, status in enumerate(["failed", "ready", "uploaded"], start=1):
            version = dataset.versions.create(number=number, original_filename="x.jsonl", format="jsonl", size_bytes=1,
                                              file_path=f"x{number}", status=status, errors=errors if status == "failed" else [],
                                              error_count=2 if status == "failed" else 0)
            Export.objects.create(campaign=campaign, dataset_name="gen-reviewed", status="done", version=version)
    finally:
        call_command("migrate", verbosity=0)
    from webapp.review.models import Export as CurrentExport

    exports = list(CurrentExport.objects.order_by("pk"))
    assert [export.status for export in exports] == ["failed", "done", "validating"]
    assert exports[0].error == ("gen-reviewed v1 failed validation: line 3, row 3, field 'chosen': is an empty string; "
                                "give it text or drop the row (and 1 more problem); its page lists them")
