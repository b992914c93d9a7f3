"""Whether Temper unpacked a base model's folder itself (an upload), so that deleting the model may delete it.
Rows registered before are all False: a folder at ``projects/<slug>/<name>/`` may as well have been copied there by
hand and registered, and nothing recorded tells an upload's apart; an owner who knows removes such a folder by hand."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('basemodels', '0007_visible_names'),
    ]

    operations = [
        migrations.AddField(
            model_name='basemodel',
            name='uploaded',
            field=models.BooleanField(default=False, help_text="Temper unpacked it from an archive into the project's own folder (uploads.py): the folder is Temper's to delete with the registration. False for a directory registered where it was."),
        ),
    ]
