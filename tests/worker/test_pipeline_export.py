"""A pipeline's export stage on the train queue, for real: the task quantizes the last stage's
exported tiny model to int4 with the engine, and the pipeline succeeds with the copy's figures."""
import json
import shutil

import pytest

from jaxengine.spec import dump_spec, parse_spec
from tests import factories
from tests.webapp.factories import make_base_model, make_ready_version, make_team
from webapp.runs import pipelines, reporting
from webapp.runs.models import Pipeline, PipelineStatus, Run, RunStatus
from worker.tasks import train


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return factories.build_tiny_model_dir(tmp_path_factory.mktemp("tiny-export-stage"))


def test_the_export_stage_writes_the_serving_copy_and_finishes_the_pipeline(db, model_dir, monkeypatch):
    monkeypatch.setattr("webapp.celery.app.send_task", lambda *args, **kwargs: None)
    team = make_team()
    base = make_base_model(team.project, path=str(model_dir))
    rows = [{"prompt": "Hello there", "completion": " general"}, {"prompt": "a b c", "completion": " d e"}]
    data = make_ready_version(team.project, rows=rows)
    spec = {"task": "sft", "model": base.public_id,
            "data": {"train": data.public_id, "eval": data.public_id, "max_seq_len": 64}, "train": {"max_steps": 1}}
    document = {"name": "to-serve", "stages": [{"name": "sft", "spec": spec},
                                                {"name": "serve", "export": {"quantize": "int4", "group_size": 16}}]}
    pipeline = pipelines.pipeline_create(project=team.project, document=document, user=team.owner)
    run = pipeline.runs.get()
    # The first stage's run as the engine leaves it: its spec and its merged export.
    run.output_dir.mkdir(parents=True)
    (run.output_dir / "spec.yaml").write_text(dump_spec(parse_spec(run.resolved_spec)))
    shutil.copytree(model_dir, run.output_dir / "export")
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    run.refresh_from_db()
    run = reporting.run_finish(run=run, summary={"status": "succeeded", "step": 1,
                                                 "export": {"model": str(run.output_dir / "export")}})
    pipelines.pipeline_advance(run=run)

    train.export_stage(pipeline.pk, 1)
    pipeline.refresh_from_db()
    assert pipeline.status == PipelineStatus.SUCCEEDED, pipeline.message
    written = json.loads((run.output_dir / "export" / "quantized" / "quantization.json").read_text())
    assert written["scheme"] == "int4" and written["group_size"] == 16 and written["eval_sequences"] == 2
    assert pipeline.message.startswith("all 2 stages succeeded; int4 copy")
    result = pipelines.export_result(pipeline)
    assert result["perplexity_quantized"] == written["perplexity_quantized"] and 0 <= result["greedy_agreement"] <= 1
    train.export_stage(pipeline.pk, 1)  # delivered again: the stage is over, nothing is redone
    assert Pipeline.objects.get(pk=pipeline.pk).finished_at == pipeline.finished_at
