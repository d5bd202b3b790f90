"""Benchmark: batched multi-turn rollout vs one episode at a time, on the default policy.

Same records, same env (real ToolEnv + BM25 over the synthetic world), same
RolloutConfig except ``batch_size``. Reports generated (action) tokens per
second of wall time, and the share of wall time spent outside ``generate``
(tools, parsing, template rendering, tokenisation, batching).

    .venv/bin/python bench/rollout.py [--records 16 --n 2 --max-new-tokens 64 --max-turns 3]

Writes bench/results/rollout.json.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

from agent_r1.config import EnvConfig, RetrievalConfig, RolloutConfig, SyntheticConfig
from agent_r1.data.synthetic import generate as synthetic_world
from agent_r1.env import SearchTool, ToolEnv
from agent_r1.io import write_json
from agent_r1.retrieval import build_index
from agent_r1.rollout import GenerationEngine, TransformersEngine, run_episodes

ROOT = Path(__file__).resolve().parents[1]


class TimedEngine(GenerationEngine):
    """Wraps an engine; adds up the wall time spent inside ``generate`` and the tokens it returned."""

    def __init__(self, inner: GenerationEngine):
        self.inner, self.seconds, self.tokens, self.calls = inner, 0.0, 0, 0

    def generate(self, prompts, max_new_tokens, **kwargs):
        start = time.perf_counter()
        outs = self.inner.generate(prompts, max_new_tokens, **kwargs)
        self.seconds += time.perf_counter() - start
        self.tokens += sum(len(o.token_ids) for o in outs)
        self.calls += 1
        return outs


def measure(engine: GenerationEngine, env: ToolEnv, records: list[dict], cfg: RolloutConfig) -> dict:
    timed = TimedEngine(engine)
    start = time.perf_counter()
    batch = run_episodes(timed, env, engine.tokenizer, records, cfg)
    wall = time.perf_counter() - start
    return {
        "batch_size": cfg.batch_size,
        "episodes": len(batch),
        "wall_s": round(wall, 2),
        "generate_s": round(timed.seconds, 2),
        "outside_generate_share": round(1 - timed.seconds / wall, 4),
        "generate_calls": timed.calls,
        "action_tokens": int(batch.action_mask.sum()),
        "total_tokens": int(batch.attention_mask.sum()),
        "action_tokens_per_s": round(int(batch.action_mask.sum()) / wall, 1),
        "mean_turns": round(sum(i["turns"] for i in batch.info) / len(batch), 2),
        "mean_tool_calls": round(sum(i["tool_calls"] for i in batch.info) / len(batch), 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "models" / "policy"))
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--records", type=int, default=16)
    ap.add_argument("--n", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "rollout.json"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    questions, corpus = synthetic_world(SyntheticConfig(n_train=args.records, n_test=1, n_test_ood=0, entities_per_type=40), 0)
    records = questions[questions["split"] == "train"].head(args.records).to_dict("records")
    engine = TransformersEngine(args.model, dtype=args.dtype)
    with tempfile.TemporaryDirectory() as tmp:
        index = build_index("bm25", corpus, Path(tmp) / "bm25", RetrievalConfig())
        env = ToolEnv([SearchTool(index, top_k=3)], EnvConfig(max_turns=args.max_turns))
        base = dict(n=args.n, max_new_tokens=args.max_new_tokens, max_total_tokens=2048, dtype=args.dtype, seed=0)
        measure(engine, env, records[:2], RolloutConfig(**base, batch_size=4))  # warm-up
        batched = measure(engine, env, records, RolloutConfig(**base, batch_size=args.batch_size))
        single = measure(engine, env, records, RolloutConfig(**base, batch_size=1))

    ratio = batched["action_tokens_per_s"] / single["action_tokens_per_s"]
    rows = [k for k in batched if k != "batch_size"]
    print(f"\nrollout: {len(records)} records x n={args.n}, {args.dtype}, max_new_tokens={args.max_new_tokens}, "
          f"max_turns={args.max_turns}, {len(corpus)} docs")
    print(f"{'':26s}{'batched':>12s}{'one at a time':>16s}")
    print(f"{'batch_size':26s}{batched['batch_size']:>12}{single['batch_size']:>16}")
    for k in rows:
        print(f"{k:26s}{batched[k]:>12}{single[k]:>16}")
    print(f"{'speed-up (tokens/s)':26s}{ratio:>12.2f}x")
    write_json(args.out, {
        "config": {**vars(args), "n_docs": len(corpus)},
        "batched": batched,
        "one_at_a_time": single,
        "speedup_tokens_per_s": round(ratio, 2),
    })


if __name__ == "__main__":
    main()
