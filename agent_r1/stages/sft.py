"""sft stage: the warm start (scripted expert demonstrations -> masked NLL on DeepSpeed)."""

from __future__ import annotations

import logging

from agent_r1 import paths
from agent_r1.config import Params
from agent_r1.io import write_json
from agent_r1.stages.common import run_stage

log = logging.getLogger(__name__)


def sft(params: Params) -> None:
    from agent_r1.data.schema import read_questions
    from agent_r1.io import atomic_dir

    if not params.sft.enabled:
        # Experiments that start from the warm start then start from the base model itself.
        log.info("sft.enabled is false: the warm start is the base model")
        import shutil

        with atomic_dir(paths.SFT_MODEL) as tmp:
            shutil.copytree(paths.POLICY_DIR, tmp, dirs_exist_ok=True)
        write_json(paths.SFT_METRICS, {"enabled": False})
        return

    from agent_r1.retrieval import check_index
    from agent_r1.training.sft import train_sft

    location = paths.index_location(params.retrieval.index)
    check_index(location)
    env_params = params.model_copy(update={"env": params.env.model_copy(update={"one_shot": params.sft.one_shot})})
    train = read_questions(paths.TRAIN_QUESTIONS).to_dict("records")
    summary = train_sft(
        env_params,
        init_model=paths.POLICY_DIR,
        index_path=location,
        train_questions=train,
        out_model=paths.SFT_MODEL,
    )
    write_json(paths.SFT_METRICS, {"enabled": True, **summary})


if __name__ == "__main__":
    run_stage("sft", sft)
