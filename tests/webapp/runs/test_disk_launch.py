"""The launch warns when a run's checkpoints and export (``jaxengine.memory.estimate_disk``, worked out by hand in
tests/jaxengine/test_memory.py: 520,000 bytes for this spec on this model) need more than the disk's free space, live
in the launch form's check and in the launched run's log; a warning, not a refusal."""
from webapp.runs.models import LogLevel, Run

TINY_CONFIG = {"hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
               "intermediate_size": 32, "vocab_size": 64}
DISK_WARNING = ("disk: the run writes ≈ 508 KiB: 4 checkpoints of 117 KiB and the exported model 39.1 KiB at its "
                "fullest, more than the 488 KiB free on the server's disk now: it would fail mid-checkpoint once the "
                "disk fills. Free space (the project's Storage page shows what its runs take), lower train.keep_last, "
                "or use peft.method lora or qlora (its checkpoints hold the adapters only)")


def launch_form(catalog) -> dict:
    return {"mode": "form", "task": "sft", "model": catalog.base_model.public_id, "data.train": catalog.sft.public_id,
            "train.max_steps": "3", "train.batch_size": "2", "data.max_seq_len": "8", "peft.method": "none",
            "peft.targets": ["q_proj"]}


def test_a_run_needing_more_disk_than_is_free_is_warned_of_and_still_launches(team, catalog, client_for, sent_tasks,
                                                                             fake_disk):
    type(catalog.base_model).objects.filter(pk=catalog.base_model.pk).update(parameter_count=10_000, config=TINY_CONFIG)
    client = client_for(team.teammate)
    fake_disk.free = 500_000
    check = client.post("/p/alpha/runs/new/check/", launch_form(catalog)).json()
    assert check["errors"] == {}
    assert [warning for warning in check["warnings"] if warning.startswith("disk: ")] == [DISK_WARNING]
    response = client.post("/p/alpha/runs/new/", launch_form(catalog))
    assert response.status_code == 302
    run = Run.objects.get(public_id=response["Location"].split("/")[-2])
    assert run.log_lines.filter(level=LogLevel.WARNING, message=DISK_WARNING).exists()


def test_a_run_that_fits_the_free_disk_is_not_warned_of(team, catalog, client_for, fake_disk):
    type(catalog.base_model).objects.filter(pk=catalog.base_model.pk).update(parameter_count=10_000, config=TINY_CONFIG)
    fake_disk.free = 520_000
    check = client_for(team.teammate).post("/p/alpha/runs/new/check/", launch_form(catalog)).json()
    assert check["errors"] == {}
    assert not any(warning.startswith("disk: ") for warning in check["warnings"])
