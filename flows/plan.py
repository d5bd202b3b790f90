"""What `make paper` is about to run, and about how long it will take, before it starts.

DVC says which stages of paper/dvc.yaml are not up to date; each run's time is
estimated from the runs already measured (``seconds`` in paper/metrics/train/ and
paper/metrics/eval/, written by the train and evaluate stages): the same preset's
seconds per RL step if it has run before, else the mean over every measured run,
times the steps it is set to, plus an evaluation.

    python -m flows.plan          # print the plan of paper/dvc.yaml (runs nothing)
"""

from __future__ import annotations

import json
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

from agent_r1.paths import split_seeded
from tasks.dvc_stage import dvc_command, pipeline_stages, training_target

PAPER_DIR = Path("paper")


@dataclass(frozen=True)
class Planned:
    stage: str
    steps: int  # RL steps it trains (0: no training)
    seconds: float | None  # None: nothing measured to estimate from


def stale_stages(repo: Path, dvcfile: str) -> list[str]:
    """The stages of ``dvcfile`` that `dvc repro` would run (DVC's own status), in file order."""
    proc = subprocess.run([*dvc_command(), "status", dvcfile, "--json"], cwd=repo, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"dvc status {dvcfile} failed: {proc.stderr.strip()}")
    changed = set(json.loads(proc.stdout or "{}"))
    return [s for s in pipeline_stages(str(repo), dvcfile) if s in changed]


def measured(folder: Path) -> dict[str, list[dict]]:
    """Preset -> the metrics of its measured runs (files with ``seconds``, or a training run's
    last step time) in ``folder``."""
    out: dict[str, list[dict]] = {}
    for f in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        data = json.loads(f.read_text())
        if isinstance(data, dict) and ("seconds" in data or "time/step_s" in data.get("last", {})):
            out.setdefault(split_seeded(f.stem)[0], []).append(data)
    return out


def per_step(runs: list[dict]) -> list[float]:
    """Seconds per RL step of each training run: its whole time over its steps, or (a run from
    before the stages timed themselves) its last step's time."""
    return [r["seconds"] / max(r["steps"] - r.get("start_step", 0), 1) if "seconds" in r else r["last"]["time/step_s"]
            for r in runs if r.get("steps")]


def estimate(preset: str, steps: int, train: dict[str, list[dict]], evals: dict[str, list[dict]]) -> float | None:
    """Seconds to train ``preset`` for ``steps`` and evaluate it (None: no run measured yet)."""
    step_s = per_step(train.get(preset, [])) or [x for runs in train.values() for x in per_step(runs)]
    eval_s = [r["seconds"] for r in evals.get(preset, []) if "seconds" in r] or [
        r["seconds"] for rs in evals.values() for r in rs if "seconds" in r]
    if not step_s:
        return None
    return steps * statistics.fmean(step_s) + (statistics.fmean(eval_s) if eval_s else 0.0)


def paper_plan(repo: Path = Path(".")) -> list[Planned]:
    """Each stale stage of paper/dvc.yaml with its steps and estimated seconds."""
    root = repo / PAPER_DIR
    train, evals = measured(root / "metrics" / "train"), measured(root / "metrics" / "eval")
    plan = []
    for stage in stale_stages(repo, str(PAPER_DIR / "dvc.yaml")):
        target = training_target(stage, repo)
        if target is None:
            plan.append(Planned(stage, 0, 0.0))
        else:  # the curve scores the validation split in-loop, not the test split at the end
            runs_eval = {} if target.live.name == "curve" else evals
            plan.append(Planned(stage, target.steps, estimate(target.preset, target.steps, train, runs_eval)))
    return plan


def describe(plan: list[Planned]) -> str:
    """The plan as the lines `make paper` prints."""
    if not plan:
        return "paper/dvc.yaml: every stage is up to date; nothing to run."
    lines = [f"paper/dvc.yaml: {len(plan)} stage(s) to run"]
    for p in plan:
        when = "not measured yet" if p.seconds is None else f"~{p.seconds / 60:.0f} min"
        lines.append(f"  {p.stage:<45} {p.steps:>4} RL steps  {when}")
    known = [p.seconds for p in plan if p.seconds is not None]
    unknown = sum(p.seconds is None for p in plan)
    total = f"~{sum(known) / 3600:.1f} h estimated" + (f", plus {unknown} run(s) not measured yet" if unknown else "")
    return "\n".join([*lines, f"  total: {total} (2 CPU cores; README, 'The paper's experiments')"])


if __name__ == "__main__":
    print(describe(paper_plan()))
