"""Memory maps and live XLA programs of one serve process that serves many models in turn (bench/RESULTS.md,
"The serve worker's compiled programs").

Builds ``--models`` tiny models of as many structures (``tests.factories.build_tiny_model_dir``, each its own
context length, so that no two share programs), then, in this one process, serves them one after another through
the serve worker's own path (``worker.tasks.serve.server_for``: its ``ModelCache``, bounded here to ``--keep``
models, its batching servers, their warm-up where ``TEMPER_SERVE_WARMUP`` is on): a few chats of different prompt
lengths, alone and two at once, then one chat to the first model, which stays cached (the most recently used)
where ``--keep`` > 1, as a popular model does while others come and go. With ``--copies`` it also writes each
model's int8 serving copy, scored on two rows, in the same process (as the serve worker's ``quantize_run`` and
``make_serving_copy`` do: its perplexities and greedy agreement compile programs of two structures). After each
model it prints the process's memory maps (``/proc/self/maps`` lines), XLA's live programs and those chats' times to
first token:

    PYTHONPATH=$PWD TEMPER_SERVE_WARMUP=0 .venv/bin/python bench/serve_maps.py --models 12 --keep 2 --copies
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import time
from pathlib import Path


COPY_ROWS = [{"prompt": "Hello world", "completion": " and goodbye"}, {"prompt": "the quick", "completion": " fox"}]


def maps() -> int:
    with open("/proc/self/maps") as handle:
        return sum(1 for _ in handle)


def live_programs() -> int:
    import jax

    return len(jax.devices()[0].client.live_executables())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=12)
    parser.add_argument("--keep", type=int, default=2, help="models the serve cache holds (its memory budget)")
    parser.add_argument("--workdir", default=None, help="where the tiny models are written (a temporary directory)")
    parser.add_argument("--copies", action="store_true", help="write each model's serving copy too, after its chats")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()
    from django.conf import settings

    from jaxengine.quantize import QuantScheme, export_quantized
    from jaxengine.sampler import SamplingParams
    from jaxengine.serving import ServeRequest, load_serving_model
    from tests.factories import build_tiny_model_dir
    from worker.tasks import serve

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="serve-maps-"))
    first_context = 128 if args.copies else 64  # the copies' rows take 82 tokens with the chat template
    contexts = [first_context + 16 * index for index in range(args.models)]
    model_dirs = []
    for context in contexts:
        model_dir = workdir / f"context-{context}"
        if not (model_dir / "config.json").exists():
            build_tiny_model_dir(model_dir, context=context)
        model_dirs.append(model_dir)
    nbytes = load_serving_model(model_dirs[0]).nbytes
    settings.TEMPER_SERVE_MEMORY_BYTES = nbytes * args.keep + nbytes // 2
    print(json.dumps({"start": True, "maps": maps(), "live_programs": live_programs(),
                      "max_map_count": int(Path("/proc/sys/vm/max_map_count").read_text()),
                      "model_bytes": nbytes, "keep": args.keep, "warmup": settings.TEMPER_SERVE_WARMUP,
                      "copies": args.copies}), flush=True)

    def chat(key: str, model_dir: Path, prompt_length: int, seed: int = 0):
        server, _ = serve.server_for(key, str(model_dir))
        server.warmed.wait()
        return server.submit(ServeRequest(prompt_ids=tuple(range(3, 3 + prompt_length)), ignore_eos=True,
                                          params=SamplingParams(max_new_tokens=24, temperature=0.7, seed=seed)))

    started = time.perf_counter()
    for index, model_dir in enumerate(model_dirs):
        key = f"model-{index}"
        first_token = [chat(key, model_dir, length).result().first_token_seconds for length in (5, 20, 40)]
        together = [chat(key, model_dir, 12, seed) for seed in (1, 2)]
        first_token += [future.result().first_token_seconds for future in together]
        if args.copies:
            export_quantized(model_dir, workdir / f"copy-{index}", scheme=QuantScheme.named("int8"),
                             eval_rows=COPY_ROWS, eval_kind="sft", max_new_tokens=8)
            gc.collect()  # counted once freed: a holder of programs and its jitted methods form a cycle
        figures = {"model": index, "context": contexts[index], "maps": maps(), "live_programs": live_programs(),
                   "first_token_s": [round(seconds, 3) for seconds in first_token]}
        if index and args.keep > 1:  # still cached, its programs compiled with its first chats
            figures["kept_model_first_token_s"] = round(
                chat("model-0", model_dirs[0], 20).result().first_token_seconds, 3)
        figures["seconds"] = round(time.perf_counter() - started, 1)
        print(json.dumps(figures), flush=True)
    serve.shutdown()


if __name__ == "__main__":
    main()
