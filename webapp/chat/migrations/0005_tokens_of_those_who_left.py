from django.db import migrations
from django.db.models import Exists, OuterRef


def revoke_tokens_of_those_who_left(apps, schema_editor):
    """Removing a member from a project, or making them a viewer, only suspended their project tokens, so
    adding or promoting them again later made the tokens work again, unasked; ``projects.services`` now
    revokes them. Those of users removed or demoted before it did are revoked here: tokens whose user is not
    a member or owner of the token's project now."""
    ProjectToken = apps.get_model("chat", "ProjectToken")
    Membership = apps.get_model("projects", "Membership")
    may_chat = (Membership.objects.filter(project=OuterRef("project"), user=OuterRef("user"))
                .exclude(role="viewer"))
    ProjectToken.objects.exclude(Exists(may_chat)).delete()


class Migration(migrations.Migration):

    dependencies = [
        ("projects", "0002_visible_project_names"),
        ("chat", "0004_battle_blind"),
    ]

    operations = [
        migrations.RunPython(revoke_tokens_of_those_who_left, migrations.RunPython.noop),
    ]
