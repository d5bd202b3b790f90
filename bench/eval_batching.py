"""Benchmark: greedy held-out evaluation, one call per batch of records vs one continuous call.

The evaluate stage calls ``run_episodes`` once per ``rollout.batch_size``
records, so each batch waits for its slowest episode with its other slots
idle. The alternative is one call for every record, the engine refilling a
slot as soon as an episode ends. Both run here in one process, on the same
questions, engine and env, alternating (A B A B) so that a drift in machine
load falls on both:

    python bench/eval_batching.py [--model models/sft --questions 96 --repeats 2]

Prints seconds and episodes/s per way, the ratio, and whether every question
got the same answer both ways; writes bench/results/evaluate.json with the
machine's description. Needs the default pipeline's outputs (``make run``:
models/sft, indexes/bm25, data/prepared/test.parquet).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from rollout import machine  # noqa: E402


def batched(engine: Any, env: Any, records: list[dict], cfg: Any) -> list[dict]:
    """What the evaluate stage does: one ``run_episodes`` per ``cfg.batch_size`` records."""
    from agent_r1.rollout import run_episodes

    infos: list[dict] = []
    for i in range(0, len(records), cfg.batch_size):
        infos.extend(run_episodes(engine, env, engine.tokenizer, records[i : i + cfg.batch_size], cfg, greedy=True).info)
    return infos


def continuous(engine: Any, env: Any, records: list[dict], cfg: Any) -> list[dict]:
    """Every record in one call, slots refilled as episodes end."""
    from agent_r1.rollout import run_episodes

    return run_episodes(engine, env, engine.tokenizer, records, cfg, greedy=True).info


def setup(args: argparse.Namespace) -> tuple[Any, Any, list[dict], Any]:
    """The engine, env and questions the evaluate stage would use (the test set's first ``--questions``)."""
    import pandas as pd

    from agent_r1.config import load_params
    from agent_r1.env import make_env
    from agent_r1.evaluation.greedy import select_questions
    from agent_r1.retrieval import load_index
    from agent_r1.rollout import make_rollout_engine

    params = load_params(args.params)
    test = pd.read_parquet(args.test)
    records = select_questions(test, params.eval.questions_per_source, params.eval.seed)[: args.questions]
    engine = make_rollout_engine(args.model, params.rollout)
    env = make_env(params, index=load_index(args.index))
    return engine, env, records, params.rollout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    ap.add_argument("--model", type=Path, default=ROOT / "models/sft")
    ap.add_argument("--index", type=Path, default=ROOT / "indexes/bm25")
    ap.add_argument("--test", type=Path, default=ROOT / "data/prepared/test.parquet")
    ap.add_argument("--questions", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/evaluate.json")
    args = ap.parse_args()
    engine, env, records, cfg = setup(args)
    start = {"load_avg_1m_at_start": os.getloadavg()[0]}
    seconds: dict[str, list[float]] = {"batched": [], "continuous": []}
    answers: dict[str, list[str]] = {}
    for _ in range(args.repeats):
        for name, play in (("batched", batched), ("continuous", continuous)):
            t0 = time.monotonic()
            infos = play(engine, env, records, cfg)
            seconds[name].append(time.monotonic() - t0)
            answers[name] = [str(i.get("answer")) for i in infos]
            print(f"{name:>10}: {seconds[name][-1]:.1f} s for {len(records)} questions", flush=True)
    mean = {k: sum(v) / len(v) for k, v in seconds.items()}
    same = sum(a == b for a, b in zip(answers["batched"], answers["continuous"]))
    result = {
        "machine": {**machine(), **start, "load_avg_1m_at_end": os.getloadavg()[0]},
        "config": {"questions": len(records), "repeats": args.repeats, "slots": cfg.batch_size,
                   "engine": cfg.engine, "dtype": cfg.dtype, "model": str(args.model)},
        "seconds": seconds,
        "episodes_per_s": {k: len(records) / v for k, v in mean.items()},
        "speedup_continuous_vs_batched": mean["batched"] / mean["continuous"],
        "same_answers": same,
    }
    print(f"continuous / batched: {result['speedup_continuous_vs_batched']:.2f}x faster; "
          f"{same} of {len(records)} answers identical")
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
