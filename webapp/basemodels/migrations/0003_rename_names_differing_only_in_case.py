"""Before the case-insensitive unique name (0004): later rows whose names differ from an older one's only in
letter case get a numbered name (``webapp.core.name_case``), so the constraint can be added."""
from django.db import migrations


def forwards(apps, schema_editor):
    from webapp.core.name_case import rename_names_differing_only_in_case

    rename_names_differing_only_in_case(apps.get_model("basemodels", "BaseModel"), max_length=100)


class Migration(migrations.Migration):

    dependencies = [
        ("basemodels", "0002_tokenizer_vocab_size"),
    ]

    operations = [
        migrations.RunPython(forwards, migrations.RunPython.noop),
    ]
