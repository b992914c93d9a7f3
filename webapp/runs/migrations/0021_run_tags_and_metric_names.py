"""The runs table's indexes: a run's tags as rows (``RunTag``, with their casefolded text for the search) and the
final-metric names a project's runs logged (``ProjectMetricName``, the sort menu), so that neither reads every run
of the project on each page; ``0022`` fills them from the runs there are."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('projects', '0003_membership_user_protect_last_owners'),
        ('runs', '0020_run_stamped_template_date'),
    ]

    operations = [
        migrations.CreateModel(
            name='ProjectMetricName',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=100)),
                ('project', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='metric_names', to='projects.project')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('project', 'name'), name='projectmetricname_unique')],
            },
        ),
        migrations.CreateModel(
            name='RunTag',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('tag', models.TextField()),
                ('tag_folded', models.TextField()),
                ('project', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='projects.project')),
                ('run', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='tag_rows', to='runs.run')),
            ],
            options={
                'indexes': [models.Index(fields=['project', 'tag'], name='runtag_project_tag'), models.Index(fields=['project', 'tag_folded'], name='runtag_project_folded')],
                'constraints': [models.UniqueConstraint(fields=('run', 'tag'), name='runtag_unique_run_tag')],
            },
        ),
    ]
