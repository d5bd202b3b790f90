"""Full RL steps under ``train_rl``, in this process (a worker of bench/train.py): the time split.

``train_rl`` on the prepared data and index, ``spec['questions']`` x ``spec['n']``
trajectories per step, on as many ranks as the launcher started (2 under the
``deepspeed`` launcher, like ``train.num_procs: 2``); the times are the run's
dvclive metrics ``time/{rollout,logprobs,update,step}_s``.

    python bench/rl_ranks.py --spec SPEC.json     (bench/train.py writes the spec)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import bench_params, worker_main  # noqa: E402


def read_live(live_dir: Path) -> list[dict]:
    """Per-step rows of every scalar dvclive logged (``{'step': 0, 'time/rollout_s': ...}``)."""
    steps: dict[int, dict] = {}
    root = live_dir / "plots" / "metrics"
    for tsv in sorted(root.glob("**/*.tsv")):
        lines = tsv.read_text().splitlines()
        header = lines[0].split("\t")
        name = str(tsv.relative_to(root).with_suffix(""))
        for line in lines[1:]:
            cells = dict(zip(header, line.split("\t")))
            steps.setdefault(int(cells["step"]), {})[name] = float(cells[header[-1]])
    return [{"step": s, **steps[s]} for s in sorted(steps)]


def worker_rl(spec: dict) -> dict | None:
    """``train_rl`` for ``spec['steps']`` steps on the prepared data; rank 0 returns dvclive's per-step rows."""
    import pandas as pd
    import torch

    from agent_r1.training.distributed import init_distributed, is_rank0
    from agent_r1.training.trainer import train_rl

    rank, world = init_distributed()
    q, n, steps = spec["questions"], spec["n"], spec["steps"]
    over: dict[str, Any] = {
        "train": {"steps": steps, "questions_per_step": q, "mini_batch_size": q * n, "num_procs": world,
                  "eval_every": steps, "save_every": steps},
        "rollout": {"n": n},
    }  # fmt: skip
    if spec.get("max_new_tokens"):
        over["rollout"]["max_new_tokens"] = spec["max_new_tokens"]
    if spec.get("max_turns"):
        over["env"] = {"max_turns": spec["max_turns"]}
    params = bench_params({**spec, "overrides": over})
    data, tmp = Path(spec["data_dir"]), Path(spec["tmp"])
    summary = train_rl(
        params, init_model=Path(spec["model"]), index_path=Path(spec["index"]),
        train_questions=pd.read_parquet(data / "train.parquet").to_dict("records"),
        eval_questions=pd.read_parquet(data / "test.parquet").head(1).to_dict("records"),
        out_model=tmp / "out", checkpoint_dir=tmp / "ckpt", live_dir=tmp / "live",
    )  # fmt: skip
    if not is_rank0():
        return None
    steps_rows = read_live(tmp / "live")
    return {"world": world, "threads_per_rank": torch.get_num_threads(), "steps": steps_rows,
            "trajectories_per_step": q * n, "last": summary["last"],
            "algorithm": params.algorithm.name, "kl_coef": params.algorithm.kl_coef,
            "max_new_tokens": params.rollout.max_new_tokens, "max_turns": params.env.max_turns}  # fmt: skip


def format_ranks(rows: list[dict]) -> str:
    lines = ["\n== RL steps: time split (seconds; dvclive time/*, mean over ranks) ==",
             f"{'ranks':>5}{'threads':>8}{'step':>5}{'tokens':>8}{'rollout':>9}{'logprobs':>9}{'update':>8}"
             f"{'other':>7}{'step':>7}{'update tok/s':>13}"]  # fmt: skip
    for r in rows:
        if "steps" not in r:
            lines.append(f"{r['ranks']:>5}  {'killed' if 'killed_above_mib' in r else 'failed'}")
            continue
        for s in r["steps"]:
            roll, lp, upd, step = (s.get(f"time/{k}_s", float("nan")) for k in ("rollout", "logprobs", "update", "step"))
            tokens = s.get("train/tokens", float("nan")) * r["world"]  # per-rank mean -> global
            lines.append(f"{r['world']:>5}{r['threads_per_rank']:>8}{s['step'] + 1:>5}{tokens:>8.0f}{roll:>9.1f}"
                         f"{lp:>9.1f}{upd:>8.1f}{step - roll - lp - upd:>7.1f}{step:>7.1f}{tokens / upd:>13.1f}")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    worker_main(worker_rl, __doc__)
