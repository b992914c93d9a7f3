"""A checkpoint export's and a serving copy's ``notice``: the word that the worker exporting or writing it was lost
and the work starts over, which was stored in their ``error_message``, where it read as a failure and a later
failure could be taken for it. An export still exporting, and a copy still being written, move what that field
holds to their notice: then it holds failures only. Back, a notice returns to ``error_message``."""
from django.db import migrations, models
from django.db.models import F


def forwards(apps, schema_editor):
    for model, under_way in (("CheckpointExport", "exporting"), ("ServingCopy", "writing")):
        apps.get_model("runs", model).objects.filter(status=under_way).exclude(error_message="").update(
            notice=F("error_message"), error_message="")


def backwards(apps, schema_editor):
    for model in ("CheckpointExport", "ServingCopy"):
        apps.get_model("runs", model).objects.filter(error_message="").exclude(notice="").update(
            error_message=F("notice"))


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0017_metricpoint_run_step"),
    ]

    operations = [
        migrations.AddField(
            model_name="checkpointexport",
            name="notice",
            field=models.TextField(blank=True, default="", help_text=(
                "A word on the export under way that is no failure: that its worker was lost and it starts over "
                "(services.checkpoint_export_requeued). Its outcome clears it; error_message holds a failure.")),
        ),
        migrations.AddField(
            model_name="servingcopy",
            name="notice",
            field=models.TextField(blank=True, default="", help_text=(
                "A word on the copy being written that is no failure: that its worker was lost and it starts over "
                "(serving_copies.serving_copy_requeued). Its outcome clears it; error_message holds a failure.")),
        ),
        migrations.RunPython(forwards, backwards),
    ]
