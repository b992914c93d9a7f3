"""A version's ``notice``: the word that its check's worker was lost and the check started over, which was stored
as the one item of its ``errors`` (code ``worker_lost_requeued``, no problem counted), where an API client that
reads any error as failure misread it. A version still being checked moves that item to its notice; ``errors``
lists problems of the file only. Back, a notice becomes that item of its errors again."""
from django.db import migrations, models

REQUEUED_CODE = "worker_lost_requeued"


def forwards(apps, schema_editor):
    DatasetVersion = apps.get_model("datasets", "DatasetVersion")
    for version in DatasetVersion.objects.filter(status__in=("uploaded", "validating")).only("pk", "errors").iterator():
        notes = [error for error in version.errors if isinstance(error, dict) and error.get("code") == REQUEUED_CODE]
        if notes:
            DatasetVersion.objects.filter(pk=version.pk).update(
                notice=notes[-1].get("message", ""),
                errors=[error for error in version.errors if error not in notes])


def backwards(apps, schema_editor):
    DatasetVersion = apps.get_model("datasets", "DatasetVersion")
    for version in DatasetVersion.objects.exclude(notice="").only("pk", "errors", "notice").iterator():
        note = {"code": REQUEUED_CODE, "message": version.notice, "line": None, "row": None, "field": None}
        DatasetVersion.objects.filter(pk=version.pk).update(errors=[*version.errors, note])


class Migration(migrations.Migration):

    dependencies = [
        ("datasets", "0008_visible_filenames"),
    ]

    operations = [
        migrations.AddField(
            model_name="datasetversion",
            name="notice",
            field=models.TextField(blank=True, default="", help_text=(
                "A word on the check under way that is no problem of the file: that its worker was lost and it "
                "started over (datasets.services.version_check_requeued). The check's outcome clears it.")),
        ),
        migrations.RunPython(forwards, backwards),
    ]
