"""Runs migrations that bring older rows in line with what the services now do."""
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.loader import MigrationLoader

from tests.webapp.migrating import migrated_back_to

pytestmark = pytest.mark.django_db(transaction=True)


def test_pipelines_cancelled_by_a_person_before_cancelled_by_existed_name_who():
    """A pipeline cancelled by a person before ``Pipeline.cancelled_by`` said who only in its message: without the
    name read back, a resume of its stage's run would take it on again. One its stage's run ended cancelled stays
    without a name, and follows such a resume."""
    with migrated_back_to(("runs", "0013_pipeline_export_started_at")) as apps:
        Project = apps.get_model("projects", "Project")
        Pipeline = apps.get_model("runs", "Pipeline")
        project = Project.objects.create(name="alpha", slug="alpha")
        for public_id, status, message in (
                ("pl_person", "cancelled", "cancelled by alpha-owner at stage 2 (\u2068dpo\u2069); its run ... stops"),
                ("pl_system", "cancelled", "cancelled by the system at stage 1 (\u2068sft\u2069)"),
                ("pl_stage", "cancelled", "stage 1 (sft) cancelled: cancelled by alpha-owner before it started"),
                ("pl_failed", "failed", "stage 1 (sft) failed: out of memory")):
            Pipeline.objects.create(public_id=public_id, project=project, name="chain", stages=[], status=status,
                                    message=message)
    from webapp.runs.models import Pipeline as CurrentPipeline

    assert dict(CurrentPipeline.objects.values_list("public_id", "cancelled_by")) == {
        "pl_person": "alpha-owner", "pl_system": "the system", "pl_stage": "", "pl_failed": ""}


def test_tags_stored_before_invisible_characters_were_refused_lose_them():
    """Tags that ``parse_tags`` refuses today (a zero-width space, a bidi override: category Cf) lose those
    characters and are put in NFC, as it stores them; one that then repeats another, or is left empty, goes."""
    with migrated_back_to(("runs", "0014_pipeline_cancelled_by")) as apps:
        Project = apps.get_model("projects", "Project")
        Run = apps.get_model("runs", "Run")
        project = Project.objects.create(name="alpha", slug="alpha")
        for public_id, tags in (("run_hidden", ["baseline", "base\u200bline", "\u202e", "cafe\u0301"]),
                                ("run_clean", ["baseline", "lr-sweep"]), ("run_none", [])):
            Run.objects.create(public_id=public_id, project=project, name="r", task="sft", spec={}, resolved_spec={},
                               tags=tags)
    from webapp.runs.models import Run as CurrentRun

    assert dict(CurrentRun.objects.values_list("public_id", "tags")) == {
        "run_hidden": ["baseline", "caf\u00e9"], "run_clean": ["baseline", "lr-sweep"], "run_none": []}


def test_the_note_that_an_exports_or_copys_worker_was_lost_moves_from_the_error_to_the_notice_and_back():
    """The note that a checkpoint export's or a serving copy's worker was lost and the work started over was stored
    as its ``error_message``, where it read as a failure: one still under way has it as its ``notice`` instead, and
    ``error_message`` holds failures only. Migrated back, the notice is its ``error_message`` again."""
    before = ("runs", "0017_metricpoint_run_step")
    note = "the worker exporting checkpoint 5 (w1) was lost; the export was queued again"
    with migrated_back_to(before) as apps:
        Project = apps.get_model("projects", "Project")
        Run = apps.get_model("runs", "Run")
        CheckpointExport = apps.get_model("runs", "CheckpointExport")
        ServingCopy = apps.get_model("runs", "ServingCopy")
        project = Project.objects.create(name="alpha", slug="alpha")
        run = Run.objects.create(public_id="run_a", project=project, name="r", task="sft", spec={}, resolved_spec={})
        for step, status, message in ((5, "exporting", note), (6, "failed", "disk full"), (7, "exporting", "")):
            CheckpointExport.objects.create(run=run, step=step, status=status, error_message=message)
            ServingCopy.objects.create(project=project, run=run, step=step,
                                       status={"exporting": "writing"}.get(status, status), error_message=message)
    from webapp.runs.models import CheckpointExport as CurrentExport, ServingCopy as CurrentCopy

    moved = {5: ("", note), 6: ("disk full", ""), 7: ("", "")}
    assert {step: (error, notice) for step, error, notice
            in CurrentExport.objects.values_list("step", "error_message", "notice")} == moved
    assert {step: (error, notice) for step, error, notice
            in CurrentCopy.objects.values_list("step", "error_message", "notice")} == moved
    with migrated_back_to(before) as apps:
        for model in ("CheckpointExport", "ServingCopy"):
            assert dict(apps.get_model("runs", model).objects.values_list("step", "error_message")) == {
                5: note, 6: "disk full", 7: ""}, model


def test_a_queued_runs_lost_attempt_moves_from_the_error_message_to_the_notice_and_back():
    """A run queued again after its worker was lost said so in its ``error_message``, which a REST client reads as
    the run's failure: a queued run has it as its ``notice`` instead; a finished run's message stays. Migrated back,
    the notice is its ``error_message`` again."""
    before = ("runs", "0018_notices")
    lost = "attempt 1 was lost at step 7 on worker train@a; re-queued to resume from its checkpoint at step 5"
    with migrated_back_to(before) as apps:
        Project = apps.get_model("projects", "Project")
        Run = apps.get_model("runs", "Run")
        project = Project.objects.create(name="alpha", slug="alpha")
        for public_id, status, message in (("run_lost", "queued", lost), ("run_queued", "queued", ""),
                                           ("run_failed", "failed", "OOM"), ("run_cancelled", "cancelled",
                                                                             "cancelled by alpha-owner")):
            Run.objects.create(public_id=public_id, project=project, name="r", task="sft", spec={}, resolved_spec={},
                               status=status, error_message=message)
    from webapp.runs.models import Run as CurrentRun

    assert {public_id: (error, notice) for public_id, error, notice
            in CurrentRun.objects.values_list("public_id", "error_message", "notice")} == {
        "run_lost": ("", lost), "run_queued": ("", ""), "run_failed": ("OOM", ""),
        "run_cancelled": ("cancelled by alpha-owner", "")}
    with migrated_back_to(before) as apps:
        assert dict(apps.get_model("runs", "Run").objects.values_list("public_id", "error_message")) == {
            "run_lost": lost, "run_queued": "", "run_failed": "OOM", "run_cancelled": "cancelled by alpha-owner"}


def test_the_points_indexes_are_built_by_a_plain_create_index_on_sqlite_concurrently_on_postgresql():
    """Migrations 0016 and 0017 run outside a transaction, which PostgreSQL's CREATE INDEX CONCURRENTLY needs
    (tests/postgres/test_index_migrations_postgres.py shows writers going on meanwhile); on SQLite, which has
    no such keyword, they are a plain CREATE INDEX. Either way the index is there after, over the points
    already stored."""
    concurrently = connection.vendor == "postgresql"
    for migration_name, index_name in (("0016_metricpoint_run_wall_time", "metricpoint_run_wall_time"),
                                       ("0017_metricpoint_run_step", "metricpoint_run_step")):
        assert MigrationLoader(connection).get_migration("runs", migration_name).atomic is False
        sql = StringIO()
        call_command("sqlmigrate", "runs", migration_name, stdout=sql)
        assert ("CREATE INDEX CONCURRENTLY" in sql.getvalue()) is concurrently, sql.getvalue()
        assert f'CREATE INDEX "{index_name}"' in sql.getvalue() or concurrently, sql.getvalue()
    with migrated_back_to(("runs", "0015_visible_tags")) as apps:
        assert "metricpoint_run_wall_time" not in points_indexes()
        Project = apps.get_model("projects", "Project")
        Run = apps.get_model("runs", "Run")
        MetricPoint = apps.get_model("runs", "MetricPoint")
        run = Run.objects.create(public_id="run_points", project=Project.objects.create(name="alpha", slug="alpha"),
                                 name="r", task="sft", spec={}, resolved_spec={})
        MetricPoint.objects.bulk_create([MetricPoint(run=run, step=step, name="loss", value=1.0 / step,
                                                     wall_time=100.0 + step) for step in range(1, 51)])
    indexes = points_indexes()
    assert indexes["metricpoint_run_wall_time"] == ["run_id", "wall_time"]
    assert indexes["metricpoint_run_step"] == ["run_id", "step"]
    from webapp.runs.models import MetricPoint as CurrentMetricPoint

    assert CurrentMetricPoint.objects.filter(run__public_id="run_points").count() == 50


def points_indexes() -> dict[str, list[str]]:
    """The metric points table's indexes, by name: their columns."""
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, "runs_metricpoint")
    return {name: found["columns"] for name, found in constraints.items() if found["index"]}


def test_run_tags_and_final_metric_names_stored_before_their_indexes_are_filled_into_them():
    """The runs table's search, tag menu and sort menu read ``RunTag`` and ``ProjectMetricName``: the runs there were
    before them get a row per tag (folded for the search) and their projects a row per final-metric name any of
    their runs logged, an archived run's too, each project its own."""
    with migrated_back_to(("runs", "0020_run_stamped_template_date")) as apps:
        Project = apps.get_model("projects", "Project")
        Run = apps.get_model("runs", "Run")
        alpha = Project.objects.create(name="alpha", slug="alpha")
        beta = Project.objects.create(name="beta", slug="beta")
        for public_id, project, tags, final_metrics, archived in (
                ("run_a", alpha, ["Ablation-LR", "café"], {"loss": {"last": 1.0}, "eval/bleu": {"last": 0.5}}, False),
                ("run_b", alpha, [], {"loss": {"last": 2.0}, "grad_norm": {"last": 0.5}}, True),
                ("run_c", beta, ['"quoted", tag'], {}, False)):
            Run.objects.create(public_id=public_id, project=project, name="r", task="sft", spec={}, resolved_spec={},
                               tags=tags, final_metrics=final_metrics, archived=archived)
    from webapp.projects.models import Project as CurrentProject
    from webapp.runs.models import ProjectMetricName, RunTag
    from webapp.runs.selectors import RunFilters, run_list

    assert sorted(RunTag.objects.values_list("run__public_id", "project__slug", "tag", "tag_folded")) == [
        ("run_a", "alpha", "Ablation-LR", "ablation-lr"), ("run_a", "alpha", "café", "café"),
        ("run_c", "beta", '"quoted", tag', '"quoted", tag')]
    assert sorted(ProjectMetricName.objects.values_list("project__slug", "name")) == [
        ("alpha", "eval/bleu"), ("alpha", "grad_norm"), ("alpha", "loss")]
    beta = CurrentProject.objects.get(slug="beta")
    assert [run.public_id for run in run_list(project=beta, filters=RunFilters(search='"QUOTED", '))] == ["run_c"]


def test_runs_launched_before_the_template_date_was_recorded_get_the_record_where_their_launch_wrote_it(tmp_path):
    """Session 32: runs launched after launches fixed the template date but before Run.stamped_template_date (0020)
    had the date and no record, so a Duplicate of one kept the old run's day rather than fixing its own. The record
    is back-filled where the date is the one its launch wrote: the day it was created, in the format its model's
    template stamps (Llama's where the model's files are gone), as its resolved spec rendered it; and for a retry of
    such a run, which kept it. A date an author wrote, one a template that stamps no day was given, and a resolved
    spec that rendered another stay unrecorded."""
    from datetime import datetime, timezone

    from tests.factories import build_bpe_tokenizer_dir
    from webapp.runs import services

    templates = Path(__file__).parents[2] / "jaxengine" / "tokenizer" / "real_templates"

    def model(name, template_file):
        return str(build_bpe_tokenizer_dir(tmp_path / name, style="llama3", chat_template=(
            templates / template_file).read_text(encoding="utf-8")))

    llama, qwen, gone = model("llama3-2", "llama3_2.jinja"), model("qwen3", "qwen3.jinja"), str(tmp_path / "gone")
    launched = datetime(2026, 3, 4, 12, 0, tzinfo=timezone.utc)
    day, next_day = "04 Mar 2026", "05 Mar 2026"
    with migrated_back_to(("runs", "0020_run_stamped_template_date")) as apps:
        Project = apps.get_model("projects", "Project")
        Run = apps.get_model("runs", "Run")
        project = Project.objects.create(name="alpha", slug="alpha")
        for public_id, name, path, written, rendered, created in (
                ("run_launched", "dated", llama, day, day, launched),
                ("run_retry", "dated (retry)", llama, day, day, launched.replace(day=6)),
                ("run_gone", "moved", gone, day, day, launched),
                ("run_author", "authored", llama, "01 Jan 2030", "01 Jan 2030", launched),
                ("run_undated", "qwen", qwen, day, day, launched),
                ("run_other", "rendered another", llama, day, next_day, launched),
                ("run_late_retry", "authored (retry 2)", llama, "01 Jan 2030", "01 Jan 2030", launched.replace(day=7)),
                ("run_none", "none", llama, None, None, launched)):
            variables = {} if written is None else {"date_string": written}
            rendered_variables = {} if rendered is None else {"date_string": rendered}
            run = Run.objects.create(
                public_id=public_id, project=project, name=name, task="sft",
                spec={"task": "sft", "data": {"chat_template_kwargs": variables}},
                resolved_spec={"task": "sft", "model": path, "data": {"chat_template_kwargs": rendered_variables}})
            Run.objects.filter(pk=run.pk).update(created_at=created)
        Run.objects.create(public_id="run_recorded", project=project, name="next", task="sft", stamped_template_date=day,
                           spec={"data": {"chat_template_kwargs": {"date_string": day}}}, resolved_spec={})
    from webapp.runs.models import Run as CurrentRun

    assert dict(CurrentRun.objects.values_list("public_id", "stamped_template_date")) == {
        "run_launched": day, "run_retry": day, "run_gone": day, "run_author": "", "run_undated": "", "run_other": "",
        "run_late_retry": "", "run_none": "", "run_recorded": day}
    # A Duplicate of the back-filled run leaves its day out for its own launch to fix; the author's date is copied.
    assert services.spec_of_a_copy(CurrentRun.objects.get(public_id="run_launched")) == (
        {"task": "sft", "data": {"chat_template_kwargs": {}}}, day)
    assert services.spec_of_a_copy(CurrentRun.objects.get(public_id="run_author"))[1] is None


def test_sort_menu_names_no_run_holds_any_more_are_taken_out(monkeypatch):
    """Before ``services.metric_names_rewritten`` an attempt that started over (or another rewrite of a run's
    ``final_metrics``) left its dropped names in the runs table's sort menu, which offered metrics no run held. Those
    rows go: a project keeps the names some run of its own holds (an archived run's too), in chunks (``BATCH`` made
    small here so that the names and runs span several)."""
    import importlib

    migration = importlib.import_module("webapp.runs.migrations.0024_forget_metric_names_no_run_holds")
    monkeypatch.setattr(migration, "BATCH", 2)
    with migrated_back_to(("runs", "0023_backfill_stamped_template_date")) as apps:
        Project = apps.get_model("projects", "Project")
        Run = apps.get_model("runs", "Run")
        ProjectMetricName = apps.get_model("runs", "ProjectMetricName")
        alpha = Project.objects.create(name="alpha", slug="alpha")
        beta = Project.objects.create(name="beta", slug="beta")
        empty = Project.objects.create(name="empty", slug="empty")
        for public_id, project, final_metrics, archived in (
                ("run_a", alpha, {"loss": {"last": 1.0}, "eval/bleu": {"last": 0.5}}, False),
                ("run_b", alpha, {"grad_norm": {"last": 0.5}}, True),
                ("run_c", alpha, {}, False),
                ("run_d", beta, {"reward/mean": {"last": 0.1}}, False),
                ("run_e", beta, {"loss": {"last": 3.0}}, False)):
            Run.objects.create(public_id=public_id, project=project, name="r", task="sft", spec={}, resolved_spec={},
                               final_metrics=final_metrics, archived=archived)
        for project, names in ((alpha, ["loss", "eval/bleu", "grad_norm", "old/kl", "reward/mean", "lr"]),
                               (beta, ["reward/mean", "eval/bleu", "loss"]), (empty, ["loss"])):
            ProjectMetricName.objects.bulk_create([ProjectMetricName(project=project, name=name) for name in names])
    from webapp.runs.models import ProjectMetricName as CurrentProjectMetricName

    assert sorted(CurrentProjectMetricName.objects.values_list("project__slug", "name")) == [
        ("alpha", "eval/bleu"), ("alpha", "grad_norm"), ("alpha", "loss"), ("beta", "loss"), ("beta", "reward/mean")]


def test_tags_differing_only_in_case_are_merged_into_the_oldest_runs_spelling():
    """"Baseline" and "baseline" were two tags of a project; they become one, spelt as the oldest run holding it
    spells it (not the first saved: the created times say which is older), in each run's list and in its ``RunTag``
    rows; a run holding both keeps one where the first stood, and another project keeps its own spelling."""
    from datetime import UTC, datetime

    with migrated_back_to(("runs", "0024_forget_metric_names_no_run_holds")) as apps:
        Project = apps.get_model("projects", "Project")
        Run = apps.get_model("runs", "Run")
        RunTag = apps.get_model("runs", "RunTag")
        alpha = Project.objects.create(name="alpha", slug="alpha")
        beta = Project.objects.create(name="beta", slug="beta")
        for public_id, project, tags, day in (("run_new", alpha, ["baseline", "x"], 3),
                                              ("run_old", alpha, ["lr", "Baseline"], 1),
                                              ("run_both", alpha, ["BASELINE", "LR", "baseline"], 2),
                                              ("run_beta", beta, ["BASELINE"], 4)):
            run = Run.objects.create(public_id=public_id, project=project, name="r", task="sft", spec={},
                                     resolved_spec={}, tags=tags)
            Run.objects.filter(pk=run.pk).update(created_at=datetime(2026, 1, day, tzinfo=UTC))
            RunTag.objects.bulk_create([RunTag(run=run, project=project, tag=tag, tag_folded=tag.casefold())
                                        for tag in tags])
    from webapp.runs.models import Run as CurrentRun
    from webapp.runs.models import RunTag as CurrentRunTag

    assert dict(CurrentRun.objects.values_list("public_id", "tags")) == {
        "run_old": ["lr", "Baseline"], "run_both": ["Baseline", "lr"], "run_new": ["Baseline", "x"],
        "run_beta": ["BASELINE"]}
    assert sorted(CurrentRunTag.objects.values_list("run__public_id", "tag", "tag_folded")) == [
        ("run_beta", "BASELINE", "baseline"), ("run_both", "Baseline", "baseline"), ("run_both", "lr", "lr"),
        ("run_new", "Baseline", "baseline"), ("run_new", "x", "x"), ("run_old", "Baseline", "baseline"),
        ("run_old", "lr", "lr")]


def test_runs_launched_before_dataset_names_were_recorded_get_those_of_their_versions_still_there():
    with migrated_back_to(("runs", "0025_one_spelling_per_tag"), ("datasets", "0009_version_notice")) as apps:
        Project = apps.get_model("projects", "Project")
        Run = apps.get_model("runs", "Run")
        Dataset = apps.get_model("datasets", "Dataset")
        DatasetVersion = apps.get_model("datasets", "DatasetVersion")
        project = Project.objects.create(name="alpha", slug="alpha")
        chats = Dataset.objects.create(project=project, name="chats", name_key="chats", kind="sft")
        questions = Dataset.objects.create(project=project, name="questions", name_key="questions", kind="prompts")
        train = DatasetVersion.objects.create(public_id="dv_train", dataset=chats, number=3, file_path="a",
                                              original_filename="a.jsonl", format="jsonl", size_bytes=1)
        held_out = DatasetVersion.objects.create(public_id="dv_eval", dataset=questions, number=1, file_path="b",
                                                 original_filename="b.jsonl", format="jsonl", size_bytes=1)
        both = Run.objects.create(public_id="run_both", project=project, name="r", task="sft",
                                  spec={"data": {"train": "dv_train", "eval": "dv_eval"}}, resolved_spec={})
        both.dataset_versions.set([train, held_out])
        Run.objects.create(public_id="run_gone", project=project, name="r", task="sft",
                           spec={"data": {"train": "dv_deleted"}}, resolved_spec={})
    from webapp.runs.models import Run as CurrentRun

    assert dict(CurrentRun.objects.values_list("public_id", "dataset_names")) == {
        "run_both": {"dv_train": {"name": "chats", "number": 3}, "dv_eval": {"name": "questions", "number": 1}},
        "run_gone": {}}
