"""Runs launched after launches fixed the template date (``runs.services._fix_template_date`` writes the launch's day
into ``data.chat_template_kwargs.date_string``) but before ``Run.stamped_template_date`` (0020) recorded it have the
date and no record, so a Duplicate of one kept the old run's day instead of fixing its own, as a copy of a newer run
does. The record is back-filled where the date is the one a launch wrote: the day the run was created (the launch's
request made the row; its date was that of the web process's clock, ``datetime.now()``, so the day in UTC and in the
process's local time both count), in the format the model's chat template stamps (``chat_template.stamp_format``; Llama's
``%d %b %Y`` where the model's files are gone), and the one the run's resolved spec, which the engine rendered, holds.
A retry of such a run (``x (retry)``, ``x (retry 2)``, …) kept its date: it gets the record where a run of its name
before it has it for the same date. Runs launched before launches fixed a date hold none (each render stamped its own
day): there is nothing to record, and a copy of one fixes its launch's day already."""
import re
from datetime import timezone
from pathlib import Path

from django.db import migrations

RETRY_SUFFIX = re.compile(r" \(retry(?: [0-9]+)?\)$")  # runs.services.RETRY_SUFFIX as retries were named
LLAMA_DATE_FORMAT = "%d %b %Y"


def _template_date(spec):
    variables = ((spec or {}).get("data") or {}).get("chat_template_kwargs") if isinstance(spec, dict) else None
    return variables.get("date_string") if isinstance(variables, dict) else None


def _stamp_format(model_path):
    """The format the run's model's template stamps in; Llama's when its files cannot be read; None when they can and
    the template stamps no day (a date there is the spec's author's)."""
    from jaxengine.chat_template import DEFAULT_CHAT_TEMPLATE, ChatTemplateError, stamp_format
    from jaxengine.tokenizer import TokenizerError, read_tokenizer_settings

    if not Path(model_path).is_dir():
        return LLAMA_DATE_FORMAT
    try:
        settings = read_tokenizer_settings(model_path, run_spec_variables=False)
        return stamp_format(settings.chat_template or DEFAULT_CHAT_TEMPLATE)
    except (TokenizerError, ChatTemplateError, OSError, TypeError, ValueError):
        return LLAMA_DATE_FORMAT


def forwards(apps, schema_editor):
    Run = apps.get_model("runs", "Run")
    stamped = {}  # (project, name without its retry suffix) -> the dates recorded so far
    runs = Run.objects.filter(stamped_template_date="").only(
        "pk", "project_id", "name", "spec", "resolved_spec", "created_at").order_by("created_at", "pk")
    recorded = Run.objects.exclude(stamped_template_date="").values_list("project_id", "name", "stamped_template_date")
    for project_id, name, date in recorded:
        stamped.setdefault((project_id, RETRY_SUFFIX.sub("", name)), set()).add(date)
    for run in runs.iterator():
        date = _template_date(run.spec)
        if not isinstance(date, str) or not date or date != _template_date(run.resolved_spec):
            continue
        family = (run.project_id, RETRY_SUFFIX.sub("", run.name))
        retried = RETRY_SUFFIX.search(run.name) is not None and date in stamped.get(family, ())
        if not retried:
            model_path = (run.resolved_spec or {}).get("model")
            date_format = _stamp_format(model_path) if isinstance(model_path, str) and model_path else LLAMA_DATE_FORMAT
            if date_format is None:
                continue
            launch_days = {run.created_at.astimezone(timezone.utc).strftime(date_format),
                           run.created_at.astimezone().strftime(date_format)}
            if date not in launch_days:
                continue
        Run.objects.filter(pk=run.pk).update(stamped_template_date=date)
        stamped.setdefault(family, set()).add(date)


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0022_fill_run_tags_and_metric_names"),
    ]

    operations = [
        migrations.RunPython(forwards, migrations.RunPython.noop),
    ]
