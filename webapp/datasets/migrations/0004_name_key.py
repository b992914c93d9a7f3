"""The name as Python folds it (``webapp.core.name_case.name_key``), which the unique constraint of 0005
compares in place of LOWER(name): SQLite's LOWER folds ASCII letters only, so "Ärger" and "ärger" were two
names. Rows whose keys collide get a numbered name first, as 0002 did for LOWER(name)."""
from django.db import migrations, models


def forwards(apps, schema_editor):
    from webapp.core.name_case import fill_name_keys, name_key, rename_to_distinct_names

    model = apps.get_model("datasets", "Dataset")
    rename_to_distinct_names(model, max_length=100, key=name_key)
    fill_name_keys(model)


class Migration(migrations.Migration):

    dependencies = [
        ("datasets", "0003_unique_name_in_any_case"),
    ]

    operations = [
        migrations.AddField(
            model_name="dataset",
            name="name_key",
            field=models.TextField(default="", editable=False,
                                   help_text="name_key(name): what the unique constraint compares."),
            preserve_default=False,
        ),
        migrations.RunPython(forwards, migrations.RunPython.noop),
    ]
