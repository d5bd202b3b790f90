"""sft stage: the warm start (scripted expert demonstrations -> masked NLL on DeepSpeed)."""

from __future__ import annotations

import logging
from pathlib import Path

from agent_r1 import paths
from agent_r1.config import Params
from agent_r1.io import write_json
from agent_r1.stages.common import checked_index, run_stage

log = logging.getLogger(__name__)


def sft(
    params: Params,
    *,
    policy: Path = paths.POLICY_DIR,
    indexes: Path = paths.INDEX_DIR,
    train_questions: Path = paths.TRAIN_QUESTIONS,
    out: Path = paths.SFT_MODEL,
    metrics: Path = paths.SFT_METRICS,
) -> None:
    from agent_r1.data.schema import read_questions
    from agent_r1.io import atomic_dir

    if not params.sft.enabled:
        # Experiments that start from the warm start then start from the base model itself.
        log.info("sft.enabled is false: the warm start is the base model")
        import shutil

        with atomic_dir(out) as tmp:
            shutil.copytree(policy, tmp, dirs_exist_ok=True)
        write_json(metrics, {"enabled": False})
        return

    from agent_r1.training.sft import train_sft

    location = checked_index(params, indexes)
    env_params = params.model_copy(update={"env": params.env.model_copy(update={"one_shot": params.sft.one_shot})})
    train = read_questions(train_questions).to_dict("records")
    summary = train_sft(
        env_params,
        init_model=policy,
        index_path=location,
        train_questions=train,
        out_model=out,
    )
    write_json(metrics, {"enabled": True, **summary})


if __name__ == "__main__":
    run_stage("sft", sft, portable_numerics=True)  # downstream is keyed on its bytes
