import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models
from django.utils import timezone


def copy_live_leases(apps, schema_editor):
    """An item held one lease (``leased_by``, ``leased_until``), so a second reviewer given an item with
    room held nothing and any number could be given it at once; leases are now rows, one per reviewer
    holding the item. Leases still live are kept; a reviewer holds one item per campaign, the one leased
    last."""
    Item = apps.get_model("review", "Item")
    Lease = apps.get_model("review", "Lease")
    kept = {}
    live = Item.objects.filter(leased_by__isnull=False, leased_until__gt=timezone.now()).order_by("leased_until")
    for item in live.only("pk", "campaign_id", "leased_by_id", "leased_until"):
        kept[(item.campaign_id, item.leased_by_id)] = item
    Lease.objects.bulk_create(Lease(campaign_id=campaign_id, item_id=item.pk, reviewer_id=reviewer_id,
                                    until=item.leased_until)
                              for (campaign_id, reviewer_id), item in kept.items())


class Migration(migrations.Migration):

    dependencies = [
        ('review', '0010_visible_campaign_names'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='Lease',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('until', models.DateTimeField()),
                ('campaign', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='review.campaign')),
                ('item', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='leases', to='review.item')),
                ('reviewer', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('campaign', 'reviewer'), name='lease_unique_campaign_reviewer')],
            },
        ),
        migrations.RunPython(copy_live_leases, migrations.RunPython.noop),
        migrations.RemoveField(
            model_name='item',
            name='leased_by',
        ),
        migrations.RemoveField(
            model_name='item',
            name='leased_until',
        ),
    ]
