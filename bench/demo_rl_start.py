"""How good a start for RL a model is on the demo task: greedy exact match, sampled mean, pass@G.

GRPO can only reweight answers the model already samples, so a start whose correct answer is often
likely but not the argmax (pass@G well above greedy) leaves room for RL to move the greedy answer;
one whose samples agree with its greedy answer does not (bench/RESULTS.md, "Demo v2"). Scored with
the exact_match reward GRPO trains on, per task kind (the demo rows' ``task`` column) and overall:

    .venv/bin/python bench/demo_rl_start.py --model bench/out/demo_v2_sft/export \
        --data bench/out/demo_v2/data/eval.jsonl --limit 200

Prints one JSON object per model on stdout.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def group_stats(greedy: list[float], sampled: list[list[float]]) -> dict[str, float]:
    """Greedy accuracy, mean sampled reward, pass@G and the share of groups whose rewards differ."""
    count = max(len(greedy), 1)
    return {"greedy": sum(greedy) / count,
            "sampled_mean": sum(sum(group) / len(group) for group in sampled) / count,
            "pass_at_g": sum(max(group) for group in sampled) / count,
            "groups_with_variance": sum(max(group) != min(group) for group in sampled) / count,
            "count": len(greedy)}


def prompt_blind_mean(sampled_answers: list[str], references: list[str]) -> float:
    """The sampled accuracy a model would get by drawing from its kind-wide answer distribution whatever
    the prompt: sum over prompts of q(reference) / N, q the share of each answer among all samples. A
    sampled mean well above it means the samples depend on the prompt (RL has a signal to amplify); one
    close to it means they do not (RL can only move the kind-wide distribution towards its mode)."""
    shares: dict[str, float] = defaultdict(float)
    for answer in sampled_answers:
        shares[answer] += 1 / len(sampled_answers)
    return sum(shares[reference.strip()] for reference in references) / max(len(references), 1)


def score_model(model_dir: str, rows: list[dict], *, generations: int, temperature: float,
                max_new_tokens: int, batch_size: int, seed: int) -> dict:
    from jaxengine.checkpoint.hf import load_hf_model
    from jaxengine.data.pipeline import encode_prompt
    from jaxengine.rewards import exact_match
    from jaxengine.sampler import Sampler, SamplingParams
    from jaxengine.tokenizer import load_tokenizer

    model, _ = load_hf_model(model_dir)
    tokenizer = load_tokenizer(model_dir)
    sampler = Sampler(model, tokenizer)
    prompts = [encode_prompt(tokenizer, row["prompt"]) for row in rows]

    def complete(prompt_ids: list, params: SamplingParams) -> list[str]:
        texts: list[str] = []
        for start in range(0, len(prompt_ids), batch_size):
            texts += [g.text for g in sampler.generate(prompt_ids[start : start + batch_size], params)]
        return texts

    greedy_texts = complete(prompts, SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, seed=seed))
    repeated = [prompt for prompt in prompts for _ in range(generations)]
    sampled_texts = complete(repeated, SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature,
                                                      seed=seed))
    greedy = exact_match(greedy_texts, rows)
    sampled_flat = exact_match(sampled_texts, [row for row in rows for _ in range(generations)])
    sampled = [sampled_flat[i * generations : (i + 1) * generations] for i in range(len(rows))]

    by_kind: dict[str, list[int]] = defaultdict(list)
    for index, row in enumerate(rows):
        by_kind[str(row.get("task", "all"))].append(index)
    kinds = {}
    for kind, indices in sorted(by_kind.items()):
        answers: dict[str, int] = defaultdict(int)
        for index in indices:
            answers[greedy_texts[index].strip()] += 1
        top_answer, top_count = max(answers.items(), key=lambda item: item[1])
        kind_samples = [sampled_texts[i * generations + g].strip() for i in indices for g in range(generations)]
        kinds[kind] = {**group_stats([greedy[i] for i in indices], [sampled[i] for i in indices]),
                       "prompt_blind_mean": prompt_blind_mean(kind_samples, [str(rows[i]["answer"]) for i in indices]),
                       "top_greedy_answer": top_answer, "top_greedy_share": top_count / len(indices)}
    return {"model": model_dir, "temperature": temperature, "generations": generations,
            **group_stats(greedy, sampled), "kinds": kinds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", required=True, help="model directory (repeatable)")
    parser.add_argument("--data", required=True, help="prompts jsonl with prompt, answer and task columns")
    parser.add_argument("--limit", type=int, default=200, help="first N rows (default 200)")
    parser.add_argument("--generations", type=int, default=8, help="samples per prompt (G, default 8)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-new-tokens", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with open(args.data, encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()][: args.limit]
    for model_dir in args.model:
        print(json.dumps(score_model(model_dir, rows, generations=args.generations, temperature=args.temperature,
                                     max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                                     seed=args.seed)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
