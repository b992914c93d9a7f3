from django.db import migrations, models

from webapp.core.migration_operations import AddIndexConcurrentlyOnPostgres


class Migration(migrations.Migration):
    # Built concurrently on PostgreSQL, where serve workers keep writing answers to the messages table while a
    # deployment migrates (see webapp.core.migration_operations); CREATE INDEX CONCURRENTLY runs outside a
    # transaction, hence apart from 0016's fill-in.
    atomic = False

    dependencies = [
        ('chat', '0016_message_has_text'),
    ]

    operations = [
        AddIndexConcurrentlyOnPostgres(
            model_name='message',
            index=models.Index(condition=models.Q(('has_text', False)), fields=['conversation'], name='chat_message_no_text'),
        ),
    ]
