"""Runs migrations that bring older rows in line with what the services now do."""
from io import StringIO

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
