"""A campaign's and an export's ``notice``: the word that the worker loading, generating or writing it was lost and
the work starts over, which was stored in their ``load_error`` and ``error``, where it read as a failure and a later
failure could be taken for it. A campaign still loading or generating, and an export still being written, move what
those fields hold to their notice: then the fields hold failures only. Back, a notice returns to its error field."""
from django.db import migrations, models
from django.db.models import F

UNDER_WAY = ("loading", "generating")


def forwards(apps, schema_editor):
    Campaign = apps.get_model("review", "Campaign")
    Export = apps.get_model("review", "Export")
    Campaign.objects.filter(status__in=UNDER_WAY).exclude(load_error="").update(notice=F("load_error"), load_error="")
    Export.objects.filter(status="writing").exclude(error="").update(notice=F("error"), error="")


def backwards(apps, schema_editor):
    Campaign = apps.get_model("review", "Campaign")
    Export = apps.get_model("review", "Export")
    Campaign.objects.filter(load_error="").exclude(notice="").update(load_error=F("notice"))
    Export.objects.filter(error="").exclude(notice="").update(error=F("notice"))


class Migration(migrations.Migration):

    dependencies = [
        ("review", "0018_campaign_delete_when_stopped"),
    ]

    operations = [
        migrations.AddField(
            model_name="campaign",
            name="notice",
            field=models.TextField(blank=True, default="", help_text=(
                "A word on the load or generation under way that is no failure: that its worker was lost and it "
                "starts over (services.campaign_load_requeued, generation_lost). Its outcome clears it; load_error "
                "holds failures.")),
        ),
        migrations.AddField(
            model_name="export",
            name="notice",
            field=models.TextField(blank=True, default="", help_text=(
                "A word on the export being written that is no failure: that its worker was lost and it starts over "
                "(services.export_requeued). Its outcome clears it; error holds a failure.")),
        ),
        migrations.RunPython(forwards, backwards),
    ]
