import django.db.models.functions.text
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("datasets", "0002_rename_names_differing_only_in_case"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="dataset",
            name="dataset_unique_project_name",
        ),
        migrations.AddConstraint(
            model_name="dataset",
            constraint=models.UniqueConstraint(models.F("project"), django.db.models.functions.text.Lower("name"),
                                               name="dataset_unique_project_lower_name"),
        ),
    ]
