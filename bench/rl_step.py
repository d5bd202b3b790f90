"""Benchmark: whole default RL steps (rollout, logprobs, update, weight sync), side by side.

Each *side* is a source tree and params overrides, run in its own subprocess
so that its peak resident memory is its own: ``label=REV[,key=value...]``,
where ``REV`` is a git revision (extracted with ``git archive``, its own
``params.yaml`` included) or ``.`` for the working tree. Every side trains
``train_rl`` from the same warm start (``models/sft``) on the same prepared
questions and BM25 index, at its tree's default params plus ``--set`` and its
own overrides, for ``--steps`` steps; the times are ``train_rl``'s own
``time/{rollout,logprobs,update,step}_s``. The first step of a side pays for
warm-up (thread pools, allocator), so the summary averages the steps after it.

    .venv/bin/python bench/rl_step.py old=d76e014 new=. per_turn=.,rollout.continuous=false --steps 3

A nested key under a null one makes it a mapping: ``lora=.,train.lora.rank=8``.

With ``--eval-questions N`` each trained policy is then scored greedily on the
evaluate stage's held-out sample (N per source): EM with its standard error,
and the paired difference against the first side on the same questions. The
flat and step representations side by side, after the default 10 steps:

    .venv/bin/python bench/rl_step.py flat=. step=.,algorithm.representation=step \
        step_last1=.,algorithm.representation=step,env.context.keep_last=1 \
        --steps 10 --eval-questions 75 --out bench/results/representation.json

Writes bench/results/rl_step.json (with the machine) and prints a table with
ratios against the first side.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("rollout", "logprobs", "update")

# Runs inside a side's subprocess, with that side's tree first on sys.path: train_rl for the
# given steps, then every step's metrics from its dvclive folder and the process's peak RSS.
DRIVER = r"""
import csv, json, resource, sys, tempfile
from pathlib import Path
import yaml
from agent_r1.config import experiment_params, parse_params
from agent_r1.data.schema import read_questions
try:
    from agent_r1.training.loop import train_rl
except ImportError:  # trees before the training core's split
    from agent_r1.training.trainer import train_rl

tree, root, out, sets = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), json.loads(sys.argv[4])
eval_n = json.loads(sys.argv[5])
raw = yaml.safe_load((tree / "params.yaml").read_text())
for key, value in sets.items():
    node = raw
    *parents, leaf = key.split(".")
    for k in parents:
        if node.get(k) is None:  # e.g. train.lora.rank=8 on train.lora: null
            node[k] = {}
        node = node[k]
    node[leaf] = yaml.safe_load(value)
params = experiment_params(parse_params(raw), "grpo")
questions = read_questions(root / "data/prepared/train.parquet").to_dict("records")
steps = [{} for _ in range(params.train.steps)]
with tempfile.TemporaryDirectory() as tmp:
    tmp = Path(tmp)
    train_rl(params, init_model=root / "models/sft", index_path=root / "indexes/bm25",
             train_questions=questions, eval_questions=questions[-2:], out_model=tmp / "model",
             checkpoint_dir=tmp / "ckpt", live_dir=tmp / "live")
    for tsv in (tmp / "live" / "plots" / "metrics").rglob("*.tsv"):
        name = str(tsv.relative_to(tmp / "live" / "plots" / "metrics").with_suffix(""))
        for row in csv.DictReader(tsv.open(), delimiter="\t"):
            steps[int(row["step"])][name] = float(row[tsv.stem])
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # training's peak, before any evaluation
    held_out = []
    if eval_n:
        from agent_r1.evaluation.greedy import play_policy, select_questions
        from agent_r1.retrieval import load_index
        test = select_questions(read_questions(root / "data/prepared/test.parquet"), eval_n, params.eval.seed)
        infos = play_policy(tmp / "model", load_index(root / "indexes/bm25"), test, params, "bench")
        held_out = [{k: i[k] for k in ("question_id", "source", "em", "f1", "turns")} for i in infos]
out.write_text(json.dumps({"steps": steps, "peak_rss_gib": rss, "held_out": held_out,
                           "params": params.model_dump(mode="json")}))
"""


def machine() -> dict[str, object]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    import torch

    return {"cpu": cpu, "cores": len(os.sched_getaffinity(0)), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def source_tree(rev: str, scratch: Path) -> Path:
    """The working tree for ``.``, else ``rev`` extracted from git into ``scratch``."""
    if rev == ".":
        return ROOT
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True).stdout
    tree = scratch / rev
    if tree.is_dir():  # two sides of one revision (different overrides) share its tree
        return tree
    tree.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tree, filter="data")
    return tree


def run_side(label: str, spec: str, common: dict[str, str], scratch: Path, eval_n: int | None = None) -> dict:
    """Train one side in a subprocess; its per-step metrics, summary and configuration."""
    rev, *overrides = spec.split(",")
    sets = {**common, **dict(o.split("=", 1) for o in overrides)}
    tree = source_tree(rev, scratch)
    out = scratch / f"{label}.json"
    env = {**os.environ, "PYTHONPATH": str(tree), "DVC_NO_ANALYTICS": "1", "DO_NOT_TRACK": "1"}
    print(f"[{label}] {rev} {sets}", flush=True)
    subprocess.run([sys.executable, "-c", DRIVER, str(tree), str(ROOT), str(out), json.dumps(sets), json.dumps(eval_n)],
                   cwd=scratch, env=env, check=True)
    result = json.loads(out.read_text())
    steps = result["steps"]
    timed = steps[1:] or steps  # the first step pays for warm-up

    def mean(key: str) -> float:
        return sum(s.get(key, 0.0) for s in timed) / len(timed)

    p = result["params"]
    summary = {"step_s": mean("time/step_s"), "tokens": mean("train/tokens"),
               "trajectories": p["train"]["questions_per_step"] * p["rollout"]["n"],
               # the step representation trains one sample per turn: its own count of tokens and samples
               "trained_tokens": mean("train/sample_tokens") or mean("train/step_tokens") or mean("train/tokens"),
               "samples": mean("train/samples") or mean("train/step_samples") or p["train"]["questions_per_step"] * p["rollout"]["n"]}
    for part in PARTS:
        summary[f"{part}_s"] = mean(f"time/{part}_s")
        summary[f"{part}_share"] = summary[f"{part}_s"] / summary["step_s"]
    summary["tokens_per_s"] = summary["tokens"] / summary["step_s"]
    # what the update did not compute: tokens shared within packed micro-batches, samples without a gradient
    summary["shared_token_share"] = mean("train/shared_token_share")
    summary["skipped_samples"] = mean("train/skipped_samples")
    summary["skipped_tokens"] = mean("train/skipped_tokens")
    summary["peak_rss_gib"] = result["peak_rss_gib"]
    if result.get("held_out"):
        summary |= held_out_summary(result["held_out"])
    return {"rev": rev, "sets": sets, "summary": summary, "steps": steps, "held_out": result.get("held_out", [])}


def held_out_summary(rows: list[dict]) -> dict[str, float]:
    """EM and F1 over the held-out questions, with EM's binomial standard error."""
    n = len(rows)
    em = sum(r["em"] for r in rows) / n
    return {"held_out_n": n, "em": em, "em_se": math.sqrt(em * (1 - em) / n), "f1": sum(r["f1"] for r in rows) / n,
            "eval_turns": sum(r["turns"] for r in rows) / n}


def paired(first: list[dict], other: list[dict]) -> dict[str, float]:
    """EM(other) - EM(first) on the same questions: the mean paired difference, its standard error
    (sd of the per-question differences / sqrt(n)), and how many questions each side alone got right."""
    a = {r["question_id"]: r["em"] for r in first}
    d = [r["em"] - a[r["question_id"]] for r in other if r["question_id"] in a]
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1)) if n > 1 else 0.0
    return {"n": n, "em_diff": mean, "em_diff_se": sd / math.sqrt(n),
            "only_other": sum(x > 0 for x in d), "only_first": sum(x < 0 for x in d)}


def table(sides: dict[str, dict]) -> str:
    first = next(iter(sides.values()))
    head = (f"{'side':<12}{'step s':>9}{'rollout s':>11}{'update s':>10}{'tokens/s':>10}{'trained tok':>12}"
            f"{'samples':>9}{'shared':>8}{'skipped':>8}{'RSS GiB':>9}{'speedup':>9}")
    lines = [head]
    for label, side in sides.items():
        s = side["summary"]
        line = (f"{label:<12}{s['step_s']:>9.1f}{s['rollout_s']:>11.1f}{s['update_s']:>10.1f}{s['tokens_per_s']:>10.0f}"
                f"{s['trained_tokens']:>12.0f}{s['samples']:>9.0f}{s.get('shared_token_share', 0):>8.0%}"
                f"{s.get('skipped_tokens', 0):>8.0%}{s['peak_rss_gib']:>9.2f}"
                f"{first['summary']['step_s'] / s['step_s']:>8.2f}x")
        if "em" in s:
            d = paired(first["held_out"], side["held_out"])
            line += (f"   EM {s['em']:.3f} ± {s['em_se']:.3f} (n={s['held_out_n']}); vs first "
                     f"{d['em_diff']:+.3f} ± {d['em_diff_se']:.3f} paired ({d['only_other']} vs {d['only_first']})")
        lines.append(line)
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sides", nargs="+", help="label=REV[,key=value...]; REV a git revision or . (working tree)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--set", action="append", default=[], help="key=value for every side (params.yaml keys)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "rl_step.json")
    ap.add_argument("--eval-questions", type=int, default=None,
                    help="then score each trained policy greedily on this many held-out questions per source "
                    "(the evaluate stage's seeded sample): EM ± SE and paired differences against the first side")
    args = ap.parse_args()
    common = {"train.steps": str(args.steps), "train.save_every": "1000", "train.eval_every": "1000",
              **dict(s.split("=", 1) for s in args.set)}
    sides = {}
    with tempfile.TemporaryDirectory() as scratch:
        for side in args.sides:
            label, spec = side.split("=", 1)
            sides[label] = run_side(label, spec, common, Path(scratch), args.eval_questions)
            print(table(sides), flush=True)
    out = {"machine": machine(), "steps": args.steps, "sides": sides,
           "speedup_vs_first": {k: next(iter(sides.values()))["summary"]["step_s"] / v["summary"]["step_s"]
                                for k, v in sides.items()}}
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
