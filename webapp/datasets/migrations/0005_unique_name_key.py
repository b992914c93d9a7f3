from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("datasets", "0004_name_key"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="dataset",
            name="dataset_unique_project_lower_name",
        ),
        migrations.AddConstraint(
            model_name="dataset",
            constraint=models.UniqueConstraint(fields=["project", "name_key"], name="dataset_unique_project_name_key"),
        ),
    ]
