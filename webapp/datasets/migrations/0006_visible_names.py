"""Names stored before ``checked_name`` refused invisible format characters (category Cf: U+200B, U+202E, a
BOM, ...) lose them, and are put in NFC and stripped as it stores names (``webapp.core.text.visible_name``).
A name that this makes taken in the project (in any letter case: ``name_key``) is numbered, the name that
was already clean keeping it; a name of invisible characters only becomes the row's id."""
from django.db import migrations


def forwards(apps, schema_editor):
    from webapp.core.name_case import fill_name_keys, name_key, rename_to_distinct_names
    from webapp.core.text import visible_name

    model = apps.get_model("datasets", "Dataset")
    rename_to_distinct_names(model, max_length=100, key=name_key, clean=visible_name)
    fill_name_keys(model)


class Migration(migrations.Migration):

    dependencies = [
        ("datasets", "0005_unique_name_key"),
    ]

    operations = [
        migrations.RunPython(forwards, migrations.RunPython.noop),
    ]
