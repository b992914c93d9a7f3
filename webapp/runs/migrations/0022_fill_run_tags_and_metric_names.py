"""``RunTag`` and ``ProjectMetricName`` filled from the runs stored before them: a row per tag of each run (folded as
``models.fold_tag`` folds it) and a row per final-metric name any run of its project logged, archived runs' too."""
from django.db import migrations

BATCH = 1000


def forwards(apps, schema_editor):
    from webapp.runs.models import fold_tag

    Run = apps.get_model("runs", "Run")
    RunTag = apps.get_model("runs", "RunTag")
    ProjectMetricName = apps.get_model("runs", "ProjectMetricName")
    tag_rows, names = [], set()
    for run_id, project_id, tags, final_metrics in (Run.objects.values_list("pk", "project_id", "tags", "final_metrics")
                                                    .iterator(chunk_size=BATCH)):
        tag_rows += [RunTag(run_id=run_id, project_id=project_id, tag=tag, tag_folded=fold_tag(tag))
                     for tag in dict.fromkeys(tags or [])]
        names.update((project_id, name) for name in final_metrics or {})
        if len(tag_rows) >= BATCH:
            RunTag.objects.bulk_create(tag_rows, ignore_conflicts=True)
            tag_rows = []
    RunTag.objects.bulk_create(tag_rows, ignore_conflicts=True)
    ProjectMetricName.objects.bulk_create([ProjectMetricName(project_id=project_id, name=name)
                                           for project_id, name in sorted(names)], batch_size=BATCH,
                                          ignore_conflicts=True)


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0021_run_tags_and_metric_names"),
    ]

    operations = [
        migrations.RunPython(forwards, migrations.RunPython.noop),
    ]
