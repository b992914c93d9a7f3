import django.db.models.functions.text
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("basemodels", "0003_rename_names_differing_only_in_case"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="basemodel",
            name="basemodel_unique_project_name",
        ),
        migrations.AddConstraint(
            model_name="basemodel",
            constraint=models.UniqueConstraint(models.F("project"), django.db.models.functions.text.Lower("name"),
                                               name="basemodel_unique_project_lower_name"),
        ),
    ]
