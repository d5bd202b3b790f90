"""Benchmark of the RL training update: our DeepSpeed actor update vs a plain torch loop, on the real policy.

Why: on a CPU the update is most of an RL step; this measures how close it
gets to what the machine can do, and what the token-budget micro-batching and
chunked log-probs cost and buy.

1. Ceiling: bf16 and fp32 ``torch.matmul`` GFLOP/s (n x n x n), measured in
   the same run, on the same threads.
2. Update throughput: tokens/s of one actor update (forward + backward +
   AdamW step) on synthetic trajectories of realistic shape (``--rows`` rows
   of ``--min-len``..``--max-len`` tokens, ``--action-frac`` of them action
   tokens, GRPO groups of 4). Ours: ``loop.build_models`` +
   ``loop.update_from_rollout`` exactly as ``train_rl`` calls them (DeepSpeed ZeRO-2
   engine, bf16, token-budget micro-batches, chunked log-probs; the time is
   the update's own ``time/update_s``). Plain torch: the same model in fp32
   under ``torch.autocast(bf16)``, fixed micro-batches of
   ``--naive-micro-rows`` rows in batch order padded to their longest row,
   full-vocabulary float32 log-softmax, the same PPO loss, grad clipping and
   torch AdamW. Utilisation is FLOP/s over the best bf16 (and fp32) matmul
   rate, three ways (see :func:`update_flops`): MFU with PaLM's model FLOPs
   (6 * N per token + 12 * layers * d_attn * T for attention; N = the matmul
   parameters: all of them, the tied LM head counted once as the head matmul,
   embedding lookups being free), the FLOPs the loss needs (the head only on
   the loss-mask positions), and the FLOPs each method executes (padding of
   its micro-batches, our checkpointed head chunks recomputed in the backward,
   the backbone recomputed under ``train.gradient_checkpointing``).
   A third column runs ours on the padded micro-batches that packing replaced
   (``train.pack: false``, same budget): "packed vs padded" is its update
   time over the packed one's; "padding share" is the padded positions
   computed over the real tokens.
3. Peak memory of one update (``ru_maxrss`` of a fresh subprocess, plus the
   update's own peak above the loaded model: VmHWM reset just before it) at
   ``--mem-batches`` trajectories: ours vs plain torch over the full batch at
   once (full [B, T, V] float32 log-softmax). A child whose resident set
   passes ``--mem-cap-gib`` is killed and reported as "> cap".
4. Time split of full RL steps (``train_rl`` on the prepared data and index,
   ``--rl-questions`` x ``--rl-n`` trajectories per step) for 1 and 2 ranks
   (2 under the ``deepspeed`` launcher, like ``train.num_procs: 2``), read
   from the run's dvclive metrics ``time/{rollout,logprobs,update,step}_s``.
   Each rank inherits the thread count, as in the pipeline (2 ranks on 2
   cores oversubscribe); ``--rank-threads 1`` sets OMP_NUM_THREADS instead.
   ``logprobs`` is ~0 when the update is exactly on-policy and ``kl_coef`` 0.

Every measurement runs in its own subprocess (bench/harness.py): one update
in bench/update.py, RL steps in bench/rl_ranks.py; FLOP counts and the matmul
ceiling are in bench/flops.py, the synthetic trajectories in bench/batches.py,
the tables in bench/tables.py. Params come from ``--params``
(the ``--experiment``'s overrides applied); the update sections use the
actor only (GRPO, ``kl_coef`` 0, one mini-batch, one epoch); the RL steps use
the params as they are, resized.

    .venv/bin/python bench/train.py [--quick] [--skip-memory] [--skip-ranks] [--rows 24] [--mem-batches 8 32]

Writes bench/results/train.json (--quick: bench/results/train_quick.json),
after every section.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.flops import format_ceiling, matmul_gflops, throughput_row  # noqa: E402
from bench.harness import REPO, mem_available_kib, run_worker  # noqa: E402
from bench.rl_ranks import format_ranks  # noqa: E402
from bench.tables import format_memory, format_throughput  # noqa: E402

log = logging.getLogger("bench.train")

UPDATE = REPO / "bench" / "update.py"
RL_RANKS = REPO / "bench" / "rl_ranks.py"
DEFAULTS: dict[str, Any] = dict(
    rows=24, min_len=300, max_len=450, action_frac=0.12, group_size=4, reps=2, warmup_rows=4, naive_micro_rows=8,
    mem_batches=[8, 32], matmul_size=2048, matmul_reps=5, ranks=[1, 2], rl_questions=4, rl_n=4, rl_steps=2,
    rl_max_new_tokens=None, rl_max_turns=None,
)  # fmt: skip
QUICK: dict[str, Any] = dict(
    rows=4, min_len=48, max_len=96, reps=1, warmup_rows=2, naive_micro_rows=2, mem_batches=[2, 4],
    matmul_size=512, matmul_reps=3, rl_questions=2, rl_n=2, rl_steps=1, rl_max_new_tokens=16, rl_max_turns=2,
)  # fmt: skip


def ours_and_naive(spec: dict[str, Any], naive_micro_rows: int, cap_kib: int | None) -> tuple[dict, dict]:
    """One update worker per method on the same spec (plain torch in micro-batches of ``naive_micro_rows``)."""
    ours = run_worker(UPDATE, {**spec, "method": "ours"}, cap_kib=cap_kib)
    naive = run_worker(UPDATE, {**spec, "method": "naive", "micro_rows": naive_micro_rows}, cap_kib=cap_kib)
    return ours, naive


def throughput_section(args: argparse.Namespace, base: dict, ceiling: dict, cap_kib: int | None) -> dict:
    """Section 2: one update, ours (packed), ours padded, plain torch."""
    t: dict[str, Any] = {}
    spec = {**base, "mode": "throughput", "rows": args.rows, "reps": args.reps, "warmup_rows": args.warmup_rows}
    log.info("update throughput: %d rows of %d-%d tokens, warm-up %d rows + %d timed; plain torch in "
             "micro-batches of %d rows", args.rows, args.min_len, args.max_len, args.warmup_rows, args.reps,
             args.naive_micro_rows)
    ours, naive = ours_and_naive(spec, args.naive_micro_rows, cap_kib)
    padded = run_worker(UPDATE, {**spec, "method": "ours", "train": {"pack": False}}, cap_kib=cap_kib)
    t["ours"], t["naive"] = throughput_row(ours, ceiling), throughput_row(naive, ceiling)
    t["ours_padded"] = throughput_row(padded, ceiling)
    if "tokens_per_s" in t["ours"] and "tokens_per_s" in t["naive"]:
        t["speedup_tokens_per_s"] = t["ours"]["tokens_per_s"] / t["naive"]["tokens_per_s"]
    if "update_s" in t["ours"] and "update_s" in t["ours_padded"]:
        t["packed_vs_padded"] = t["ours_padded"]["update_s"] / t["ours"]["update_s"]
    return t


def memory_row(base: dict, n: int, cap_kib: int | None) -> dict:
    """Section 3, one batch size: ours vs plain torch over the full batch at once, and their ratios."""
    row: dict[str, Any] = {"rows": n}
    spec = {**base, "mode": "memory", "rows": n, "reps": 1, "warmup_rows": 0}
    log.info("memory: one update of %d rows, ours vs plain torch on the full batch", n)
    row["ours"], row["naive"] = ours_and_naive(spec, n, cap_kib)
    for key, name in (("ru_maxrss_mib", "ratio_ru_maxrss"), ("update_peak_above_loaded_mib", "ratio_update_peak")):
        o, nv = row["ours"].get(key), row["naive"].get(key)
        if o and nv:
            row[name] = nv / o
    if "killed_above_mib" in row["naive"] and row["ours"].get("ru_maxrss_mib"):
        row["ratio_ru_maxrss_at_least"] = row["naive"]["killed_above_mib"] / row["ours"]["ru_maxrss_mib"]
    return row


def ranks_row(args: argparse.Namespace, base: dict, ranks: int) -> dict:
    """Section 4, one rank count: ``train_rl``'s time split."""
    if args.rl_questions % ranks:
        raise SystemExit(f"--rl-questions {args.rl_questions} must be divisible by {ranks} ranks")
    spec = {**base, "data_dir": str(args.data_dir), "index": str(args.index), "questions": args.rl_questions,
            "n": args.rl_n, "steps": args.rl_steps, "max_new_tokens": args.rl_max_new_tokens,
            "max_turns": args.rl_max_turns}  # fmt: skip
    log.info("RL steps, %d rank(s): %d step(s) of %d questions x %d", ranks, args.rl_steps, args.rl_questions, args.rl_n)
    return {**run_worker(RL_RANKS, spec, ranks=ranks, threads=args.rank_threads), "ranks": ranks}


def failed(rows: list[dict]) -> bool:
    return any("error" in r for r in rows)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, default=REPO / "models" / "policy")
    p.add_argument("--params", type=Path, default=REPO / "params.yaml")
    p.add_argument("--experiment", default="grpo", help="its overrides apply when params has it")
    p.add_argument("--data-dir", type=Path, default=REPO / "data" / "prepared")
    p.add_argument("--index", type=Path, default=REPO / "indexes" / "bm25")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of every section")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rows", type=int, help="trajectories in the throughput update")
    p.add_argument("--min-len", type=int)
    p.add_argument("--max-len", type=int)
    p.add_argument("--action-frac", type=float)
    p.add_argument("--group-size", type=int)
    p.add_argument("--reps", type=int, help="timed updates (median reported)")
    p.add_argument("--warmup-rows", type=int, help="rows of the untimed warm-up update (0: none)")
    p.add_argument("--naive-micro-rows", type=int, help="rows per micro-batch of the plain torch loop")
    p.add_argument("--mem-batches", type=int, nargs="+")
    p.add_argument("--mem-cap-gib", type=float, help="kill a memory worker above this RSS (default: 80%% of MemAvailable)")
    p.add_argument("--matmul-size", type=int)
    p.add_argument("--matmul-reps", type=int)
    p.add_argument("--ranks", type=int, nargs="+")
    p.add_argument("--rank-threads", type=int, help="OMP_NUM_THREADS per rank (default: inherited, as the pipeline)")
    p.add_argument("--rl-questions", type=int, help="questions per RL step (divisible by every rank count)")
    p.add_argument("--rl-n", type=int, help="samples per question")
    p.add_argument("--rl-steps", type=int)
    p.add_argument("--rl-max-new-tokens", type=int, help="override rollout.max_new_tokens")
    p.add_argument("--rl-max-turns", type=int, help="override env.max_turns")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--skip-ranks", action="store_true")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    for key, value in {**DEFAULTS, **(QUICK if args.quick else {})}.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.out is None:
        args.out = REPO / "bench" / "results" / ("train_quick.json" if args.quick else "train.json")
    return args


def start_result(args: argparse.Namespace, avail: int | None, cap_kib: int | None) -> dict[str, Any]:
    """The result's header: the configuration and the machine."""
    return {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "loadavg_start": os.getloadavg(), "mem_available_gib": round(avail / 2**20, 1) if avail else None,
                    "mem_cap_gib": round(cap_kib / 2**20, 1) if cap_kib else None},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    from agent_r1.io import write_json

    avail = mem_available_kib()
    cap_kib = int(args.mem_cap_gib * 2**20) if args.mem_cap_gib else (int(avail * 0.8) if avail else None)
    base = {"model": str(args.model), "params": str(args.params), "experiment": args.experiment, "seed": args.seed,
            "min_len": args.min_len, "max_len": args.max_len, "action_frac": args.action_frac,
            "group_size": args.group_size}  # fmt: skip
    result, bad = start_result(args, avail, cap_kib), False

    log.info("matmul ceiling: %d^3, %d reps, bf16 and fp32", args.matmul_size, args.matmul_reps)
    result["matmul"] = ceiling = matmul_gflops(args.matmul_size, args.matmul_reps)
    print(format_ceiling(ceiling), flush=True)
    write_json(args.out, result)
    if not args.skip_throughput:
        result["throughput"] = t = throughput_section(args, base, ceiling, cap_kib)
        bad |= failed([t["ours"], t["ours_padded"], t["naive"]])
        print(format_throughput(t), flush=True)
        write_json(args.out, result)
    if not args.skip_memory:
        result["memory"] = rows = [memory_row(base, n, cap_kib) for n in args.mem_batches]
        bad |= failed([r[k] for r in rows for k in ("ours", "naive")])
        print(format_memory(rows), flush=True)
        write_json(args.out, result)
    if not args.skip_ranks:
        result["ranks"] = rows = [ranks_row(args, base, ranks) for ranks in args.ranks]
        bad |= failed(rows)
        print(format_ranks(rows), flush=True)
    result["machine"]["loadavg_end"] = os.getloadavg()
    write_json(args.out, result)
    print(f"\nwrote {args.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
