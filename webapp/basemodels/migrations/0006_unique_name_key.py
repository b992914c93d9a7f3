from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("basemodels", "0005_name_key"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="basemodel",
            name="basemodel_unique_project_lower_name",
        ),
        migrations.AddConstraint(
            model_name="basemodel",
            constraint=models.UniqueConstraint(fields=["project", "name_key"], name="basemodel_unique_project_name_key"),
        ),
    ]
