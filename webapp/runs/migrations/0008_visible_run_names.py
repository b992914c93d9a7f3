"""Run names stored before ``checked_name`` refused invisible format characters (category Cf: U+200B, U+202E,
a BOM, ...) lose them, and are put in NFC and stripped as it stores names (``webapp.core.text.visible_name``).
Run names need not be unique, so none is numbered; a name of invisible characters only becomes the run's id."""
from django.db import migrations


def forwards(apps, schema_editor):
    from webapp.core.name_case import rename_to_distinct_names
    from webapp.core.text import visible_name

    rename_to_distinct_names(apps.get_model("runs", "Run"), max_length=120, key=None, clean=visible_name)


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0007_checkpoint_export"),
    ]

    operations = [
        migrations.RunPython(forwards, migrations.RunPython.noop),
    ]
