"""train@<experiment> stage: RL on DeepSpeed from the warm start (or the base model).

With ``train.num_procs > 1`` the stage re-launches itself under the
``deepspeed`` launcher, one rank per process, on this machine or over the hosts
of ``train.hostfile`` (:mod:`agent_r1.launch`); rollouts are split over ranks
with whole groups kept together.
"""

from __future__ import annotations

import logging
import os
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn

from agent_r1 import paths
from agent_r1.accelerator import select_accelerator
from agent_r1.config import Params, TrainConfig, experiment_params
from agent_r1.io import write_json
from agent_r1.launch import launch_command
from agent_r1.stages.common import checked_index, run_stage

log = logging.getLogger(__name__)


def stage_launch_command(cfg: TrainConfig) -> list[str]:
    """This stage again, with the same arguments (--experiment, --presets, paths...), as ``cfg.num_procs``
    ranks. Reads and checks ``train.hostfile``: ValueError naming the key."""
    from agent_r1.training.distributed import free_port

    return launch_command(cfg, Path(__file__).resolve(), sys.argv[1:], free_port())


def relaunch_under_deepspeed(cmd: list[str]) -> NoReturn:
    """Run the launcher; this process only waits for the ranks and exits with their status."""
    log.info("launching: %s", shlex.join(cmd))
    select_accelerator()  # the launcher imports deepspeed, and its ranks inherit this environment
    sys.exit(subprocess.call(cmd))


def train(
    params: Params,
    experiment: str,
    *,
    policy: Path = paths.POLICY_DIR,
    sft: Path = paths.SFT_MODEL,
    indexes: Path = paths.INDEX_DIR,
    train_questions: Path = paths.TRAIN_QUESTIONS,
    val_questions: Path = paths.VAL_QUESTIONS,
    out: Path | None = None,
    checkpoints: Path | None = None,
    live: Path | None = None,
    metrics: Path | None = None,
) -> None:
    """RL from ``sft`` or ``policy`` (the experiment's ``init``), its in-training evals on the validation
    split (never the test split). The per-experiment outputs default to
    <models/trained|checkpoints|dvclive>/<experiment> and metrics/train/<experiment>.json."""
    from agent_r1.data.schema import read_questions

    exp = params.experiments[experiment]
    p = experiment_params(params, experiment)
    launcher = None
    if p.train.num_procs > 1 and "LOCAL_RANK" not in os.environ:  # the stage, not one of its ranks
        launcher = stage_launch_command(p.train)  # a bad hostfile fails first, before any other work
    location = checked_index(p, indexes)  # before launching ranks or loading a model
    val = read_questions(val_questions)
    if val.empty:
        raise ValueError(f"{val_questions} holds no questions (data.val_questions is 0): the in-training evals "
                         "need a validation split; set data.val_questions >= 1 and re-run prepare")
    if launcher is not None:
        relaunch_under_deepspeed(launcher)

    from agent_r1.evaluation.greedy import validation_questions
    from agent_r1.training.distributed import is_rank0, shutdown_distributed
    from agent_r1.training.loop import train_rl

    init = sft if exp.init == "sft" else policy
    started = time.monotonic()
    summary = train_rl(
        p,
        init_model=init,
        index_path=location,
        train_questions=read_questions(train_questions).to_dict("records"),
        eval_questions=validation_questions(val, p.train.eval_questions, p.eval.seed),
        out_model=out or paths.TRAINED_DIR / experiment,
        checkpoint_dir=checkpoints or paths.CHECKPOINT_DIR / experiment,
        live_dir=live or paths.LIVE_DIR / experiment,
    )
    if is_rank0():
        # seconds (of this process: a resumed run's last part) is what `make paper` estimates from
        summary["seconds"] = round(time.monotonic() - started, 1)
        # this rank's peak resident memory (the process's high-water mark, KiB on Linux)
        summary["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20), 2)
        write_json(metrics or paths.TRAIN_METRICS_DIR / f"{experiment}.json", {"experiment": experiment, "init": exp.init, **summary})
    shutdown_distributed()


if __name__ == "__main__":
    run_stage("train", train, experiment_arg=True)
