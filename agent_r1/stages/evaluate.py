"""evaluate stage: greedy held-out EM/F1 of a trained policy (or of the warm start).

    python -m agent_r1.stages.evaluate --experiment grpo   # models/trained/grpo
    python -m agent_r1.stages.evaluate --experiment sft    # the warm start itself

With ``--val-questions`` it scores the in-training evals' questions of that validation split
instead (paper/dvc.yaml's curve_start: the learning curve's step 0).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from agent_r1 import paths
from agent_r1.config import Params, experiment_params
from agent_r1.io import write_json
from agent_r1.stages.common import checked_index, run_stage

log = logging.getLogger(__name__)

SFT = "sft"  # the warm start's own row in the results table


def evaluate(
    params: Params,
    experiment: str,
    *,
    model: Path | None = None,
    indexes: Path = paths.INDEX_DIR,
    test_questions: Path = paths.TEST_QUESTIONS,
    metrics: Path | None = None,
    outcomes: Path | None = None,
    val_questions: Path | None = None,
) -> None:
    """``model`` (default: the experiment's trained policy, or the warm start) scored into
    ``metrics`` (default: <metrics/eval>/<experiment>.json), its per-question results into
    ``outcomes`` (default: <outcomes>/<experiment>.jsonl). With ``val_questions``, the questions
    are the ones a training run's in-training evals score (train.eval_questions of that
    validation split), not ``test_questions``' eval.questions_per_source."""
    from agent_r1.data.schema import read_questions
    from agent_r1.evaluation.greedy import play_policy, select_questions, validation_questions
    from agent_r1.evaluation.summary import summarize_episodes, write_outcomes
    from agent_r1.retrieval import load_index

    if experiment == SFT:
        p = params.model_copy(update={"env": params.env.model_copy(update={"one_shot": params.sft.one_shot})})
        model = model or paths.SFT_MODEL
    else:
        p, model = experiment_params(params, experiment), model or paths.TRAINED_DIR / experiment
    location = checked_index(p, indexes)
    if val_questions is not None:
        records = validation_questions(read_questions(val_questions), p.train.eval_questions, p.eval.seed)
    else:
        records = select_questions(read_questions(test_questions), p.eval.questions_per_source, p.eval.seed)
    started = time.monotonic()
    infos = play_policy(model, load_index(location) if location is not None else None, records, p, experiment)
    result = {**summarize_episodes(infos, experiment), "seconds": round(time.monotonic() - started, 1)}
    write_json(metrics or paths.EVAL_METRICS_DIR / f"{experiment}.json", result)
    write_outcomes(outcomes or paths.OUTCOMES_DIR / f"{experiment}.jsonl", infos)
    log.info("%s: EM %.4f F1 %.4f answer rate %.3f", experiment, result["em"], result["f1"], result["answer_rate"])


if __name__ == "__main__":
    run_stage("evaluate", evaluate, experiment_arg=True, extra_experiments=(SFT,))
