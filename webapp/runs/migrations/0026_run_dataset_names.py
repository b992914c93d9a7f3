"""``Run.dataset_names``: what each dataset version of a run's spec was called at launch, for its pages once the
version is deleted (they said only ``dv_… (deleted since)``). Runs launched before it get the names of their versions
still there; one whose version is gone already keeps showing its id."""
from collections import defaultdict

from django.db import migrations, models

BATCH = 2000


def forwards(apps, schema_editor):
    Run = apps.get_model("runs", "Run")
    uses = Run.dataset_versions.through.objects.order_by("run_id").values_list(
        "run_id", "datasetversion__public_id", "datasetversion__number", "datasetversion__dataset__name")
    names: dict[int, dict] = defaultdict(dict)
    for run_id, public_id, number, name in uses.iterator(chunk_size=BATCH):
        names[run_id][public_id] = {"name": name, "number": number}
    for run_id, recorded in names.items():
        Run.objects.filter(pk=run_id).update(dataset_names=recorded)


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0025_one_spelling_per_tag"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="dataset_names",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.RunPython(forwards, migrations.RunPython.noop),
    ]
