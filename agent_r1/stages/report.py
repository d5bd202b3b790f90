"""report stage: reports/results.md (Table-3-shaped) and its charts; for the paper presets
(paper/dvc.yaml), paper/reports/results.md with the ablation table (Table-4-shaped) too."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

from agent_r1 import paths
from agent_r1.config import Params, experiment_params
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
    curve_end: Path | None = None,
    notes: Path | None = None,
) -> None:
    """The results of ``eval_dir`` (the baselines and the warm start from ``baselines`` when
    given: the paper presets' report reads them from the default pipeline's metrics/eval);
    with ``curve_live`` (a long run's dvclive folder), its learning curve as ``curve_png``, from
    the starting model's validation metrics ``curve_start`` and the trained one's ``curve_end``
    when given; ``notes`` (markdown written by hand: what the runs can and cannot show) last."""
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
        budgets = {name: experiment_params(params, name).train.steps for name in params.experiments}
        extra = (*learning_curve_section(curve_live, curve_png, curve_start, curve_end, budgets), *extra)
    if notes is not None:
        extra = (*extra, notes.read_text(encoding="utf-8").strip())
    methods = [*BASELINE_ORDER, *params.experiments]
    text = write_report(
        eval_dir, in_domain, out, chart, extra,
        baseline_dir=baselines,
        experiments=params.experiments,
        ablation_png=ablations,
        warm_start=params.sft.enabled,
        outcomes=load_outcomes(outcomes, methods, baseline_outcomes, run_seeds(params.experiments)),
        stateful=params.env.name is not None,
    )
    print(text)


def outcomes_beside(metrics: Path) -> Path:
    """Where paper/dvc.yaml has an evaluation of the curve write its per-question outcomes:
    ``X.json`` -> ``X.outcomes.jsonl``."""
    return metrics.with_name(f"{metrics.stem}.outcomes.jsonl")


def curve_budget_line(points: list[tuple[int, float]], n: int, steps_by_preset: dict[str, int]) -> str:
    """The budget the one-SE rule reads off the curve, beside the one most presets train
    (``budget.steps``), and the presets that train a budget of their own."""
    from agent_r1.evaluation.report import budget_by_rule

    step, best, se = budget_by_rule(points, n)
    at = min(s for s, em in points if em == best)
    line = (f"Budget rule (the earliest eval within one standard error of the best): best validation EM "
            f"{best:.3f} at step {at}, SE {se:.3f} (n = {n}), so **{step} steps**. ")
    if not steps_by_preset:
        return line
    shared = Counter(steps_by_preset.values()).most_common(1)[0][0]
    own = ", ".join(f"`{name}` {steps}" for name, steps in steps_by_preset.items() if steps != shared)
    tail = f" Presets with a budget of their own (steps): {own}." if own else ""
    if shared == step:
        return line + f"The presets train `budget.steps` = {step}." + tail
    if shared < step:
        return line + (f"The presets train `budget.steps` = {shared}, fewer than the rule's {step}: a cap on what "
                       "the whole set costs (`budget` in the presets file says why) or a budget to re-choose.") + tail
    return line + f"The presets train {shared} steps, more than the rule's {step}: re-choose `budget.steps`." + tail


def curve_paired_lines(start: Path, end: Path) -> list[str]:
    """The curve's trained policy (re-scored after export) against its starting model, question by
    question on the same validation questions: the paired difference, and EM by question type."""
    from agent_r1.evaluation.paired import describe, paired_em
    from agent_r1.io import read_jsonl

    before, after = read_jsonl(outcomes_beside(start)), read_jsonl(outcomes_beside(end))
    delta, p = describe(paired_em(after, before))
    first, last = json.loads(start.read_text()), json.loads(end.read_text())
    types = ", ".join(f"{t} {first['by_type'][t]['em']:.2f} -> {last['by_type'][t]['em']:.2f} (n {v['n']})"
                      for t, v in sorted(last["by_type"].items()) if t in first["by_type"])
    return [f"Trained (end of the curve, exported and re-scored: EM {last['em']:.3f}) minus the starting model "
            f"(EM {first['em']:.3f}) on the same {last['n']} validation questions: Δ EM {delta}; "
            f"in parentheses, the questions only it / only the start got right; McNemar's exact p = {p}.",
            f"By question type: {types}."]


def learning_curve_section(
    live: Path, png: Path, start: Path | None = None, end: Path | None = None,
    steps_by_preset: dict[str, int] | None = None,
) -> tuple[str, ...]:
    """The report's learning-curve section: the plot and its validation EMs (step 0: ``start``,
    the starting model's validation metrics), the step budget the one-SE rule picks on it
    against ``steps_by_preset`` (the steps each preset trains), and, with ``end`` (the trained
    policy's validation metrics), the paired trained-vs-start comparison."""
    from agent_r1.evaluation.report import learning_curve

    first = json.loads(start.read_text()) if start is not None else {}
    points = learning_curve(live, png, first.get("em"), first.get("n"))
    lines = [f"step {s}: validation EM {v:.3f}" + (" (the starting model)" if s == 0 else "") for s, v in points]
    section = ["## Learning curve (validation split)", f"![learning curve]({png.name})",
               "One long run of the curve's preset from the warm start, scored on the validation split (never "
               "the test split); the presets' step budget (`budget.steps`) is chosen on it.",
               "\n".join(f"- {line}" for line in lines) or "(no validation evals logged yet)"]
    if points and first:
        section.append(curve_budget_line(points, first["n"], steps_by_preset or {}))
    if start is not None and end is not None and end.exists():
        section.extend(curve_paired_lines(start, end))
    return tuple(section)


if __name__ == "__main__":
    run_stage("report", report)
