"""Before the case-insensitive unique name (0003): later rows whose names differ from an older one's only in
letter case get a numbered name (``webapp.core.name_case``), so the constraint can be added."""
from django.db import migrations


def forwards(apps, schema_editor):
    from webapp.core.name_case import rename_names_differing_only_in_case

    rename_names_differing_only_in_case(apps.get_model("datasets", "Dataset"), max_length=100)


class Migration(migrations.Migration):

    dependencies = [
        ("datasets", "0001_initial"),
    ]

    operations = [
        migrations.RunPython(forwards, migrations.RunPython.noop),
    ]
