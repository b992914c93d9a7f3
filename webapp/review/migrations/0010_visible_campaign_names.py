"""Campaign names stored before ``checked_name`` refused invisible format characters (category Cf: U+200B,
U+202E, a BOM, ...) lose them, and are put in NFC and stripped as it stores names
(``webapp.core.text.visible_name``). A name that this makes taken in the project (campaign names are unique
as written) is numbered, the name that was already clean keeping it; a name of invisible characters only
becomes the campaign's id."""
from django.db import migrations


def forwards(apps, schema_editor):
    from webapp.core.name_case import rename_to_distinct_names
    from webapp.core.text import visible_name

    rename_to_distinct_names(apps.get_model("review", "Campaign"), max_length=100, key=lambda name: name,
                             clean=visible_name)


class Migration(migrations.Migration):

    dependencies = [
        ("review", "0009_reviewers_left_the_project"),
    ]

    operations = [
        migrations.RunPython(forwards, migrations.RunPython.noop),
    ]
