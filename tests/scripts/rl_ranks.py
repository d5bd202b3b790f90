"""One real RL run (train_rl: rollouts, updates, weight sync, checkpoints) in each
rank launched by ``deepspeed``; driven by tests/test_trainer.py."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from agent_r1.config import Params
from agent_r1.training.distributed import shutdown_distributed
from agent_r1.training.loop import train_rl


def main() -> None:
    ap = argparse.ArgumentParser()
    for flag in ("--params", "--policy", "--index", "--questions", "--out"):
        ap.add_argument(flag, required=True)
    ap.add_argument("--local_rank", type=int, default=0)  # the deepspeed launcher passes it
    args = ap.parse_args()
    params = Params.model_validate_json(Path(args.params).read_text())
    questions = pd.read_parquet(args.questions)
    out = Path(args.out)
    summary = train_rl(
        params, init_model=Path(args.policy), index_path=Path(args.index),
        train_questions=questions[questions["split"] == "train"].to_dict("records"),
        eval_questions=questions[questions["split"] == "test"].to_dict("records")[:2],
        out_model=out / "model", checkpoint_dir=out / "ckpt", live_dir=out / "live",
    )
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    (out / f"summary_rank{rank}.json").write_text(json.dumps(summary, default=str))
    shutdown_distributed()


if __name__ == "__main__":
    main()
