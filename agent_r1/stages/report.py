"""report stage: reports/results.md (Table-3-shaped) and its charts; with ``--presets``,
paper/reports/results.md with the ablation table (Table-4-shaped) too."""

from __future__ import annotations

import logging
from pathlib import Path

from agent_r1 import paths
from agent_r1.config import Params
from agent_r1.stages.common import run_stage

log = logging.getLogger(__name__)


def report(params: Params) -> None:
    from agent_r1.data.schema import read_questions
    from agent_r1.evaluation.report import training_curves, write_report

    # In-domain = the sources the policy trains on; every other test source is out-of-domain.
    in_domain = sorted(read_questions(paths.TRAIN_QUESTIONS)["source"].unique())
    curves = training_curves(paths.LIVE_DIR, paths.TRAINING_PNG, tuple(params.experiments))
    extra = ()
    if curves:
        extra = (
            "## Training curves",
            f"![training curves]({paths.TRAINING_PNG.name})",
            f"Experiments: {', '.join(curves)}. Per-step values live in `dvclive/<experiment>/`; "
            "compare runs with `dvc plots diff`.",
        )
    presets = paths.EXPERIMENT_ROOT != Path(".")  # paper/: baselines and the warm start come from metrics/eval
    text = write_report(
        paths.EVAL_METRICS_DIR, in_domain, paths.RESULTS_MD, paths.RESULTS_PNG, extra,
        baseline_dir=paths.BASELINE_METRICS_DIR if presets else None,
        experiments=params.experiments,
        ablation_png=paths.RESULTS_MD.parent / "ablations.png",
        warm_start=params.sft.enabled,
    )
    print(text)


if __name__ == "__main__":
    run_stage("report", report)
