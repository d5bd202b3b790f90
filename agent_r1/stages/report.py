"""report stage: reports/results.md (Table-3-shaped) and its charts; for the paper presets
(paper/dvc.yaml), paper/reports/results.md with the ablation table (Table-4-shaped) too."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from agent_r1 import paths
from agent_r1.config import Params
from agent_r1.stages.common import run_stage

log = logging.getLogger(__name__)


def report(
    params: Params,
    *,
    train_questions: Path = paths.TRAIN_QUESTIONS,
    eval_dir: Path = paths.EVAL_METRICS_DIR,
    baselines: Path | None = None,
    live: Path = paths.LIVE_DIR,
    out: Path = paths.RESULTS_MD,
    chart: Path = paths.RESULTS_PNG,
    curves: Path = paths.TRAINING_PNG,
    ablations: Path = paths.ABLATIONS_PNG,
    outcomes: Path = paths.OUTCOMES_DIR,
    baseline_outcomes: Path | None = None,
    curve_live: Path | None = None,
    curve_png: Path | None = None,
    curve_start: Path | None = None,
) -> None:
    """The results of ``eval_dir`` (the baselines and the warm start from ``baselines`` when
    given: the paper presets' report reads them from the default pipeline's metrics/eval);
    with ``curve_live`` (a long run's dvclive folder), its learning curve as ``curve_png``, from
    the starting model's validation metrics ``curve_start`` when given."""
    from agent_r1.data.schema import read_questions
    from agent_r1.evaluation.report import BASELINE_ORDER, load_outcomes, training_curves, write_report
    from agent_r1.evaluation.runs import run_seeds

    # In-domain = the sources the policy trains on; every other test source is out-of-domain.
    in_domain = sorted(read_questions(train_questions)["source"].unique())
    shown = training_curves(live, curves, tuple(params.experiments))
    extra = ()
    if shown:
        extra = (
            "## Training curves",
            f"![training curves]({curves.name})",
            f"Experiments: {', '.join(shown)}. Per-step values live in `dvclive/<experiment>/`; "
            "compare runs with `dvc plots diff`.",
        )
    if curve_live is not None and curve_png is not None:
        extra = (*learning_curve_section(curve_live, curve_png, curve_start), *extra)
    methods = [*BASELINE_ORDER, *params.experiments]
    text = write_report(
        eval_dir, in_domain, out, chart, extra,
        baseline_dir=baselines,
        experiments=params.experiments,
        ablation_png=ablations,
        warm_start=params.sft.enabled,
        outcomes=load_outcomes(outcomes, methods, baseline_outcomes, run_seeds(params.experiments)),
    )
    print(text)


def learning_curve_section(live: Path, png: Path, start: Path | None = None) -> tuple[str, ...]:
    """The report's learning-curve section: the plot and its validation EMs (step 0: ``start``,
    the starting model's validation metrics, when given)."""
    from agent_r1.evaluation.report import learning_curve

    start_em = json.loads(start.read_text())["em"] if start is not None else None
    lines = learning_curve(live, png, start_em)
    return ("## Learning curve (validation split)", f"![learning curve]({png.name})",
            "One long run of the curve's preset from the warm start, scored on the validation split (never "
            "the test split); the presets' step budget (`overrides.train.steps`) is chosen on it.",
            "\n".join(f"- {line}" for line in lines) or "(no validation evals logged yet)")


if __name__ == "__main__":
    run_stage("report", report)
