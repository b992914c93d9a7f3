"""Project names stored before ``checked_name`` refused invisible format characters (category Cf: U+200B,
U+202E, a BOM, ...) lose them, and are put in NFC and stripped as it stores names
(``webapp.core.text.visible_name``). Project names need not be unique (the slug is), so none is numbered; a
name of invisible characters only becomes the project's slug."""
from django.db import migrations


def forwards(apps, schema_editor):
    from webapp.core.name_case import rename_to_distinct_names
    from webapp.core.text import visible_name

    rename_to_distinct_names(apps.get_model("projects", "Project"), max_length=100, key=None, clean=visible_name,
                             scope=None, blank_fallback="slug")


class Migration(migrations.Migration):

    dependencies = [
        ("projects", "0001_initial"),
    ]

    operations = [
        migrations.RunPython(forwards, migrations.RunPython.noop),
    ]
