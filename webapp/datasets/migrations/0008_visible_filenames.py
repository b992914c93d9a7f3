"""Uploaded file names stored before ``dataset_version_create`` checked them as names lose their invisible
format characters (category Cf: U+202E, U+200B, ...) and are put in NFC (``webapp.core.text.visible_name``), as
it stores them now: "report" + U+202E + "lsx.csv" showed as "reportvsc.xsl". One left empty becomes "upload"."""
from django.db import migrations


def forwards(apps, schema_editor):
    from webapp.core.text import visible_name

    DatasetVersion = apps.get_model("datasets", "DatasetVersion")
    for version in DatasetVersion.objects.only("pk", "original_filename").iterator():
        filename = (visible_name(version.original_filename) or "upload")[:255]
        if filename != version.original_filename:
            DatasetVersion.objects.filter(pk=version.pk).update(original_filename=filename)


class Migration(migrations.Migration):

    dependencies = [
        ("datasets", "0007_last_version_number"),
    ]

    operations = [
        migrations.RunPython(forwards, migrations.RunPython.noop),
    ]
