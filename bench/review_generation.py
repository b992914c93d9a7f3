"""A review campaign on two models' answers, generated end to end in this process.

Builds a throwaway SQLite database (as bench/pages.py), registers two model directories as base
models, stores the first ``--prompts`` rows of a prompts file as a ready ``prompts`` dataset version,
creates the campaign with ``services.campaign_generate`` and runs the serve worker's task
(``worker.tasks.review.generate_campaign_answers``) on it: both models' answers through the serve
worker's model cache and batching server, then the items in one transaction. Each mode runs twice on
a fresh campaign (the first compiles; the second is reported), side by side:

- ``batched``: the task as the worker runs it (slices of the server's ``max_batch``, 64);
- ``one at a time``: the same task with ``max_batch = 1``, i.e. one request per decode loop.

    .venv/bin/python bench/review_generation.py [--model-a bench/out/demo/model] \\
        [--model-b bench/out/demo_sft/export] [--prompts-file bench/out/demo/data/eval.jsonl] \\
        [--prompts 256] [--max-new-tokens 16]
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import tempfile
import time
from pathlib import Path

from pages import setup_django

ROOT = Path(__file__).resolve().parent.parent


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-a", default=str(ROOT / "bench/out/demo/model"))
    parser.add_argument("--model-b", default=str(ROOT / "bench/out/demo_sft/export"))
    parser.add_argument("--prompts-file", default=str(ROOT / "bench/out/demo/data/eval.jsonl"))
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    return parser.parse_args()


def setup(args):
    from django.contrib.auth import get_user_model

    from webapp.basemodels.models import BaseModel
    from webapp.datasets.models import Dataset, DatasetVersion, VersionStatus
    from webapp.projects.services import project_create

    owner = get_user_model().objects.create_user("bench-owner", password="unused-password")
    project = project_create(name="Bench", slug="bench", owner=owner)
    models = [BaseModel.objects.create(project=project, name=name, path=path, architecture="LlamaForCausalLM",
                                       parameter_count=1, tokenizer_type="tokenizer.model", dtype="float32",
                                       size_bytes=1)
              for name, path in (("A", args.model_a), ("B", args.model_b))]
    with open(args.prompts_file) as source:
        rows = [json.loads(line) for line in itertools.islice(source, args.prompts)]
    dataset = Dataset.objects.create(project=project, name="prompts", kind="prompts", created_by=owner)
    version = DatasetVersion(dataset=dataset, number=1, original_filename="prompts.jsonl", format="jsonl",
                             size_bytes=0, status=VersionStatus.READY, row_count=len(rows), created_by=owner)
    version.file_path = f"datasets/{dataset.public_id}/{version.public_id}.jsonl"
    version.absolute_path.parent.mkdir(parents=True, exist_ok=True)
    version.absolute_path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    version.save()
    return owner, project, models, version


def run_campaign(name, owner, project, models, version, args, *, max_batch: int | None):
    from webapp.review import services
    from worker.tasks import review, serve

    campaign = services.campaign_generate(
        project=project, name=name, guidelines="", required_reviews=1, reviewers=[owner],
        model_a=models[0].public_id, model_b=models[1].public_id, prompts_version=version,
        prompt_count=args.prompts, sampling=services.GenerationSettings(max_new_tokens=args.max_new_tokens,
                                                                        temperature=0.0), user=owner)
    servers = [serve.server_for(f"{model.public_id}@{model.path}", model.path)[0] for model in models]
    saved = [server.max_batch for server in servers]
    for server in servers:
        server.max_batch = max_batch or server.max_batch
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        review.generate_campaign_answers(campaign.pk)
    finally:
        for server, value in zip(servers, saved):
            server.max_batch = value
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    campaign.refresh_from_db()
    assert campaign.status == "ready", campaign.load_error
    return campaign, wall, cpu


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="temper-bench-review-generation-") as data_root:
        setup_django(Path(data_root))
        from webapp.celery import app

        app.send_task = lambda *unused, **unused_too: None  # the task is run here, not queued
        owner, project, models, version = setup(args)
        print(f"{args.prompts} prompts x 2 models, greedy, up to {args.max_new_tokens} new tokens; "
              f"load average {os.getloadavg()[0]:.1f}")
        print(f"{'mode':16} {'wall s':>8} {'cpu s':>8} {'answers/s':>10} {'items':>6}")
        results = {}
        for label, max_batch in (("batched", None), ("one at a time", 1)):
            for attempt in range(2):
                campaign, wall, cpu = run_campaign(f"{label} {attempt}", owner, project, models, version, args,
                                                   max_batch=max_batch)
            results[label] = wall
            print(f"{label:16} {wall:8.2f} {cpu:8.2f} {2 * args.prompts / wall:10.1f} {campaign.items.count():6d}")
        identical = sum(item.response_a == item.response_b for item in campaign.items.all())
        print(f"batched / one at a time speed-up: {results['one at a time'] / results['batched']:.2f}x; "
              f"{identical} of {campaign.items.count()} pairs have identical answers; "
              f"{campaign.generation['empty_answers']} left out for an empty answer; "
              f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
