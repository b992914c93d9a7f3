"""``ProjectMetricName`` rows whose name no run of their project holds any more leave the runs table's sort menu.
Before ``services.metric_names_rewritten`` a run whose ``final_metrics`` were recomputed without a name (an attempt
that started over dropped the steps an earlier one logged) left the name there, and sorting by it ordered nothing.
A project keeps every name some run of its own holds in ``final_metrics``, an archived run's too, as the services
keep them. One pass over the runs (streamed in chunks, only two columns read) crosses off the names held, so the
migration reads each run once however many names there are, and the rows left are deleted in chunks (SQLite's limit
on a query's parameters)."""
from django.db import migrations

BATCH = 2000


def forwards(apps, schema_editor):
    Run = apps.get_model("runs", "Run")
    ProjectMetricName = apps.get_model("runs", "ProjectMetricName")
    unheld = {(project_id, name): pk for pk, project_id, name
              in ProjectMetricName.objects.values_list("pk", "project_id", "name").iterator(chunk_size=BATCH)}
    for project_id, final_metrics in Run.objects.values_list("project_id", "final_metrics").iterator(chunk_size=BATCH):
        if not unheld:
            break
        for name in final_metrics if isinstance(final_metrics, dict) else ():
            unheld.pop((project_id, name), None)
    stale = sorted(unheld.values())
    for start in range(0, len(stale), BATCH):
        ProjectMetricName.objects.filter(pk__in=stale[start:start + BATCH]).delete()


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0023_backfill_stamped_template_date"),
    ]

    operations = [
        migrations.RunPython(forwards, migrations.RunPython.noop),
    ]
