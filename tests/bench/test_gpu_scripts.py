"""The H200 benchmark scripts run end to end on CPU with tiny presets, so that a session lent the device
(15 minutes, start-up included) spends none of it on a script that no longer runs: each prints the
figures its issue asks for, parsed here."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SUITE_ONLY_FLAGS

REPO = Path(__file__).resolve().parents[2]
NUMBER = r"([0-9][0-9,]*\.?[0-9]*)"


def run_bench(script: str, *args: str) -> str:
    # One device, as on the single-chip host, and the suite's own compile flags (tests/conftest.py: LLVM optimisation
    # level 0, the older fusion emitters): the figures checked here are positive, ratios and falling losses, which
    # they do not change (the same HLO passes run), and the tiny presets' time is mostly compiling (the training
    # script's four configurations took 56 s to compile the first at XLA's default level, 37 s at level 0, on a
    # loaded 2-core machine; the sampler script 11.2 s of user CPU, 9.5 s with the older emitters too).
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": SUITE_ONLY_FLAGS}
    result = subprocess.run([sys.executable, f"bench/{script}", *args], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def figure(pattern: str, text: str) -> float:
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not in:\n{text}"
    return float(match.group(1).replace(",", ""))


def test_the_sampler_script_prints_decode_rates_and_the_roofline_fraction():
    out = run_bench("gpu_sampler.py", "--preset", "tiny-llama")
    for batch in (1, 64):
        assert figure(rf"batch +{batch}: decode +{NUMBER} tokens/s", out) > 0
    assert figure(rf"= +{NUMBER}% of HBM roofline", out) > 0


def test_the_training_script_prints_each_configuration_and_the_sharded_ratio():
    out = run_bench("gpu_train.py", "--preset", "tiny-llama", "--seq", "64", "--batch", "2", "--steps", "2",
                    "--configs", "full,sharded,lora,qlora", "--attention", "xla")
    rows = {row["config"]: row for row in map(json.loads, re.findall(r"^\{.*\}$", out, re.MULTILINE))}
    assert set(rows) == {"full", "sharded", "lora", "qlora"}
    assert all(row["tokens_per_second"] > 0 and row["last_loss"] < row["first_loss"] for row in rows.values())
    assert rows["qlora"]["base_storage"]["ratio_to_bfloat16"] <= 0.3
    assert figure(rf"sharded/full tokens/s: {NUMBER}", out) > 0


def test_the_serving_script_prints_the_batch_1_token_time_and_the_aggregate():
    out = run_bench("gpu_serve.py", "--preset", "tiny-llama", "--streams", "4", "--tokens", "16")
    assert figure(rf"int8 serving copy: .* {NUMBER} of bfloat16", out) < 1
    assert figure(rf"batch 1: {NUMBER} ms per output token", out) > 0
    assert figure(rf"4 streams: {NUMBER} tokens/s aggregate", out) > 0


def test_the_grpo_script_prints_rollout_and_update_rates():
    out = run_bench("gpu_grpo.py", "--preset", "tiny-llama", "--prompts", "2", "--tokens", "16", "--steps", "2")
    assert figure(rf"rollout: {NUMBER} generated tokens/s", out) > 0
    assert figure(rf"update: {NUMBER} tokens/s", out) > 0


@pytest.mark.parametrize("part", ["1", "2"])
def test_the_run_script_names_each_part(part, tmp_path):
    # Parses every part's commands without running them: PYTHON is a stand-in that prints its arguments.
    echo = tmp_path / "python"
    echo.write_text("#!/bin/sh\necho \"ran: $*\"\n")
    echo.chmod(0o755)
    result = subprocess.run(["bash", "bench/gpu.sh", part], cwd=REPO, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": str(echo)})
    assert result.returncode == 0, result.stderr
    scripts = re.findall(r"^ran: (bench/\S+)", (tmp_path / "out" / "gpu.log").read_text(), re.MULTILINE)
    assert scripts == {"1": ["bench/gpu_sampler.py", "bench/gpu_train.py", "bench/gpu_train.py"],
                       "2": ["bench/gpu_serve.py", "bench/gpu_grpo.py", "bench/gpu_train.py", "bench/gpu_train.py"]}[part]
