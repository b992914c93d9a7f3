"""A run's ``stamped_template_date``: the template date its launch fixed itself, which a copy of the run leaves out for
its own launch to fix its own day. Runs launched before it was recorded have none: a copy of one keeps its date, as
before."""
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0019_run_notice'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='stamped_template_date',
            field=models.TextField(blank=True, default='', help_text="The data.chat_template_kwargs.date_string Temper fixed in the spec at launch (runs.services._fix_template_date), empty where the spec or the model's own variables gave one or the template stamps no day. A retry keeps it; a copy of the run leaves a date so fixed out, for its own launch to fix its own day (runs.services.spec_of_a_copy)."),
        ),
    ]
