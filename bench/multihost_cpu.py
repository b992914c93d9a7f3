"""One SFT job as 2 processes x 4 fake CPU devices (jax.distributed over gloo, as two hosts would run
it) against 1 process x 8 devices (``parallel: {data: 8}``), side by side in one run: step time,
CPU time, and whether the losses agree.

    .venv/bin/python bench/multihost_cpu.py [--steps 30] [--out bench/out/multihost]

Both layouts are the same SPMD program over 8 devices; the two-process one adds the cross-process
collectives (gloo over loopback TCP) and a second Python process. The host is shared with other
work, so the CPU seconds of the processes are reported next to wall time.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ROWS = [{"prompt": f"question {i}: what is {i} plus {i}?", "completion": f"it is {2 * i}"} for i in range(64)]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def write_spec(out: Path, name: str, *, model: Path, data: Path, steps: int, hosts: int) -> Path:
    spec = {"task": "sft", "model": str(model), "output_dir": str(out / name), "hosts": hosts,
            "data": {"train": str(data), "max_seq_len": 64},
            "train": {"max_steps": steps, "batch_size": 16, "save_every": steps, "eval_samples": 0}}
    if hosts == 1:
        spec["parallel"] = {"data": 8}
    path = out / f"{name}.json"
    path.write_text(json.dumps(spec))
    return path


def run_processes(commands: list[tuple[list[str], dict[str, str]]]) -> tuple[float, float]:
    """Run the commands together; (wall seconds, CPU seconds of all of them)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    processes = [subprocess.Popen(command, env={**os.environ, **env}, cwd=ROOT, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True) for command, env in commands]
    for process in processes:
        _, error = process.communicate()
        if process.returncode != 0:
            raise SystemExit(f"{' '.join(commands[0][0])} failed:\n{error[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return time.perf_counter() - started, cpu


def step_seconds(metrics_path: Path) -> tuple[list[float], list[float]]:
    records = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    losses = [record["loss"] for record in records]
    tokens = [b["tokens"] - a["tokens"] for a, b in zip([{"tokens": 0}] + records, records)]
    seconds = [count / record["tokens_per_second"] for count, record in zip(tokens, records)]
    return losses, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", default="bench/out/multihost")
    args = parser.parse_args()
    from tests.factories import build_tiny_model_dir

    out = (ROOT / args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    model = build_tiny_model_dir(out / "model")
    data = out / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    train = [sys.executable, "-m", "jaxengine", "train", "--no-progress"]
    cpu_env = {"JAX_PLATFORMS": "cpu"}

    single = write_spec(out, "one-process", model=model, data=data, steps=args.steps, hosts=1)
    wall_one, cpu_one = run_processes([(train + [str(single)],
                                        {**cpu_env, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"})])
    multi = write_spec(out, "two-processes", model=model, data=data, steps=args.steps, hosts=2)
    coordinator = f"127.0.0.1:{free_port()}"
    wall_two, cpu_two = run_processes([
        (train + [str(multi), "--coordinator", coordinator, "--num-processes", "2", "--process-id", str(index)],
         {**cpu_env, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}) for index in (0, 1)])

    losses_one, seconds_one = step_seconds(out / "one-process" / "metrics.jsonl")
    losses_two, seconds_two = step_seconds(out / "two-processes" / "metrics.jsonl")
    steady_one, steady_two = statistics.median(seconds_one[2:]), statistics.median(seconds_two[2:])
    result = {
        "steps": args.steps, "batch_rows": 16, "seq_len": 64,
        "one_process_8_devices": {"wall_s": round(wall_one, 1), "cpu_s": round(cpu_one, 1),
                                  "median_step_s": round(steady_one, 4)},
        "two_processes_4_devices": {"wall_s": round(wall_two, 1), "cpu_s": round(cpu_two, 1),
                                    "median_step_s": round(steady_two, 4)},
        "step_time_ratio_two_over_one": round(steady_two / steady_one, 2),
        "max_loss_difference": max(abs(a - b) for a, b in zip(losses_one, losses_two)),
        "load_average": os.getloadavg(),
    }
    print(json.dumps(result, indent=2))
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
