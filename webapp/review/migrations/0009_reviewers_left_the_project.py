from django.db import migrations
from django.db.models import Exists, OuterRef


def remove_reviewers_no_longer_in_the_project(apps, schema_editor):
    """Removing a member from a project left them a reviewer of its campaigns, so adding them again later
    made them one again, unasked; ``projects.services.membership_remove`` now takes them off. Those removed
    before it did are taken off here: reviewers who are not in the campaign's project now. Their reviews
    stay."""
    CampaignReviewer = apps.get_model("review", "CampaignReviewer")
    Membership = apps.get_model("projects", "Membership")
    in_the_project = Membership.objects.filter(project=OuterRef("campaign__project"), user=OuterRef("user"))
    CampaignReviewer.objects.exclude(Exists(in_the_project)).delete()


class Migration(migrations.Migration):

    dependencies = [
        ("projects", "0001_initial"),
        ("review", "0008_campaign_source_label"),
    ]

    operations = [
        migrations.RunPython(remove_reviewers_no_longer_in_the_project, migrations.RunPython.noop),
    ]
