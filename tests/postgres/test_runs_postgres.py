"""Runs on PostgreSQL: the reporter's raw ``INSERT … ON CONFLICT DO NOTHING``, the grouped
min/max downsampling (integer bucket division), external-run logging and the run unique keys."""
from __future__ import annotations

import pytest

from tests.postgres.test_postgres import run_django

pytestmark = pytest.mark.integration

RUNS_SCRIPT = """
import django
django.setup()
from django.core.management import call_command
call_command("migrate", "--noinput", verbosity=0)
from django.contrib.auth import get_user_model
from webapp.celery import app
app.send_task = lambda *args, **kwargs: None
from tests.webapp.factories import make_base_model, make_ready_version
from webapp.projects.services import project_create
from webapp.runs import reporting, selectors, services
from webapp.runs.models import MetricPoint, Run

owner = get_user_model().objects.create_user("pg-runs", password="unused-password")
project = project_create(name="PG runs", slug="pg-runs", owner=owner)
spec = {"task": "sft", "model": make_base_model(project).public_id,
        "data": {"train": make_ready_version(project).public_id}, "train": {"max_steps": 5000}}
run = services.run_create(project=project, spec=spec, user=owner)
rows = [(run.pk, step, "loss", 1.0 / step, 100.0 + step, step * 10) for step in range(1, 5001)]
rows[2500] = (run.pk, 2501, "loss", 99.0, 2601.0, 25010)
reporting.insert_metric_rows(rows)
reporting.insert_metric_rows(rows[:10])  # replayed: nothing doubles
assert MetricPoint.objects.filter(run=run).count() == 5000
Run.objects.filter(pk=run.pk).update(current_step=5000)
run.refresh_from_db()
series = selectors.metric_series(run=run, max_points=100)["loss"]
assert series["downsampled"] and len(series["step"]) <= 100 and max(series["value"]) == 99.0, series["step"][:6]
assert series["step"][0] == 1 and series["step"][-1] == 5000
external = services.run_create_external(project=project, name="ext", config={"lr": 1}, user=owner)
assert services.metrics_log(run=external, points=[{"step": 1, "metrics": {"loss": 2.0}}]).stored == 1
assert services.metrics_log(run=external, points=[{"step": 1, "metrics": {"loss": 3.0}}]).stored == 0
# A running run's stored buckets plus the points stored since (by id) equal a full reduction.
Run.objects.filter(pk=run.pk).update(status="running")
run.refresh_from_db()
full = selectors.metric_series(run=run, max_points=100)
MetricPoint.objects.filter(run=run, step__gt=4000).delete()
Run.objects.filter(pk=run.pk).update(current_step=4000)
run.refresh_from_db()
stored = selectors.series_buckets(run=run, reuse_stored=False)
reporting.insert_metric_rows(rows[4000:])
Run.objects.filter(pk=run.pk).update(current_step=5000, series_cache={"buckets": stored.to_json()})
run.refresh_from_db()
assert selectors.metric_series(run=run, max_points=100) == full
# The compare page reads its runs together: the buckets of runs of different widths in one grouped query
# (a UNION ALL of a part per run), each run's series as it reads alone.
second = services.run_create(project=project, spec=spec, user=owner)
reporting.insert_metric_rows([(second.pk, step, "loss", float(step % 7), 50.0 + step, step) for step in range(1, 3001)])
Run.objects.filter(pk=second.pk).update(current_step=3000, status="running")
second.refresh_from_db()
alone = selectors.metric_series(run=second, max_points=100)
assert alone["loss"]["downsampled"] and selectors.runs_metric_series(runs=[run, second], max_points=100) == {
    run.pk: full, second.pk: alone}
Run.objects.filter(pk=second.pk).delete()  # the orders below are of the two runs
# A poll with new points times them from the run's first point: found in the (run, wall_time) index.
from django.db import connection
from django.test.utils import CaptureQueriesContext
with CaptureQueriesContext(connection) as start_read:
    assert selectors._start_time(run) == 101.0
with connection.cursor() as cursor:
    cursor.execute("ANALYZE runs_metricpoint")
    cursor.execute("EXPLAIN " + start_read.captured_queries[-1]["sql"])
    plan = "\\n".join(line for line, in cursor.fetchall())
assert "metricpoint_run_wall_time" in plan, plan
# Polls: the points after a step (or each metric's own step), a range of the (run, step) index.
assert selectors.metric_series(run=run, after_step=4998)["loss"]["step"] == [4999, 5000]
assert selectors.metric_series(run=run, after_step=4000, after_steps={"loss": 4998})["loss"]["step"] == [4999, 5000]
with CaptureQueriesContext(connection) as poll_read:
    assert selectors.metric_series(run=run, after_step=5000) == {}
with connection.cursor() as cursor:
    cursor.execute("EXPLAIN " + poll_read.captured_queries[-1]["sql"])
    plan = "\\n".join(line for line, in cursor.fetchall())
assert "metricpoint_run_step" in plan, plan
# A whole run's buckets come with their extremes' points in one query, each point joined to its own bucket by
# (name, bucket): joined on the name and the step range alone, PostgreSQL merged on the name and tested every
# bucket of the metric for each point (a minute for two runs of 100,000 points).
import re
from django.db.models import Q
with CaptureQueriesContext(connection) as bucket_read:
    selectors._grouped_buckets({run.pk: Q(run_id=run.pk)}, widths={run.pk: 64})
with connection.cursor() as cursor:
    cursor.execute("EXPLAIN ANALYZE " + bucket_read.captured_queries[-1]["sql"])
    plan = "\\n".join(line for line, in cursor.fetchall())
tested = sum(int(count) for count in re.findall(r"Rows Removed by Join Filter: (\\d+)", plan))
assert tested <= MetricPoint.objects.filter(run=run).count(), plan
# Samples by kind: JSON key lookups, a sample without a kind counting as an eval generation.
from webapp.runs.models import Sample
Sample.objects.bulk_create([Sample(run=run, step=1, position=0, prompt="p", text="rollout", extra={"kind": "rollout"}),
                            Sample(run=run, step=1, position=1, prompt="p", text="greedy")])
assert [s.text for s in selectors.sample_list(run=run, kind="rollout")] == ["rollout"]
assert [s.text for s in selectors.sample_list(run=run, kind="eval")] == ["greedy"]
# The runs table's metric orders: a JSON key cast to a number, runs without it last.
Run.objects.filter(pk=run.pk).update(final_metrics={"eval/loss": {"last": 2.5}, "reward": {"last": 0.25}})
Run.objects.filter(pk=external.pk).update(final_metrics={"eval/loss": {"last": 10.0}})
def order(sort):
    return [r.public_id for r in selectors.run_list(project=project, filters=selectors.RunFilters(sort=sort))]
assert order("eval_loss") == [run.public_id, external.public_id], order("eval_loss")
assert order("reward") == [run.public_id, external.public_id], order("reward")
# The API's keyset pages over those orders: a value's page, then the page of the runs without one.
for sort in ("eval_loss", "reward", "newest"):
    first = selectors.run_page(project=project, filters=selectors.RunFilters(sort=sort), after=None, limit=1)
    second = selectors.run_page(project=project, filters=selectors.RunFilters(sort=sort), after=first.next_after, limit=1)
    assert [r.public_id for r in first.rows + second.rows] == order(sort) and second.next_after is None, sort
print("ok")
"""


def test_runs_on_postgres(database_url, tmp_path):
    assert run_django(RUNS_SCRIPT, database_url, tmp_path).strip().splitlines()[-1] == "ok"
