from django.db import migrations, models

CANCELLED_BY = "cancelled by "


def name_who_cancelled(apps, schema_editor):
    """Pipelines a person cancelled before the field: their message begins "cancelled by <who> at stage N";
    a pipeline its stage's run ended cancelled has one that begins "stage N"."""
    Pipeline = apps.get_model("runs", "Pipeline")
    for pipeline in Pipeline.objects.filter(status="cancelled", message__startswith=CANCELLED_BY):
        who = pipeline.message[len(CANCELLED_BY):].split(" at stage ", 1)[0]
        Pipeline.objects.filter(pk=pipeline.pk).update(cancelled_by=who[:150])


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0013_pipeline_export_started_at"),
    ]

    operations = [
        migrations.AddField(
            model_name="pipeline",
            name="cancelled_by",
            field=models.CharField(blank=True, max_length=150),
        ),
        migrations.RunPython(name_who_cancelled, migrations.RunPython.noop),
    ]
