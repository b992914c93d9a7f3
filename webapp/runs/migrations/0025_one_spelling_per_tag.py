"""Tags of a project that differ only in letter case ("Baseline", "baseline") become one, spelt as the oldest run
holding it spells it, as ``services.run_tags_write`` now spells a tag given again: each run's ``tags`` list (a run
holding both keeps one, where the first stood) and its ``RunTag`` rows. One pass over the tagged runs, oldest first
in each project; only the runs whose list changes are written."""
from django.db import migrations

BATCH = 2000


def respelt(tags, spellings):
    """``tags`` each spelt as ``spellings`` (casefolded tag to spelling) has it, without repeats; a tag first seen
    here is added to ``spellings``."""
    for tag in tags:
        spellings.setdefault(tag.casefold(), tag)
    return list(dict.fromkeys(spellings[tag.casefold()] for tag in tags))


def forwards(apps, schema_editor):
    Run = apps.get_model("runs", "Run")
    RunTag = apps.get_model("runs", "RunTag")
    spellings_by_project: dict[int, dict[str, str]] = {}
    changed = []
    for pk, project_id, tags in (Run.objects.exclude(tags=[]).order_by("project_id", "created_at", "pk")
                                 .values_list("pk", "project_id", "tags").iterator(chunk_size=BATCH)):
        if not isinstance(tags, list):
            continue
        respelt_tags = respelt(tags, spellings_by_project.setdefault(project_id, {}))
        if respelt_tags != tags:
            changed.append((pk, project_id, respelt_tags))
    for pk, project_id, tags in changed:
        Run.objects.filter(pk=pk).update(tags=tags)
        RunTag.objects.filter(run_id=pk).exclude(tag__in=tags).delete()
        RunTag.objects.bulk_create([RunTag(run_id=pk, project_id=project_id, tag=tag, tag_folded=tag.casefold())
                                    for tag in tags], ignore_conflicts=True)


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0024_forget_metric_names_no_run_holds"),
    ]

    operations = [
        migrations.RunPython(forwards, migrations.RunPython.noop),
    ]
