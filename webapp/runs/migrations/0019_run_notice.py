"""A run's ``notice``: the word that an attempt's worker was lost and the run was queued again (which attempt, where
it resumes), stored as its ``error_message``, which a REST client reads as the run's failure. A queued run moves what
its ``error_message`` holds to its notice (a run is queued with no error otherwise: a resume clears it). Back, a
notice returns to ``error_message``."""
from django.db import migrations, models
from django.db.models import F


def forwards(apps, schema_editor):
    apps.get_model("runs", "Run").objects.filter(status="queued").exclude(error_message="").update(
        notice=F("error_message"), error_message="")


def backwards(apps, schema_editor):
    apps.get_model("runs", "Run").objects.filter(error_message="").exclude(notice="").update(
        error_message=F("notice"))


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0018_notices"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="notice",
            field=models.TextField(blank=True, default="", help_text=(
                "While re-queued after its worker was lost (services.run_attempt_lost): which attempt was lost, "
                "where, and where the next one starts; no failure. Its next attempt's start clears it; error_message "
                "holds failures.")),
        ),
        migrations.RunPython(forwards, backwards),
    ]
