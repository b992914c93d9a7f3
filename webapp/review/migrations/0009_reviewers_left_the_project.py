from django.db import migrations
from django.db.models import Exists, OuterRef


def remove_reviewers_no_longer_in_the_project(apps, schema_editor):
    """Removing a member from a project, or making them a viewer, left them a reviewer of its campaigns, so
    adding or promoting them again later made them one again, unasked; ``projects.services`` now takes them
    off. Those removed or demoted before it did are taken off here: reviewers who are not a member or owner
    of the campaign's project now. Their reviews stay."""
    CampaignReviewer = apps.get_model("review", "CampaignReviewer")
    Membership = apps.get_model("projects", "Membership")
    may_review = (Membership.objects.filter(project=OuterRef("campaign__project"), user=OuterRef("user"))
                  .exclude(role="viewer"))
    CampaignReviewer.objects.exclude(Exists(may_review)).delete()


class Migration(migrations.Migration):

    dependencies = [
        ("projects", "0001_initial"),
        ("review", "0008_campaign_source_label"),
    ]

    operations = [
        migrations.RunPython(remove_reviewers_no_longer_in_the_project, migrations.RunPython.noop),
    ]
