"""Run tags stored before ``parse_tags`` refused invisible format characters (category Cf: U+200B, U+202E, a
BOM, ...) lose them, and are put in NFC and stripped as it stores tags (``webapp.core.text.visible_name``); a tag
that then repeats an earlier one of its run, or is left empty, goes."""
from django.db import migrations


def forwards(apps, schema_editor):
    from webapp.core.text import visible_name

    Run = apps.get_model("runs", "Run")
    for run in Run.objects.exclude(tags=[]).only("pk", "tags").iterator():
        tags = list(dict.fromkeys(tag for tag in map(visible_name, run.tags) if tag))
        if tags != run.tags:
            Run.objects.filter(pk=run.pk).update(tags=tags)


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0014_pipeline_cancelled_by"),
    ]

    operations = [
        migrations.RunPython(forwards, migrations.RunPython.noop),
    ]
