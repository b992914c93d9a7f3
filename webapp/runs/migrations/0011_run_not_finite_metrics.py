from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0010_serving_copy_of_final_model'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='not_finite_metrics',
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
