"""Run services: create (ids resolved to paths, validated by the engine's schema, enqueued on
commit), cancel, resume, retry, tags, and the reaping of lost runs."""
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import OperationalError
from django.utils import timezone

from tests.webapp.factories import make_ready_version, thinking_model_dir
from tests.webapp.runs.conftest import FakeRedis, make_pool_worker, sft_spec, with_checkpoint
from webapp.core.templatetags.temper import when
from webapp.runs import selectors, services
from webapp.runs.models import Artifact, ArtifactKind, CheckpointExport, Run, RunStatus, RunTag
from webapp.workers.models import Worker


def create(team, catalog, sent_tasks, django_capture_on_commit_callbacks, **overrides) -> Run:
    with django_capture_on_commit_callbacks(execute=True):
        return services.run_create(project=team.project, spec=sft_spec(catalog, **overrides), user=team.teammate)


def test_it_resolves_ids_validates_saves_and_enqueues_on_commit(team, catalog, sent_tasks,
                                                                 django_capture_on_commit_callbacks):
    run = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
    assert run.public_id.startswith("run_") and run.status == RunStatus.QUEUED and run.attempt == 1
    assert run.resolved_spec["model"] == "/models/tiny"
    assert run.resolved_spec["data"]["train"] == str(catalog.sft.absolute_path)
    assert run.resolved_spec["output_dir"] == str(Path(settings.DATA_ROOT) / "runs" / run.public_id)
    # The written spec keeps ids, has every default filled in, and no output_dir.
    assert run.spec["model"] == catalog.base_model.public_id and run.spec["data"]["train"] == catalog.sft.public_id
    assert "output_dir" not in run.spec and run.spec["optim"]["schedule"] == "cosine"
    assert run.total_steps == 10 and run.base_model == catalog.base_model
    assert list(run.dataset_versions.all()) == [catalog.sft]
    assert sent_tasks.calls == [("worker.tasks.train.train_run", [run.pk, 1], "train")]
    assert run.name == "sft-tiny"


def test_a_warmup_as_long_as_the_run_is_logged_as_a_warning_at_launch(team, catalog, sent_tasks):
    """The sft preset "Full fine-tune" (2 epochs, warmup 20) on 8 rows in batches of 8 takes 2 steps: its
    learning rate never left the warmup, and nothing said so."""
    from webapp.runs.models import LogLevel
    from webapp.runs.presets import preset_spec

    spec = {**preset_spec("sft", "Full fine-tune"), "model": catalog.base_model.public_id,
            "data": {"train": catalog.sft.public_id, "eval": catalog.prompts.public_id}}
    run = services.run_create(project=team.project, spec=spec, user=team.teammate)
    assert list(run.log_lines.filter(level=LogLevel.WARNING).values_list("message", flat=True)) == [
        "optim.warmup_steps: 20 is not below the run's 2 optimizer steps (at most: train.epochs 2 × 8 rows of "
        "data.train / (train.batch_size 8 × train.grad_accum 1)), so the learning rate never reaches "
        "optim.learning_rate 2e-05: the run ends still warming up; give warmup_steps below 2 (a tenth of the "
        "steps is common) or train longer"]
    assert run.status == RunStatus.QUEUED  # a warning: the run is launched all the same
    fitting = services.run_create(project=team.project, spec=sft_spec(catalog, optim={"warmup_steps": 9}),
                                  user=team.teammate)
    assert not fitting.log_lines.filter(level=LogLevel.WARNING).exists()


def test_nothing_is_enqueued_before_commit(team, catalog, sent_tasks):
    services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate)
    assert sent_tasks.calls == []  # the test transaction never commits


def test_it_rejects_each_wrong_key_by_name(team, catalog, sent_tasks):
    spec = sft_spec(catalog, optim={"schedule": "cosin", "learning_rate": -1}, output_dir="/tmp/x")
    spec["data"]["train"] = catalog.preference.public_id
    with pytest.raises(ValidationError) as caught:
        services.run_create(project=team.project, spec=spec, user=team.teammate)
    errors = caught.value.message_dict
    assert "is not one of constant, linear, cosine" in errors["optim.schedule"][0]
    assert "optim.learning_rate" in errors
    assert "pairs v1 is a preference dataset; sft needs sft" in errors["data.train"][0]
    assert "remove output_dir" in errors["output_dir"][0]
    assert Run.objects.count() == 0


EIGHT_ROWS = {"max_steps": 10, "batch_size": 8}  # rows that split over data × fsdp up to 8


def test_a_layout_must_multiply_to_the_devices_the_pool_gives_the_job(team, catalog, sent_tasks, tpu_pool):
    # 2 hosts of pool tpu (live workers of 4 devices each; the stale one of 8 does not count) = 8 devices.
    spec = sft_spec(catalog, parallel={"data": 2, "fsdp": 2}, hosts=2, pool="tpu", train=EIGHT_ROWS)
    with pytest.raises(ValidationError) as caught:
        services.run_create(project=team.project, spec=spec, user=team.teammate)
    assert caught.value.message_dict == {"parallel": [
        "data 2 × fsdp 2 × tensor 1 = 4 devices, but a job of 2 hosts on pool tpu gets 8 (its workers: 2 workers × "
        "4 cpu devices (cpu)); make the sizes multiply to 8, or leave parallel out (blank in the form) for the "
        "default layout"]}
    assert Run.objects.count() == 0
    one_host = sft_spec(catalog, parallel={"data": 2, "tensor": 2}, pool="tpu", train=EIGHT_ROWS)  # 4 devices
    assert services.run_create(project=team.project, spec=one_host, user=team.teammate).spec["parallel"] == {
        "data": 2, "fsdp": 1, "tensor": 2}
    run = services.run_create(project=team.project, spec={**spec, "parallel": {"data": 2, "fsdp": 4}},
                              user=team.teammate)
    assert run.spec["parallel"] == {"data": 2, "fsdp": 4, "tensor": 1} and run.hosts == 2
    assert run.spec["pool"] == "tpu" and run.resolved_spec["parallel"] == run.spec["parallel"]


def test_a_layout_is_left_to_the_job_where_the_pool_does_not_say_its_devices(team, catalog, sent_tasks, tpu_pool):
    odd = {"tensor": 3}
    # No live worker of the pool; workers still probing; workers that differ: only the job's start can tell.
    assert services.run_create(project=team.project, spec=sft_spec(catalog, parallel=odd, pool="gpu"), user=None)
    make_pool_worker("train@a100", pool="mixed", devices={"platform": "gpu", "count": 4})
    make_pool_worker("train@h200", pool="mixed", devices={"platform": "gpu", "count": 8})
    make_pool_worker("train@new", pool="probing", devices={})
    for pool in ("mixed", "probing"):
        assert services.run_create(project=team.project, spec=sft_spec(catalog, parallel=odd, pool=pool), user=None)
    # Without parallel the job takes the default layout for whatever it gets.
    assert services.run_create(project=team.project, spec=sft_spec(catalog, hosts=2, pool="tpu"), user=None)


def test_a_layout_the_batch_does_not_split_over_is_refused_at_launch(team, catalog, sent_tasks, tpu_pool):
    """QA 2026-12-04: parallel {data: 8} with train.batch_size 4 was placed on two hosts, which joined
    and then failed at the job's start; the rule needs no device, so the launch names it."""
    spec = sft_spec(catalog, parallel={"data": 8}, hosts=2, pool="tpu", train={"max_steps": 10, "batch_size": 4})
    with pytest.raises(ValidationError) as caught:
        services.run_create(project=team.project, spec=spec, user=team.teammate)
    assert caught.value.message_dict == {"train.batch_size": [
        "4 rows do not split over parallel data × fsdp = 8 devices; give a multiple of 8, or move devices to "
        "parallel.tensor"]}
    assert Run.objects.count() == 0 and sent_tasks.calls == []


def test_bad_layout_hosts_and_pool_values_are_named_by_key(team, catalog, sent_tasks):
    spec = sft_spec(catalog, parallel={"data": "two", "fsdp": 0}, hosts=0, pool="Big Pool")
    with pytest.raises(ValidationError) as caught:
        services.run_create(project=team.project, spec=spec, user=team.teammate)
    errors = caught.value.message_dict
    assert set(errors) == {"parallel.data", "parallel.fsdp", "hosts", "pool"}
    assert "'two'" in errors["parallel.data"][0] and "too small: give a whole number" in errors["parallel.fsdp"][0]
    grpo = {"task": "grpo", "model": catalog.base_model.public_id, "data": {"train": catalog.prompts.public_id},
            "train": {"max_steps": 2}, "grpo": {"rewards": [{"name": "exact_match"}]}, "hosts": 2}
    with pytest.raises(ValidationError) as caught:
        services.run_create(project=team.project, spec=grpo, user=team.teammate)
    assert caught.value.message_dict["hosts"][0].startswith("grpo runs on one host")
    assert Run.objects.count() == 0


def test_a_version_not_ready_is_refused_saying_what_to_do(team, catalog, sent_tasks):
    """It read "v1 is failed, not ready; wait for its check or fix the upload": a failed version never gets ready."""
    from webapp.datasets.models import VersionStatus

    for status, said in ((VersionStatus.FAILED, "failed its check: a run trains on a ready version only; fix the file "
                                                "and upload it again"),
                         (VersionStatus.VALIDATING, "is being checked: a run trains on a ready version only; wait for "
                                                    "its check to end")):
        type(catalog.sft).objects.filter(pk=catalog.sft.pk).update(status=status)
        with pytest.raises(ValidationError) as refused:
            services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate)
        assert refused.value.message_dict["data.train"] == [f"{catalog.sft} {said}"]
    assert not Run.objects.exists()


def test_it_rejects_objects_of_another_project(team, catalog, sent_tasks):
    foreign = make_ready_version(team.outsider_project, name="theirs")
    spec = sft_spec(catalog)
    spec["data"]["train"] = foreign.public_id
    spec["model"] = "bm_doesnotexist"
    with pytest.raises(ValidationError) as caught:
        services.run_create(project=team.project, spec=spec, user=team.teammate)
    assert "is not a dataset version of alpha" in caught.value.message_dict["data.train"][0]
    assert "is not a base model of alpha" in caught.value.message_dict["model"][0]


def test_a_succeeded_runs_export_is_a_starting_model(team, catalog, sent_tasks, django_capture_on_commit_callbacks,
                                                     tmp_path):
    first = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
    spec = {**sft_spec(catalog), "model": first.public_id}
    with pytest.raises(ValidationError, match="has no exported model"):
        services.run_create(project=team.project, spec=spec, user=team.teammate)
    Run.objects.filter(pk=first.pk).update(status=RunStatus.SUCCEEDED)
    Artifact.objects.create(run=first, kind=ArtifactKind.MODEL, path=str(tmp_path))
    second = services.run_create(project=team.project, spec=spec, user=team.teammate)
    assert second.resolved_spec["model"] == str(tmp_path) and second.source_run == first
    assert second.spec["model"] == first.public_id


def test_a_run_from_a_runs_model_renders_with_its_run_rows_variables_whatever_its_directory_holds(
        team, catalog, sent_tasks, tmp_path):
    """An export made before exports kept chat_template_kwargs.json has its run's template variables from the run
    directory's spec.yaml alone, and the engine read them there for a run started from it: with that file moved or
    deleted, the new run trained otherwise than its model had (a Qwen3 trained with thinking off went on with it on).
    The launch takes them from the source's Run row into the resolved spec, under the spec's own; the spec as written
    keeps the author's alone."""
    from jaxengine.spec import parse_spec
    from jaxengine.tokenizer import read_tokenizer_settings

    variables = {"enable_thinking": False}
    source_dir = tmp_path / "source"
    source_dir.mkdir()
    source = Run.objects.create(project=team.project, name="trained off", task="sft", status=RunStatus.SUCCEEDED,
                                spec={"task": "sft", "data": {"chat_template_kwargs": variables}},
                                resolved_spec={"output_dir": str(source_dir), "data": {"chat_template_kwargs": variables}},
                                created_by=team.owner)
    for name, kind, step in (("export", ArtifactKind.MODEL, 9), ("export-step-5", ArtifactKind.CHECKPOINT, 5)):
        Artifact.objects.create(run=source, kind=kind, step=step, path=str(thinking_model_dir(source_dir / name)))
    written_spec = source_dir / "spec.yaml"  # as the engine wrote it; no chat_template_kwargs.json in the exports
    written_spec.write_text(yaml.safe_dump({"task": "sft", "data": {"chat_template_kwargs": variables}}))

    def rendered_with(run: Run) -> dict:
        """The variables the engine renders the run's chats with (jaxengine.job.build_job_model): its model's own,
        then the job's data.chat_template_kwargs over them."""
        job = parse_spec(run.resolved_spec)
        return {**read_tokenizer_settings(job.model, run_spec_variables=job.data.run_spec_template_kwargs
                                          ).template_kwargs, **job.data.chat_template_kwargs}

    for model in (source.public_id, f"{source.public_id}@5"):
        spec = {**sft_spec(catalog), "model": model}
        beside = services.run_create(project=team.project, spec=spec, user=team.teammate)
        assert beside.resolved_spec["data"]["chat_template_kwargs"] == variables
        assert beside.spec["data"]["chat_template_kwargs"] == {}
        assert rendered_with(beside) == variables
        written_spec.rename(tmp_path / "spec.yaml")
        moved = services.run_create(project=team.project, spec=spec, user=team.teammate)
        assert moved.resolved_spec["data"] == beside.resolved_spec["data"]
        assert rendered_with(moved) == variables, model
        (tmp_path / "spec.yaml").rename(written_spec)

    # The spec's own variables win over its model's.
    own = services.run_create(project=team.project, user=team.teammate, spec={
        **sft_spec(catalog), "model": source.public_id,
        "data": {"train": catalog.sft.public_id, "chat_template_kwargs": {"enable_thinking": True}}})
    assert own.resolved_spec["data"]["chat_template_kwargs"] == {"enable_thinking": True}
    assert own.spec["data"]["chat_template_kwargs"] == {"enable_thinking": True}
    assert rendered_with(own) == {"enable_thinking": True}


def test_a_launch_from_an_old_export_takes_its_variables_from_the_run_row_alone(team, catalog, sent_tasks, tmp_path):
    """An export made before exports kept chat_template_kwargs.json: the engine read the variables of its run
    directory's spec.yaml under the Run row's the launch gave, so a name spec.yaml held and the Run row did not was
    rendered all the same, and the launch's own checks read it too (a date_string there left the day unfixed, and
    the run rendered spec.yaml's day). The Run row is the one source: the resolved spec tells the engine to read
    nothing from spec.yaml (data.run_spec_template_kwargs: false), and the launch reads the model so too."""
    from datetime import datetime

    from jaxengine.spec import parse_spec
    from jaxengine.tokenizer import read_tokenizer_settings
    from tests.factories import build_bpe_tokenizer_dir

    templates = Path(__file__).parents[2] / "jaxengine" / "tokenizer" / "real_templates"
    source_dir = tmp_path / "source"
    build_bpe_tokenizer_dir(source_dir / "export", style="llama3",
                            chat_template=(templates / "llama3_2.jinja").read_text(encoding="utf-8"))
    recorded = {"tools_in_user_message": False}  # the Run row's; spec.yaml holds another set
    source = Run.objects.create(project=team.project, name="old export", task="sft", status=RunStatus.SUCCEEDED,
                                spec={"task": "sft", "data": {"chat_template_kwargs": recorded}},
                                resolved_spec={"output_dir": str(source_dir), "data": {"chat_template_kwargs": recorded}},
                                created_by=team.owner)
    Artifact.objects.create(run=source, kind=ArtifactKind.MODEL, step=9, path=str(source_dir / "export"))
    (source_dir / "spec.yaml").write_text(yaml.safe_dump(
        {"task": "sft", "data": {"chat_template_kwargs": {"date_string": "01 Jan 2020"}}}))

    def engine_variables(run: Run) -> dict:
        """What jaxengine.job.build_job_model renders the run's chats with: the model's own, read as the job says,
        then the job's data.chat_template_kwargs."""
        job = parse_spec(run.resolved_spec)
        own = read_tokenizer_settings(job.model, run_spec_variables=job.data.run_spec_template_kwargs).template_kwargs
        return {**own, **job.data.chat_template_kwargs}

    run = services.run_create(project=team.project, spec=sft_spec(catalog, model=source.public_id),
                              user=team.teammate)
    # spec.yaml's date is no variable of the run's model: the launch fixes its own day, and the engine renders it.
    today = datetime.now().strftime("%d %b %Y")
    assert run.stamped_template_date == today
    assert run.resolved_spec["data"]["run_spec_template_kwargs"] is False
    assert engine_variables(run) == {**recorded, "date_string": today}
    assert "run_spec_template_kwargs" not in run.spec["data"]
    assert run.spec["data"]["chat_template_kwargs"] == {"date_string": today}

    # The other way round: a variable the Run row holds and spec.yaml does not is rendered, spec.yaml's is not.
    source.resolved_spec = {**source.resolved_spec, "data": {"chat_template_kwargs": {"date_string": "03 Mar 2033"}}}
    source.save(update_fields=["resolved_spec"])
    (source_dir / "spec.yaml").write_text(yaml.safe_dump(
        {"task": "sft", "data": {"chat_template_kwargs": {"tools_in_user_message": False}}}))
    run = services.run_create(project=team.project, spec=sft_spec(catalog, model=source.public_id),
                              user=team.teammate)
    assert run.stamped_template_date == ""
    assert engine_variables(run) == {"date_string": "03 Mar 2033"}

    # Temper sets the switch: a spec that writes it is refused naming it, with nothing saved.
    written = sft_spec(catalog, model=source.public_id)
    written["data"]["run_spec_template_kwargs"] = True
    runs_before = Run.objects.count()
    with pytest.raises(ValidationError) as caught:
        services.run_create(project=team.project, spec=written, user=team.teammate)
    assert "never its directory's spec.yaml" in caught.value.message_dict["data.run_spec_template_kwargs"][0]
    assert Run.objects.count() == runs_before


def test_yaml_errors_name_their_line(team, catalog):
    text = f"task: sft\nmodel: {catalog.base_model.public_id}\ndata:\n  train: x\noptim:\n  schedule: cosin\ntrain:\n  max_steps: 5\n"
    with pytest.raises(ValidationError) as caught:
        services.spec_from_yaml(text)
    assert caught.value.message_dict["spec_yaml"] == ["spec:6: optim.schedule: 'cosin' is not one of constant, linear, cosine"]
    with pytest.raises(ValidationError, match="YAML syntax error"):
        services.spec_from_yaml("task: [sft\n")


def test_yaml_errors_list_an_output_dir_with_the_schemas_problems(team, catalog):
    """QA: the schema accepts output_dir and plan_run refuses it, so a YAML spec with another mistake was
    refused for that mistake alone, and for its output_dir only once it was fixed."""
    text = (f"task: sft\nmodel: {catalog.base_model.public_id}\noutput_dir: runs/x\ndata:\n  train: x\n"
            "optim:\n  schedule: cosin\ntrain:\n  max_steps: 5\n")
    with pytest.raises(ValidationError) as caught:
        services.spec_from_yaml(text)
    assert caught.value.message_dict["spec_yaml"] == [
        "spec:7: optim.schedule: 'cosin' is not one of constant, linear, cosine",
        "spec:3: output_dir: Temper gives every run its own directory; remove output_dir"]


def test_yaml_spec_launches_like_the_form(team, catalog, sent_tasks):
    text = services.spec_to_yaml(sft_spec(catalog))
    run = services.run_create(project=team.project, spec=services.spec_from_yaml(text), user=team.teammate)
    assert run.resolved_spec["train"]["max_steps"] == 10


def test_cancel_a_queued_run_at_once_and_a_running_one_by_flag(team, catalog, sent_tasks,
                                                                django_capture_on_commit_callbacks, monkeypatch):
    flags = []
    monkeypatch.setattr(services, "_set_cancel_flag", flags.append)
    queued = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
    cancelled = services.run_cancel(run=queued, user=team.teammate)
    assert cancelled.status == RunStatus.CANCELLED and "before it started" in cancelled.error_message
    running = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
    Run.objects.filter(pk=running.pk).update(status=RunStatus.RUNNING)
    with django_capture_on_commit_callbacks(execute=True):
        asked = services.run_cancel(run=running, user=team.teammate)
    assert asked.status == RunStatus.RUNNING and asked.cancel_requested and flags == [running.public_id]
    with pytest.raises(ValidationError, match="only queued or running"):
        services.run_cancel(run=cancelled, user=team.teammate)


def test_a_second_cancel_of_a_stopping_run_asks_nothing_more(team, catalog, sent_tasks,
                                                            django_capture_on_commit_callbacks, monkeypatch):
    # A teammate's tab (or the same person's, still offering Cancel) logged a second "cancel requested".
    monkeypatch.setattr(services, "_set_cancel_flag", lambda public_id: None)
    run = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    services.run_cancel(run=run, user=team.teammate)
    again = services.run_cancel(run=run, user=team.owner)
    assert [line.message for line in run.log_lines.filter(message__startswith="cancel")] == [
        "cancel requested by alpha-teammate; stopping after the current step"]
    assert again.is_stopping and again.status == RunStatus.RUNNING


def test_resume_queues_a_new_attempt_with_more_steps(team, catalog, sent_tasks, django_capture_on_commit_callbacks,
                                                     monkeypatch):
    monkeypatch.setattr(services, "_clear_cancel_flag", lambda public_id: None)
    run = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
    with pytest.raises(ValidationError, match="only a finished run"):
        services.run_resume(run=run, user=team.teammate)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.CANCELLED, current_step=4, cancel_requested=True)
    with pytest.raises(ValidationError, match="more than the 4 steps"):
        services.run_resume(run=run, user=team.teammate, max_steps=4)
    with django_capture_on_commit_callbacks(execute=True):
        resumed = services.run_resume(run=run, user=team.teammate, max_steps=30)
    assert resumed.status == RunStatus.QUEUED and resumed.attempt == 2 and not resumed.cancel_requested
    assert resumed.resolved_spec["train"]["max_steps"] == 30 and resumed.total_steps == 30
    assert resumed.resolved_spec["output_dir"] == run.resolved_spec["output_dir"]
    assert sent_tasks.calls[-1] == ("worker.tasks.train.train_run", [run.pk, 2], "train")


def test_resuming_a_succeeded_run_asks_for_a_new_total_by_the_names_a_person_sees(team, catalog, sent_tasks,
                                                                                   django_capture_on_commit_callbacks):
    """QA: Resume pressed with the "new total" box empty said "give a larger max_steps", a name the run page
    shows nowhere, nor how many steps were done."""
    run = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED, current_step=20)
    with pytest.raises(ValidationError) as refused:
        services.run_resume(run=run, user=team.teammate)
    assert refused.value.message_dict == {"max_steps": [
        "the run has done all its 20 steps: give a new total above 20 (the box beside Train further; max_steps in the API) "
        "to train it further"]}
    # One step done was "all its 1 steps" and "the 1 steps already done".
    Run.objects.filter(pk=run.pk).update(current_step=1)
    with pytest.raises(ValidationError, match="the run has done all its 1 step: give a new total above 1 "):
        services.run_resume(run=run, user=team.teammate)
    with pytest.raises(ValidationError, match="give more than the 1 step already done"):
        services.run_resume(run=run, user=team.teammate, max_steps=1)


def test_a_resume_says_where_it_continues_from(team, catalog, sent_tasks, django_capture_on_commit_callbacks,
                                               monkeypatch):
    # A run cancelled before it started (or failed before its first checkpoint) logged "continuing from the
    # last checkpoint", and then trained from step 0.
    monkeypatch.setattr(services, "_clear_cancel_flag", lambda public_id: None)
    run = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
    services.run_cancel(run=run, user=team.teammate)
    services.run_resume(run=run, user=team.teammate)
    assert run.log_lines.order_by("pk").last().message == (
        "resume queued by alpha-teammate; no checkpoint was saved, so it starts from step 0")
    Run.objects.filter(pk=run.pk).update(status=RunStatus.FAILED, current_step=7)
    for step in (3, 6):
        with_checkpoint(run, step)
    services.run_resume(run=run, user=team.teammate, max_steps=20)
    assert run.log_lines.order_by("pk").last().message == (
        "resume queued by alpha-teammate with max_steps 20; continuing from checkpoint 6")


def test_retry_starts_over_in_a_new_directory(team, catalog, sent_tasks, django_capture_on_commit_callbacks):
    run = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
    retried = services.run_retry(run=run, user=team.owner)
    assert retried.pk != run.pk and retried.spec == run.spec
    assert retried.resolved_spec["output_dir"] != run.resolved_spec["output_dir"]
    assert retried.name == "sft-tiny (retry)"


def test_tags_are_trimmed_and_deduplicated(team, catalog, sent_tasks, django_capture_on_commit_callbacks):
    run = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
    services.run_update_details(run=run, tags=" lr-sweep, baseline ,lr-sweep,, ", notes="**bold**")
    run.refresh_from_db()
    assert run.tags == ["lr-sweep", "baseline"] and run.notes == "**bold**"
    with pytest.raises(ValidationError, match="longer than 40"):
        services.run_update_details(run=run, tags="x" * 41)


def test_it_rejects_invisible_characters_in_tags(team, catalog, sent_tasks, django_capture_on_commit_callbacks):
    """secqa: a tag could hold a zero-width space or a bidi override: "baseline\u200b" looks like "baseline" on
    the runs table, yet its filter and "Compare the runs tagged" found other runs. Tags are names people pick runs
    by, refused like run names (and put in NFC: a decomposed "café" is the "café" already there)."""
    run = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
    with pytest.raises(ValidationError) as refused:
        services.run_update_details(run=run, tags="baseline, base\u200bline")
    assert refused.value.message_dict == {"tags": [
        "tag 2: an invisible character, U+200B (ZERO WIDTH SPACE), at position 5: remove it (it makes names that "
        "look alike but differ)"]}
    with pytest.raises(ValidationError, match="U\\+202E"):
        services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner, tags=["\u202eenilesab"])
    services.run_update_details(run=run, tags="caf\u00e9, cafe\u0301")
    run.refresh_from_db()
    assert run.tags == ["caf\u00e9"]


def test_tags_differing_only_in_case_are_one_tag_of_the_first_spelling(team, catalog, sent_tasks,
                                                                       django_capture_on_commit_callbacks):
    """"Baseline" and "baseline" were two tags of a project: the table's tag menu listed both, and its filter
    found half the runs. A tag takes the spelling the project's runs already give it, and a run lists it once;
    a run that alone holds a tag may still change its case."""
    first = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
    services.run_update_details(run=first, tags="Baseline, LR-sweep")
    with django_capture_on_commit_callbacks(execute=True):
        second = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner,
                                     tags="baseline, BASELINE, new")
    assert second.tags == ["Baseline", "new"]
    services.run_update_details(run=first, tags="baseline, lr-sweep")
    first.refresh_from_db()
    assert first.tags == ["Baseline", "lr-sweep"]
    assert sorted(RunTag.objects.filter(project=team.project).values_list("tag", flat=True)) == [
        "Baseline", "Baseline", "lr-sweep", "new"]


def test_a_silent_running_run_is_requeued_once(team, catalog, sent_tasks, django_capture_on_commit_callbacks):
    run = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
    now = timezone.now()
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, worker_name="train@a", current_step=7,
                                         last_heartbeat=now - timedelta(seconds=61))
    fresh = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
    Run.objects.filter(pk=fresh.pk).update(status=RunStatus.RUNNING, last_heartbeat=now - timedelta(seconds=30))
    with django_capture_on_commit_callbacks(execute=True):
        reaped = services.runs_reap_lost(now=now)
    assert [lost.pk for lost in reaped] == [run.pk]
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.attempt == 2 and run.worker_name == ""
    assert "lost at step 7" in run.log_lines.last().message
    assert sent_tasks.calls[-1] == ("worker.tasks.train.train_run", [run.pk, 2], "train")
    assert services.runs_reap_lost(now=now) == []  # taken once, even by many reapers


def test_a_run_whose_worker_is_gone_is_requeued_within_seconds_with_the_reason(
        team, catalog, sent_tasks, django_capture_on_commit_callbacks, settings):
    # QA: a run whose worker was killed -9 said "running" for 60-75 s (TEMPER_RUN_LOST_SECONDS plus a reaper
    # round) and then "queued" with no reason on its page. Its worker's own heartbeat tells sooner.
    settings.TEMPER_HEARTBEAT_SECONDS, settings.TEMPER_RUN_HEARTBEAT_SECONDS = 10, 5
    now = timezone.now()
    started = now - timedelta(minutes=5)
    Worker.objects.create(name="train@dead", host="dead", pid=1, started_at=started - timedelta(minutes=1),
                          last_seen=now - timedelta(seconds=21))
    Worker.objects.create(name="train@busy", host="busy", pid=2, started_at=started - timedelta(minutes=1),
                          last_seen=now - timedelta(seconds=3))
    Worker.objects.create(name="train@restarted", host="restarted", pid=3, started_at=now - timedelta(seconds=4),
                          last_seen=now - timedelta(seconds=3))
    runs = {}
    for worker, silent in (("train@dead", 11), ("train@busy", 30), ("train@restarted", 11), ("train@stopped", 11)):
        run = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
        Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, worker_name=worker, current_step=7,
                                             started_at=started, last_heartbeat=now - timedelta(seconds=silent))
        runs[worker] = run
    Worker.objects.create(name="train@stopped", host="stopped", pid=4, started_at=started - timedelta(minutes=1),
                          last_seen=now - timedelta(seconds=2), stopped_at=now - timedelta(seconds=2))
    # Its worker silent for 21 s but the run itself beat 9 s ago: not yet.
    just_beat = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
    Run.objects.filter(pk=just_beat.pk).update(status=RunStatus.RUNNING, worker_name="train@dead", started_at=started,
                                               last_heartbeat=now - timedelta(seconds=9))
    with django_capture_on_commit_callbacks(execute=True):
        reaped = services.runs_reap_lost(now=now)
    # The busy worker (a long step, a compilation) beats on: its run waits for TEMPER_RUN_LOST_SECONDS.
    assert sorted(run.pk for run in reaped) == sorted(runs[name].pk for name in ("train@dead", "train@restarted",
                                                                                 "train@stopped"))
    lost = Run.objects.get(pk=runs["train@dead"].pk)
    # A notice, not its error_message: a re-queued run has not failed (a REST client reads any error as failure).
    assert lost.status == RunStatus.QUEUED and lost.attempt == 2 and lost.error_message == ""
    assert lost.notice == (f"attempt 1 was lost at step 7 on worker train@dead, last heard from at "
                           f"{when(now - timedelta(seconds=11))} (silent for 11 s, and its worker has been "
                           "silent for 21 s); re-queued to start over from step 0, as it had saved no checkpoint")
    assert "its worker was restarted" in Run.objects.get(pk=runs["train@restarted"].pk).notice
    assert "its worker stopped" in Run.objects.get(pk=runs["train@stopped"].pk).notice
    assert Run.objects.get(pk=runs["train@busy"].pk).status == RunStatus.RUNNING
    assert Run.objects.get(pk=just_beat.pk).status == RunStatus.RUNNING
    # Without worker heartbeats nothing tells but the run's own silence.
    settings.TEMPER_HEARTBEAT_SECONDS = 0
    Run.objects.filter(pk=just_beat.pk).update(last_heartbeat=now - timedelta(seconds=11))
    assert services.runs_reap_lost(now=now) == []


def test_the_next_attempt_clears_the_lost_reason(team, catalog, sent_tasks, django_capture_on_commit_callbacks):
    from webapp.runs.reporting import run_start

    run = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, worker_name="train@a",
                                         last_heartbeat=timezone.now() - timedelta(seconds=61))
    [lost] = services.runs_reap_lost()
    assert "re-queued to start over from step 0" in lost.notice
    run_start(run_pk=run.pk, attempt=2, worker_name="train@b")
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.error_message == "" and run.notice == ""


def test_a_lost_run_says_which_worker_lost_it_when_and_from_which_checkpoint_it_resumes(
        team, catalog, sent_tasks, django_capture_on_commit_callbacks):
    """Its log said "re-queued to resume from its last checkpoint": which one, and so which steps are trained
    again, the user learnt only from the next attempt's first lines."""
    run = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
    for step in ("20", "40", "60.orbax-checkpoint-tmp-1"):  # the last one cut short by the kill: not restored
        with_checkpoint(run, step)
    heard = timezone.now() - timedelta(seconds=61)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, worker_name="train@gone", current_step=47,
                                         started_at=heard - timedelta(minutes=5), last_heartbeat=heard)
    with django_capture_on_commit_callbacks(execute=True):
        [lost] = services.runs_reap_lost(now=heard + timedelta(seconds=61))
    message = (f"attempt 1 was lost at step 47 on worker train@gone, last heard from at {when(heard)} (silent for 61 s); "
               "re-queued to resume from its checkpoint at step 40")
    assert lost.notice == message and lost.error_message == ""
    assert list(run.log_lines.values_list("level", "message"))[-1] == ("warning", message)


def test_a_requeued_lost_run_tells_its_open_pages(team, catalog, sent_tasks, django_capture_on_commit_callbacks,
                                                  monkeypatch):
    # QA: a page open on the run went on saying "running" through the re-queue, missed its log line, and
    # kept drawing the steps the new attempt trained again with the lost attempt's values.
    published = []
    monkeypatch.setattr("webapp.runs.reporting.publish_event", lambda public_id, event: published.append((public_id, event)))
    run = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
    now = timezone.now()
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, last_heartbeat=now - timedelta(seconds=61))
    with django_capture_on_commit_callbacks(execute=True):
        services.runs_reap_lost(now=now)
    [(public_id, event)] = published
    assert public_id == run.public_id and event["type"] == "status" and event["status"] == "queued"
    # The reason the page shows until the next attempt starts: a notice, no failure's message.
    assert "was lost at step" in event["notice"] and event["message"] == ""


def test_a_lost_attempt_and_its_log_line_are_one_write(team, catalog, sent_tasks, django_capture_on_commit_callbacks,
                                                       monkeypatch):
    """CI: a page (and the integration test) read the run re-queued as attempt 2 while its log did not yet say why:
    the attempt was committed before the line was written. A failure between the two now leaves neither."""
    run = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, worker_name="train@a", current_step=7,
                                         started_at=timezone.now(), last_heartbeat=timezone.now())
    run.refresh_from_db()
    lines_before, writes_the_line = run.log_lines.count(), services.log_line

    def database_gone(*args, **kwargs):
        raise OperationalError("the database went away")

    monkeypatch.setattr(services, "log_line", database_gone)
    with django_capture_on_commit_callbacks(execute=True) as callbacks, pytest.raises(OperationalError):
        services.run_attempt_lost(run=run, why=KILLED)
    run.refresh_from_db()
    assert (run.status, run.attempt, run.worker_name, run.notice) == (RunStatus.RUNNING, 1, "train@a", "")
    assert run.log_lines.count() == lines_before and callbacks == []  # nothing sent, no page told
    monkeypatch.setattr(services, "log_line", writes_the_line)
    with django_capture_on_commit_callbacks(execute=True):
        assert services.run_attempt_lost(run=run, why=KILLED) is not None
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.attempt == 2 and KILLED in run.log_lines.last().message


def test_a_lost_run_whose_cancel_was_asked_is_cancelled(team, catalog, sent_tasks, django_capture_on_commit_callbacks):
    run = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
    now = timezone.now()
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, cancel_requested=True,
                                         last_heartbeat=now - timedelta(seconds=120))
    assert services.runs_reap_lost(now=now) == []
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED


KILLED = "its training process died: Worker exited prematurely: signal 9 (SIGKILL) Job: 0."


def lose(run: Run, *, step: int) -> Run | None:
    """The current attempt of ``run`` starts on train@a, reaches ``step`` and its process is killed there."""
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, worker_name="train@a", current_step=step,
                                         started_at=timezone.now(), last_heartbeat=timezone.now())
    run.refresh_from_db()
    return services.run_attempt_lost(run=run, why=KILLED)


def test_a_run_lost_again_and_again_without_a_new_checkpoint_fails_with_the_reason(
        team, catalog, sent_tasks, django_capture_on_commit_callbacks, settings, monkeypatch):
    # QA: a run killed at the same step each time (out of memory there, a batch that crashes the process) was
    # re-queued forever, holding a train worker and its devices for nothing.
    settings.TEMPER_RUN_LOST_LIMIT = 3
    monkeypatch.setattr(services, "_clear_cancel_flag", lambda public_id: None)
    published = []
    monkeypatch.setattr("webapp.runs.reporting.publish_event", lambda public_id, event: published.append(event))
    run = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
    with_checkpoint(run, "20")
    with django_capture_on_commit_callbacks(execute=True):
        assert lose(run, step=25) is not None  # saved checkpoint 20, then killed
        assert lose(run, step=25) is not None  # resumed from 20, killed again before the next checkpoint
        assert lose(run, step=25) is None  # a third time: not re-queued again
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.attempt == 3 and run.finished_at is not None
    assert run.error_message == (
        "lost 3 times in a row at step 25, no attempt saving a checkpoint after step 20: the last time, attempt 3 "
        f"on worker train@a ({KILLED}); it is not re-queued again: fix the cause (the same step each time is often "
        "out of memory there, or a batch that crashes the process) and Resume")
    assert run.log_lines.order_by("pk").last().message == run.error_message
    # The last loss's notice is over: the run failed, and says why once.
    assert run.notice == ""
    assert published[-1] == {"type": "status", "status": "failed", "message": run.error_message, "notice": ""}
    assert [call[1] for call in sent_tasks.calls] == [[run.pk, 1], [run.pk, 2], [run.pk, 3]]
    # A person's Resume counts afresh.
    with django_capture_on_commit_callbacks(execute=True):
        services.run_resume(run=run, user=team.teammate)
    assert lose(run, step=25) is not None
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.attempt == 5


def test_a_lost_run_that_saved_a_new_checkpoint_since_counts_afresh(
        team, catalog, sent_tasks, django_capture_on_commit_callbacks, settings):
    settings.TEMPER_RUN_LOST_LIMIT = 2
    run = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
    assert lose(run, step=5) is not None  # killed before its first checkpoint
    for step in (20, 40):  # each next attempt gets further, and saves a checkpoint before it is killed
        with_checkpoint(run, step)
        assert lose(run, step=step + 5) is not None
    assert lose(run, step=45) is None
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.error_message.startswith(
        "lost 2 times in a row at step 45, no attempt saving a checkpoint after step 40: ")
    # Killed before any checkpoint, each time; and with no limit, re-queued for ever.
    never_saved = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
    lose(never_saved, step=3)
    assert lose(never_saved, step=3) is None
    assert Run.objects.get(pk=never_saved.pk).error_message.startswith(
        "lost 2 times in a row at step 3, before saving any checkpoint: the last time, attempt 2 ")
    settings.TEMPER_RUN_LOST_LIMIT = 0
    unlimited = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
    assert all(lose(unlimited, step=3) is not None for _ in range(5))


def test_a_finished_runs_checkpoint_can_be_exported_and_started_from(team, catalog, sent_tasks,
                                                                      django_capture_on_commit_callbacks, tmp_path):
    run = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
    with pytest.raises(ValidationError, match="export checkpoints of finished runs"):
        services.checkpoint_export_request(run=run, step=5, user=None)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    run.refresh_from_db()
    for step in (5, 10):
        with_checkpoint(run, step)
    assert services.checkpoint_steps(run) == [5, 10]
    with pytest.raises(ValidationError, match="has no checkpoint 7; it has 5, 10"):
        services.checkpoint_export_request(run=run, step=7, user=None)
    with django_capture_on_commit_callbacks(execute=True):
        services.checkpoint_export_request(run=run, step=5, user=team.teammate)
    assert sent_tasks.calls[-1] == ("worker.tasks.train.export_checkpoint", [run.pk, 5], "train")

    spec = {**sft_spec(catalog), "model": f"{run.public_id}@5"}
    with pytest.raises(ValidationError, match=f"checkpoint 5 of {run.public_id} is not exported"):
        services.run_create(project=team.project, spec=spec, user=team.teammate)
    Artifact.objects.create(run=run, kind=ArtifactKind.CHECKPOINT, step=5, path=str(tmp_path))
    chained = services.run_create(project=team.project, spec=spec, user=team.teammate)
    assert chained.resolved_spec["model"] == str(tmp_path) and chained.source_run == run
    assert chained.spec["model"] == f"{run.public_id}@5"
    # As the chat and /v1/models name it too, written down in the spec's own spelling.
    named_as_in_the_chat = services.run_create(project=team.project, spec={**spec, "model": f"{run.public_id}:step-5"},
                                               user=team.teammate)
    assert named_as_in_the_chat.spec["model"] == f"{run.public_id}@5" and named_as_in_the_chat.source_run == run
    with pytest.raises(ValidationError, match="already exported"):
        services.checkpoint_export_request(run=run, step=5, user=None)


def exporting_steps_5_and_10(team, catalog, sent_tasks, capture, monkeypatch):
    """A succeeded run whose checkpoints 5 and 10 were both asked to export, and the events its page hears."""
    published = []
    monkeypatch.setattr("webapp.runs.reporting.publish_event", lambda public_id, event: published.append(event))
    run = create(team, catalog, sent_tasks, capture)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    run.refresh_from_db()
    for step in (5, 10):
        with_checkpoint(run, step)
    with capture(execute=True):
        services.checkpoint_export_request(run=run, step=5, user=team.teammate)
        services.checkpoint_export_request(run=run, step=10, user=team.teammate)
    return run, published


def test_a_checkpoint_export_is_exporting_until_the_worker_reports_and_a_failed_one_can_be_asked_again(
        team, catalog, sent_tasks, django_capture_on_commit_callbacks, monkeypatch):
    """The run page showed the export as still to do (and offered it again) until it was reloaded after the
    worker finished: each export now has a state the page shows, and its end is announced to open pages."""
    run, published = exporting_steps_5_and_10(team, catalog, sent_tasks, django_capture_on_commit_callbacks,
                                              monkeypatch)
    assert selectors.checkpoint_states(run=run) == {"5": "exporting", "10": "exporting"}
    with pytest.raises(ValidationError, match="checkpoint 5 of .* is being exported"):
        services.checkpoint_export_request(run=run, step=5, user=team.teammate)

    with django_capture_on_commit_callbacks(execute=True):
        services.checkpoint_export_finish(run=run, step=5, error=OSError("disk full"))
    assert published == [{"type": "checkpoint", "step": 5, "status": "failed", "exporting": [10]}]
    assert CheckpointExport.objects.get(run=run, step=5).error_message == "OSError: disk full"
    assert selectors.checkpoint_states(run=run) == {"5": "failed", "10": "exporting"}

    export_dir = run.output_dir / "export-step-10"
    export_dir.mkdir()
    (export_dir / "config.json").write_text("{}")
    with django_capture_on_commit_callbacks(execute=True):
        services.checkpoint_export_finish(run=run, step=10, export_dir=export_dir)
    assert published[-1] == {"type": "checkpoint", "step": 10, "status": "exported", "exporting": []}
    assert run.artifacts.get(kind=ArtifactKind.CHECKPOINT, step=10).size_bytes == 2

    with django_capture_on_commit_callbacks(execute=True):
        services.checkpoint_export_request(run=run, step=5, user=team.teammate)  # the failed one, again
    assert sent_tasks.calls[-1] == ("worker.tasks.train.export_checkpoint", [run.pk, 5], "train")
    assert selectors.checkpoint_states(run=run) == {"5": "exporting", "10": "exported"}
    assert CheckpointExport.objects.get(run=run, step=5).error_message == ""


def test_a_checkpoint_export_whose_worker_was_lost_fails_with_the_reason_and_can_be_asked_again(
        team, catalog, sent_tasks, django_capture_on_commit_callbacks, monkeypatch, client_for):
    """An export whose worker died stayed 'exporting' for good, and its checkpoint could never be exported
    again. Once Redis holds its message nowhere (Celery acknowledges the message of a worker process that
    died; a Redis restart drops it), the reaper fails it with the reason, and it can be asked for again."""
    run, published = exporting_steps_5_and_10(team, catalog, sent_tasks, django_capture_on_commit_callbacks,
                                              monkeypatch)
    asked_at = CheckpointExport.objects.get(run=run, step=5).updated_at

    def redis_holding(**messages):
        monkeypatch.setattr(services.channels, "redis_client",
                            lambda: FakeRedis(task=services.EXPORT_CHECKPOINT_TASK, **messages))

    # Waiting behind a training run, or being exported (acks_late): not lost, however long.
    for held in ({"waiting": [(run.pk, 5), (run.pk, 10)]}, {"priority": [(run.pk, 5), (run.pk, 10)]},
                 {"unacked": [(run.pk, 5), (run.pk, 10)]}):
        redis_holding(**held)
        assert services.checkpoint_exports_fail_lost(now=asked_at + timedelta(hours=3)) == []
    # Gone, but within TEMPER_RUN_LOST_SECONDS of the request (a message on its way): not yet.
    redis_holding(waiting=[(run.pk, 10), (run.pk + 1, 5)])
    assert services.checkpoint_exports_fail_lost(now=asked_at + timedelta(seconds=30)) == []
    assert selectors.checkpoint_states(run=run) == {"5": "exporting", "10": "exporting"}

    with django_capture_on_commit_callbacks(execute=True):
        failed = services.checkpoint_exports_fail_lost(now=asked_at + timedelta(seconds=120))
    assert [(export.run_id, export.step) for export in failed] == [(run.pk, 5)]
    reason = ("the export was lost: its worker stopped before it ended (killed, out of memory) or Redis lost its "
              "message, which Redis held nowhere 120 s after it was asked for; export again")
    assert CheckpointExport.objects.get(run=run, step=5).error_message == reason
    assert run.log_lines.filter(level="error", message=f"export of checkpoint 5 failed: {reason}").exists()
    assert published == [{"type": "checkpoint", "step": 5, "status": "failed", "exporting": [10]}]
    assert selectors.checkpoint_states(run=run) == {"5": "failed", "10": "exporting"}
    page = client_for(team.teammate).get(f"/p/alpha/runs/{run.public_id}/checkpoints/").content.decode()
    assert "export failed" in page and reason in page and "Export again" in page
    assert services.checkpoint_exports_fail_lost(now=asked_at + timedelta(seconds=240)) == []  # failed once

    with django_capture_on_commit_callbacks(execute=True):
        services.checkpoint_export_request(run=run, step=5, user=team.teammate)
    assert sent_tasks.calls[-1] == ("worker.tasks.train.export_checkpoint", [run.pk, 5], "train")
    assert selectors.checkpoint_states(run=run) == {"5": "exporting", "10": "exporting"}


def test_a_checkpoint_export_delivered_again_after_it_ended_is_dropped(
        team, catalog, sent_tasks, django_capture_on_commit_callbacks, monkeypatch):
    """A second delivery of an export's message (Celery's visibility timeout, or queued again after its worker
    was lost) exported the step again, rewriting a directory runs may be starting from, or, with its
    checkpoint pruned since, turned the exported step into a failed one."""
    from worker.tasks.train import export_checkpoint

    run, _published = exporting_steps_5_and_10(team, catalog, sent_tasks, django_capture_on_commit_callbacks,
                                               monkeypatch)
    export_dir = run.output_dir / "export-step-5"
    export_dir.mkdir()
    (export_dir / "config.json").write_text("{}")
    with django_capture_on_commit_callbacks(execute=True):
        services.checkpoint_export_finish(run=run, step=5, export_dir=export_dir)
    assert services.checkpoint_export_pending(run_pk=run.pk, step=5) is None
    assert services.checkpoint_export_pending(run_pk=run.pk, step=10) == run  # still asked for
    assert services.checkpoint_export_pending(run_pk=run.pk, step=7) is None  # never asked for
    shutil.rmtree(run.output_dir / "checkpoints" / "5")  # pruned since: an export now would fail
    lines = run.log_lines.count()
    export_checkpoint(run.pk, 5)
    assert CheckpointExport.objects.get(run=run, step=5).status == "exported"
    assert run.log_lines.count() == lines and (export_dir / "config.json").read_text() == "{}"


def test_checkpoint_exports_are_not_judged_lost_while_redis_cannot_be_asked(
        team, catalog, sent_tasks, django_capture_on_commit_callbacks, monkeypatch):
    import redis

    run = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    with_checkpoint(run, "5")
    run.refresh_from_db()
    services.checkpoint_export_request(run=run, step=5, user=team.teammate)

    def unavailable():
        raise redis.ConnectionError("refused")
    monkeypatch.setattr(services.channels, "redis_client", unavailable)
    assert services.checkpoint_exports_fail_lost(now=timezone.now() + timedelta(hours=1)) == []
    assert selectors.checkpoint_states(run=run) == {"5": "exporting"}


def test_train_messages_are_read_from_every_place_redis_keeps_them():
    fake = FakeRedis(waiting=[(1, 1), (2, 3)], priority=[(4, 1)], unacked=[(5, 2)])
    assert services.train_messages_in_redis(fake) == {(1, 1), (2, 3), (4, 1), (5, 2)}


def test_a_queued_run_whose_message_redis_lost_is_sent_again(team, catalog, sent_tasks,
                                                             django_capture_on_commit_callbacks, monkeypatch):
    waiting = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
    lost = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
    young = create(team, catalog, sent_tasks, django_capture_on_commit_callbacks)
    old = timezone.now() - timedelta(seconds=120)
    Run.objects.filter(pk__in=[waiting.pk, lost.pk]).update(queued_at=old)
    monkeypatch.setattr(services.channels, "redis_client", lambda: FakeRedis(waiting=[(waiting.pk, 1)]))
    sent_tasks.calls.clear()
    resent = services.runs_requeue_lost_messages()
    assert [run.pk for run in resent] == [lost.pk] and young.pk not in [run.pk for run in resent]
    assert sent_tasks.calls == [("worker.tasks.train.train_run", [lost.pk, 1], "train")]
    assert services.runs_requeue_lost_messages() == []  # its queued_at was renewed


def test_column_mappings_of_the_dataset_versions_become_data_columns(team, catalog, sent_tasks):
    mapped = make_ready_version(team.project, name="qa", rows=[{"question": "q", "reply": "a"}])
    mapped.column_mapping = {"prompt": "question", "completion": "reply"}
    mapped.save()
    spec = {**sft_spec(catalog), "data": {"train": mapped.public_id}}
    run = services.run_create(project=team.project, spec=spec, user=team.teammate)
    assert run.resolved_spec["data"]["columns"] == {"prompt": "question", "completion": "reply"}
    assert "columns" not in run.spec["data"]  # derived, so a duplicate re-derives it
    services.run_create(project=team.project, spec=run.spec, user=team.teammate)
    other = make_ready_version(team.project, name="qa2", rows=[{"q": "q", "a": "a"}])
    other.column_mapping = {"prompt": "q", "completion": "a"}
    other.save()
    with pytest.raises(ValidationError) as caught:
        services.run_create(project=team.project, spec={**spec, "data": {"train": mapped.public_id, "eval": other.public_id}},
                            user=team.teammate)
    assert "one run reads both with one mapping" in caught.value.message_dict["data.eval"][0]
    # An unmapped evaluation version under a mapped training set: the engine would read it with the
    # training mapping, find no 'question' column and fail the run at its start.
    with pytest.raises(ValidationError) as caught:
        services.run_create(project=team.project, spec={**spec, "data": {"train": mapped.public_id,
                                                                          "eval": catalog.sft.public_id}},
                            user=team.teammate)
    assert caught.value.message_dict["data.eval"] == [
        f"{catalog.sft} maps its columns as given, the training data as {{'prompt': 'question', 'completion': "
        "'reply'}; one run reads both with one mapping"]
    with pytest.raises(ValidationError) as caught:
        services.run_create(project=team.project, spec={**spec, "data": {"train": mapped.public_id,
                                                                          "columns": {"prompt": "x"}}}, user=None)
    assert "remove it" in caught.value.message_dict["data.columns"][0]


def ppo_spec(catalog, reward_model) -> dict:
    return {"task": "ppo", "model": catalog.base_model.public_id, "data": {"train": catalog.prompts.public_id},
            "train": {"max_steps": 10, "batch_size": 2}, "ppo": {"reward_model": reward_model}}


def test_a_ppo_run_scores_with_a_succeeded_reward_run_of_its_own_project(team, catalog, sent_tasks, tmp_path):
    reward_spec = {"task": "reward", "model": catalog.base_model.public_id,
                   "data": {"train": catalog.preference.public_id}, "train": {"max_steps": 10, "batch_size": 2}}
    reward_run = services.run_create(project=team.project, spec=reward_spec, user=team.teammate)
    sft_run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.teammate)
    foreign = Run.objects.create(public_id="run_foreign", project=team.outsider_project, task="reward", spec={},
                                 resolved_spec={}, status=RunStatus.SUCCEEDED)
    Artifact.objects.create(run=foreign, kind=ArtifactKind.MODEL, path="/their/reward/model")

    def problem(reward_model) -> str:
        with pytest.raises(ValidationError) as caught:
            services.run_create(project=team.project, spec=ppo_spec(catalog, reward_model), user=team.teammate)
        return caught.value.message_dict["ppo.reward_model"][0]

    assert problem(reward_run.public_id) == f"run {reward_run.public_id} has no exported reward model (it is queued)"
    assert problem("run_foreign") == "'run_foreign' is not a run of alpha"
    assert problem("/etc/somewhere") == "choose a succeeded reward run of this project (run_…)"
    for run in (reward_run, sft_run):
        Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
        Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, path=str(tmp_path / run.public_id))
    assert problem(sft_run.public_id) == f"run {sft_run.public_id} is an sft run; choose a task: reward run"
    ppo_run = services.run_create(project=team.project, spec=ppo_spec(catalog, reward_run.public_id),
                                  user=team.teammate)
    assert ppo_run.task == "ppo" and ppo_run.resolved_spec["ppo"]["reward_model"] == str(tmp_path / reward_run.public_id)
    assert ppo_run.spec["ppo"]["reward_model"] == reward_run.public_id  # the written spec keeps the id
    assert ppo_run.resolved_spec["data"]["train"] == str(catalog.prompts.absolute_path)


def test_a_reward_model_reward_function_names_a_reward_run_not_a_server_path(team, catalog, sent_tasks, tmp_path):
    reward_spec = {"task": "reward", "model": catalog.base_model.public_id,
                   "data": {"train": catalog.preference.public_id}, "train": {"max_steps": 10, "batch_size": 2}}
    reward_run = services.run_create(project=team.project, spec=reward_spec, user=team.teammate)
    Run.objects.filter(pk=reward_run.pk).update(status=RunStatus.SUCCEEDED)
    Artifact.objects.create(run=reward_run, kind=ArtifactKind.MODEL, path=str(tmp_path / "reward-export"))

    exact = {"name": "exact_match", "args": {"answer_column": "answer"}}

    def grpo_spec(model, *, as_eval_metric=False) -> dict:
        scored = {"name": "reward_model", "weight": 0.5, "args": {"model": model}}
        lists = {"rewards": [exact], "eval_metrics": [scored]} if as_eval_metric else {"rewards": [exact, scored]}
        data = {"train": catalog.prompts.public_id, **({"eval": catalog.prompts.public_id} if as_eval_metric else {})}
        return {"task": "grpo", "model": catalog.base_model.public_id, "data": data,
                "train": {"max_steps": 10, "batch_size": 2}, "grpo": {"num_generations": 2, **lists}}

    for spec, key, message in (
            (grpo_spec("/etc/somewhere"), "grpo.rewards.1.args.model",
             "choose a succeeded reward run of this project (run_…)"),
            (grpo_spec("run_foreign", as_eval_metric=True), "grpo.eval_metrics.0.args.model",
             "'run_foreign' is not a run of alpha")):
        with pytest.raises(ValidationError) as caught:
            services.run_create(project=team.project, spec=spec, user=team.teammate)
        assert caught.value.message_dict[key] == [message]
    evaluated = services.run_create(project=team.project, spec=grpo_spec(reward_run.public_id, as_eval_metric=True),
                                    user=team.teammate)
    assert evaluated.resolved_spec["grpo"]["eval_metrics"][0]["args"]["model"] == str(tmp_path / "reward-export")
    run = services.run_create(project=team.project, spec=grpo_spec(reward_run.public_id), user=team.teammate)
    assert run.resolved_spec["grpo"]["rewards"][1]["args"]["model"] == str(tmp_path / "reward-export")
    assert run.spec["grpo"]["rewards"][1]["args"]["model"] == reward_run.public_id  # the written spec keeps the id
    assert services.run_create(project=team.project, spec=run.spec, user=team.teammate).spec == run.spec


def test_a_template_that_stamps_the_day_gets_the_launch_date_fixed_in_the_runs_spec(team, catalog, sent_tasks,
                                                                                      tmp_path):
    """QA: Llama 3.2's template writes the day it renders into each system turn when date_string is unset, so a
    run's prompts changed from day to day and a resumed attempt's differed from the first's. The launch records its
    date in data.chat_template_kwargs (the run's config), which every attempt, evaluation and export render with."""
    import json
    from datetime import datetime

    from tests.factories import build_bpe_tokenizer_dir
    from tests.webapp.factories import make_base_model

    templates = Path(__file__).parents[2] / "jaxengine" / "tokenizer" / "real_templates"

    def model(name, template_file, **own_variables):
        directory = build_bpe_tokenizer_dir(tmp_path / name, style="llama3", chat_template=(
            templates / template_file).read_text(encoding="utf-8"))
        if own_variables:
            (directory / "chat_template_kwargs.json").write_text(json.dumps(own_variables))
        return make_base_model(team.project, name=name, path=str(directory)).public_id

    llama = model("llama3-2", "llama3_2.jinja")
    today = datetime.now().strftime("%d %b %Y")
    run = services.run_create(project=team.project, spec=sft_spec(catalog, model=llama), user=team.teammate)
    launched = run.spec["data"]["chat_template_kwargs"]
    assert launched.keys() == {"date_string"} and launched["date_string"] in {today, datetime.now().strftime("%d %b %Y")}
    assert run.resolved_spec["data"]["chat_template_kwargs"] == launched  # what the engine renders with
    assert f"date_string: {launched['date_string']}" in services.spec_to_yaml(run.spec)  # the run page's config
    # Launched again from its spec as written (a retry; an API client's copy), the run keeps that date, whatever day
    # it is (Duplicate leaves it out: test_a_copy_of_a_run_fixes_its_own_launchs_date_...).
    assert services.run_create(project=team.project, spec=run.spec, user=team.teammate).spec == run.spec
    # A date the spec or the model's own variables give is left as it is; a template that stamps no day gets none.
    given = sft_spec(catalog, model=llama)
    given["data"]["chat_template_kwargs"] = {"date_string": "01 Jan 2030"}
    assert services.run_create(project=team.project, spec=given, user=team.teammate).spec["data"][
        "chat_template_kwargs"] == {"date_string": "01 Jan 2030"}
    for other in (model("own-date", "llama3_2.jinja", date_string="02 Feb 2031"), model("llama3-3", "llama3_3.jinja"),
                  model("qwen3", "qwen3.jinja")):
        spec = services.run_create(project=team.project, spec=sft_spec(catalog, model=other), user=team.teammate).spec
        assert spec["data"]["chat_template_kwargs"] == {}, other


def _llama_3_2(team, tmp_path, name="llama3-2", **own_variables) -> str:
    """A base model of Llama 3.2's chat template, which writes the day it renders when date_string is unset."""
    import json

    from tests.factories import build_bpe_tokenizer_dir
    from tests.webapp.factories import make_base_model

    templates = Path(__file__).parents[2] / "jaxengine" / "tokenizer" / "real_templates"
    directory = build_bpe_tokenizer_dir(tmp_path / name, style="llama3", chat_template=(
        templates / "llama3_2.jinja").read_text(encoding="utf-8"))
    if own_variables:
        (directory / "chat_template_kwargs.json").write_text(json.dumps(own_variables))
    return make_base_model(team.project, name=name, path=str(directory)).public_id


def launched_back_then(run: Run, date: str) -> Run:
    """``run`` as if launched on ``date``: the date its launch fixed is that day's."""
    for spec in (run.spec, run.resolved_spec):
        spec["data"]["chat_template_kwargs"]["date_string"] = date
    Run.objects.filter(pk=run.pk).update(spec=run.spec, resolved_spec=run.resolved_spec, stamped_template_date=date)
    return Run.objects.get(pk=run.pk)


def test_a_copy_of_a_run_fixes_its_own_launchs_date_a_retry_and_a_resume_keep_the_runs(team, catalog, sent_tasks,
                                                                                      tmp_path):
    """Follow-up: a copy of a run (Duplicate) carried the date the run's launch had fixed, so a run launched today
    rendered that old day. The date Temper fixed is recorded (Run.stamped_template_date): a copy leaves it out for its
    own launch to fix today's; a retry or a resume is the same run and keeps it; a date the user wrote stays."""
    from datetime import datetime

    llama = _llama_3_2(team, tmp_path)
    run = services.run_create(project=team.project, spec=sft_spec(catalog, model=llama), user=team.teammate)
    assert run.stamped_template_date == run.spec["data"]["chat_template_kwargs"]["date_string"]
    run = launched_back_then(run, "01 Jan 2020")

    spec, left_out = services.spec_of_a_copy(run)
    assert left_out == "01 Jan 2020" and spec["data"]["chat_template_kwargs"] == {}
    assert run.spec["data"]["chat_template_kwargs"] == {"date_string": "01 Jan 2020"}  # the run's own is untouched
    before = datetime.now().strftime("%d %b %Y")
    copied = services.run_create(project=team.project, spec=spec, user=team.teammate)
    today = copied.spec["data"]["chat_template_kwargs"]["date_string"]
    assert today in {before, datetime.now().strftime("%d %b %Y")}
    assert copied.resolved_spec["data"]["chat_template_kwargs"] == {"date_string": today}
    assert copied.stamped_template_date == today

    retry = services.run_retry(run=run, user=team.teammate)
    assert retry.spec["data"]["chat_template_kwargs"] == {"date_string": "01 Jan 2020"}
    assert Run.objects.get(pk=retry.pk).stamped_template_date == "01 Jan 2020"
    assert services.spec_of_a_copy(retry)[1] == "01 Jan 2020"  # a copy of the retry fixes its own day too
    Run.objects.filter(pk=run.pk).update(status=RunStatus.CANCELLED)
    resumed = services.run_resume(run=run, user=team.teammate)
    assert resumed.resolved_spec["data"]["chat_template_kwargs"] == {"date_string": "01 Jan 2020"}

    written = sft_spec(catalog, model=llama)
    written["data"]["chat_template_kwargs"] = {"date_string": "01 Jan 2020", "custom": 1}
    own = services.run_create(project=team.project, spec=written, user=team.teammate)
    assert own.stamped_template_date == ""
    assert services.spec_of_a_copy(own) == (own.spec, None)
    # A model whose own variables give the date: nothing fixed, nothing left out.
    dated = services.run_create(project=team.project, user=team.teammate, spec=sft_spec(
        catalog, model=_llama_3_2(team, tmp_path, name="own-date", date_string="02 Feb 2031")))
    assert dated.stamped_template_date == "" and services.spec_of_a_copy(dated) == (dated.spec, None)


def test_a_launch_reads_the_models_tokenizer_settings_once(team, catalog, sent_tasks, tmp_path, monkeypatch):
    """Review: the date fix, the chat-shape check, the turn-split warning and the template-variable warning each read
    the model's tokenizer files again; a launch (its plan and its warnings) reads them once."""
    from jaxengine import tokenizer
    from tests.factories import build_bpe_tokenizer_dir
    from tests.webapp.factories import make_base_model

    templates = Path(__file__).parents[2] / "jaxengine" / "tokenizer" / "real_templates"
    directory = build_bpe_tokenizer_dir(tmp_path / "qwen3", style="llama3", chat_template=(
        templates / "qwen3.jinja").read_text(encoding="utf-8"))
    model = make_base_model(team.project, name="qwen3", path=str(directory))
    reads = []
    real = tokenizer.read_tokenizer_settings
    monkeypatch.setattr(tokenizer, "read_tokenizer_settings",
                        lambda path, **keywords: reads.append(path) or real(path, **keywords))
    spec = sft_spec(catalog, model=model.public_id)
    spec["data"]["chat_template_kwargs"] = {"enable_thinking": False}
    run = services.run_create(project=team.project, spec=spec, user=team.teammate)
    assert reads == [str(directory)]
    assert run.spec["data"]["chat_template_kwargs"] == {"enable_thinking": False}


def test_a_resumed_archived_run_comes_back_to_the_table(team, catalog, sent_tasks):
    """QA: an archived run, resumed, trained hidden under 'archived'."""
    run = services.run_create(project=team.project, spec=sft_spec(catalog), user=team.owner)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.CANCELLED, archived=True)
    assert not services.run_resume(run=run, user=team.owner).archived
    assert not Run.objects.get(pk=run.pk).archived


def test_inherited_variables_the_template_never_reads_are_warned_of_once_not_at_each_descendants_launch(
        team, catalog, sent_tasks, tmp_path):
    """Session 32: a variable the model's template never reads, written at one launch, was inherited by every run
    started from that run's model (and from theirs), and each of those launches warned of it again. The launch that
    wrote it warns; a descendant leaves it out of the variables it renders with and carries on (it renders nothing)
    and says so once, in its log, not as a warning; what the template reads is still inherited."""
    from tests.webapp.factories import make_base_model
    from webapp.runs.models import LogLevel

    def warnings(run: Run) -> list[str]:
        return list(run.log_lines.filter(level=LogLevel.WARNING).values_list("message", flat=True))

    def succeeded_with_export(run: Run) -> Run:
        Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
        Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, step=10,
                                path=str(thinking_model_dir(tmp_path / run.public_id)))
        run.refresh_from_db()
        return run

    base = thinking_model_dir(tmp_path / "base")
    model = make_base_model(team.project, name="thinker", path=str(base))
    spec = sft_spec(catalog, model=model.public_id)
    spec["data"]["chat_template_kwargs"] = {"enable_thinking": False, "persona": "terse"}
    first = services.run_create(project=team.project, spec=spec, user=team.teammate)
    assert [warning for warning in warnings(first) if "persona" in warning]  # its author wrote it: warned

    parent = succeeded_with_export(first)
    child = services.run_create(project=team.project, spec=sft_spec(catalog, model=parent.public_id),
                                user=team.teammate)
    assert warnings(child) == []
    assert child.resolved_spec["data"]["chat_template_kwargs"] == {"enable_thinking": False}
    assert list(child.log_lines.filter(message__contains="persona").values_list("message", flat=True)) == [
        f"data.chat_template_kwargs: persona of {parent.public_id}'s variables not carried on: the model's chat "
        "template never reads it"]
    check = services.launch_check(project=team.project, spec=sft_spec(catalog, model=parent.public_id), axes=[])
    assert not [warning for warning in check.warnings if "persona" in warning]

    grandchild = services.run_create(project=team.project, spec=sft_spec(catalog, model=succeeded_with_export(
        child).public_id), user=team.teammate)
    assert warnings(grandchild) == []
    assert not grandchild.log_lines.filter(message__contains="persona").exists()
    assert grandchild.resolved_spec["data"]["chat_template_kwargs"] == {"enable_thinking": False}
    # A descendant's author who writes it again is warned, as the first author was.
    own = sft_spec(catalog, model=parent.public_id)
    own["data"]["chat_template_kwargs"] = {"persona": "verbose"}
    rewritten = services.run_create(project=team.project, spec=own, user=team.teammate)
    assert [warning for warning in warnings(rewritten) if "persona" in warning]
    assert rewritten.resolved_spec["data"]["chat_template_kwargs"] == {"enable_thinking": False, "persona": "verbose"}


def test_a_base_models_own_variable_its_template_never_reads_is_named_once_at_the_launch(team, catalog, sent_tasks,
                                                                                        tmp_path):
    """The engine leaves a model directory's own variables (its chat_template_kwargs.json) that its template never
    reads out of the run's renders and exports; a run launched here is told so in its log when it is queued, by the
    launch (the engine, told the run came from a launch, says nothing more: a name the source run's Run row also
    held was told twice). The spec's own variables are its author's, warned of at the launch, not named here."""
    from tests.webapp.factories import make_base_model

    directory = thinking_model_dir(tmp_path / "persona", own_variables={"enable_thinking": False, "persona": "pirate",
                                                                          "tone": "dry"})
    model = make_base_model(team.project, name="persona", path=str(directory))
    run = services.run_create(project=team.project, spec=sft_spec(catalog, model=model.public_id), user=team.teammate)
    assert list(run.log_lines.filter(message__contains="persona").values_list("message", flat=True)) == [
        f"data.chat_template_kwargs: persona, tone of {model.public_id}'s variables not carried on: the model's chat "
        "template never reads them"]
    spec = sft_spec(catalog, model=model.public_id)
    spec["data"]["chat_template_kwargs"] = {"persona": "own", "tone": "own"}
    written = services.run_create(project=team.project, spec=spec, user=team.teammate)
    assert not written.log_lines.filter(message__contains="not carried on").exists()


def test_template_variables_the_models_chat_template_never_reads_are_warned_of_at_launch(team, catalog, sent_tasks,
                                                                                           tmp_path):
    """data.chat_template_kwargs reach the run as written; a name the model's template never reads (a typo of
    Qwen3's enable_thinking) is a warning naming the ones it reads, and a list is refused naming the key."""
    import json

    from tests.webapp.factories import make_base_model
    from webapp.runs.models import LogLevel

    model_dir = tmp_path / "thinking-model"
    model_dir.mkdir()
    (model_dir / "tokenizer_config.json").write_text(json.dumps({"chat_template": (
        "{% for m in messages %}{{ m.content }}{% endfor %}{% if enable_thinking is defined and enable_thinking "
        "is false %}<think></think>{% endif %}")}))
    model = make_base_model(team.project, name="thinker", path=str(model_dir))
    spec = sft_spec(catalog, model=model.public_id)
    spec["data"]["chat_template_kwargs"] = {"enable_thinkng": False}
    run = services.run_create(project=team.project, spec=spec, user=team.teammate)
    assert run.resolved_spec["data"]["chat_template_kwargs"] == {"enable_thinkng": False}
    assert list(run.log_lines.filter(level=LogLevel.WARNING).values_list("message", flat=True)) == [
        "data.chat_template_kwargs: the model's chat template never reads enable_thinkng, so it does nothing; the "
        "variables it reads are enable_thinking"]
    spec["data"]["chat_template_kwargs"] = {"enable_thinking": False}
    read = services.run_create(project=team.project, spec=spec, user=team.teammate)
    assert not read.log_lines.filter(level=LogLevel.WARNING).exists()
    spec["data"]["chat_template_kwargs"] = {"enable_thinking": [False]}
    with pytest.raises(ValidationError) as caught:
        services.run_create(project=team.project, spec=spec, user=team.teammate)
    assert caught.value.message_dict["data.chat_template_kwargs.enable_thinking"] == [
        "[False] is a list; give a JSON scalar: a string, a number, true/false or null"]
