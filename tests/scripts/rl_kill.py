"""One real RL run (train_rl on a tiny policy) in this process, optionally SIGKILLing
itself at an exact point; driven by tests/test_trainer.py's kill/resume tests.

``--kill`` picks the point, in step ``--kill-step`` (1-based):

* ``rollout``: during the step's rollout, in the middle of generating (at the
  fifth sampled token);
* ``save``: in the middle of DeepSpeed writing the step's checkpoint (at its
  second ``torch.save``: some files of the tag are written, others not);
* ``publish``: after every file of the step's checkpoint is written, just before
  ``latest.json`` points at it;
* ``export``: after the last step's checkpoint is published, before the policy
  is exported (``--kill-step`` is not used).

Without ``--kill`` the run ends normally and writes ``summary.json`` to ``--out``.
Nothing in the library knows about these faults: they are monkeypatched here.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from agent_r1.config import Params
from agent_r1.rollout import continuous, transformers_engine  # the decoding loops that sample
from agent_r1.training import checkpoint, loop

STATE: dict[str, Any] = {"step": 0, "saving": None, "samples": 0, "saves": 0}


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(kill: str, kill_step: int, resumes_at: int) -> None:
    """Wrap the functions around the kill point; ``kill_step`` is 1-based. The step of a
    rollout is counted from ``resumes_at``, the checkpoint the run starts from."""
    import agent_r1.rollout

    run_episodes, save_checkpoint, export_hf = agent_r1.rollout.run_episodes, loop.save_checkpoint, loop.export_hf
    sample_tokens, torch_save, write_json = transformers_engine.sample_tokens, torch.save, checkpoint.write_json
    STATE["step"] = resumes_at

    def playing(*args, greedy: bool = False, **kwargs):
        if not greedy:  # a training rollout; the held-out evaluation is greedy
            STATE["step"] += 1
        return run_episodes(*args, greedy=greedy, **kwargs)

    def saving(engines, root, step, *args, **kwargs):
        STATE["saving"] = step
        save_checkpoint(engines, root, step, *args, **kwargs)
        STATE["saving"] = None

    def sampling(*args, **kwargs):
        if kill == "rollout" and STATE["step"] == kill_step:
            STATE["samples"] += 1
            if STATE["samples"] == 5:
                die()
        return sample_tokens(*args, **kwargs)

    def torch_saving(*args, **kwargs):
        if kill == "save" and STATE["saving"] == kill_step:
            STATE["saves"] += 1
            if STATE["saves"] == 2:
                die()
        return torch_save(*args, **kwargs)

    def publishing(path, obj):
        if kill == "publish" and Path(path).name == checkpoint.LATEST and obj.get("step") == kill_step:
            die()
        return write_json(path, obj)

    def exporting(*args, **kwargs):
        if kill == "export":
            die()
        return export_hf(*args, **kwargs)

    agent_r1.rollout.run_episodes, loop.save_checkpoint, loop.export_hf = playing, saving, exporting
    transformers_engine.sample_tokens = continuous.sample_tokens = sampling  # each loop looks up its own name
    torch.save, checkpoint.write_json = torch_saving, publishing


def main() -> None:
    ap = argparse.ArgumentParser()
    for flag in ("--params", "--policy", "--index", "--questions", "--out"):
        ap.add_argument(flag, required=True)
    ap.add_argument("--kill", choices=("rollout", "save", "publish", "export"), default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (as the run compared with)")
    ap.add_argument("--kill-step", type=int, default=2)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.threads is not None:  # float reductions depend on the thread count
        torch.set_num_threads(args.threads)
    params = Params.model_validate_json(Path(args.params).read_text())
    questions = pd.read_parquet(args.questions)
    out = Path(args.out)
    if args.kill is not None:
        latest = checkpoint.read_latest(out / "ckpt")
        arm(args.kill, args.kill_step, resumes_at=0 if latest is None else int(latest["step"]))
    summary = loop.train_rl(
        params, init_model=Path(args.policy), index_path=Path(args.index),
        train_questions=questions[questions["split"] == "train"].to_dict("records"),
        eval_questions=questions[questions["split"] == "test"].to_dict("records")[:2],
        out_model=out / "model", checkpoint_dir=out / "ckpt", live_dir=out / "live",
    )
    (out / "summary.json").write_text(json.dumps(summary, default=str))


if __name__ == "__main__":
    main()
