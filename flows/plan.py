"""What `make paper` is about to run, and about how long it will take, before it starts.

DVC says which stages of paper/dvc.yaml are not up to date; each run's time is
estimated from the runs already measured (``seconds`` in paper/metrics/train/ and
paper/metrics/eval/, and the default pipeline's metrics/train/ and metrics/eval/,
written by the train and evaluate stages; a paper run whose stage is itself out of date,
for anything but the warm start, measured other params or code and is left out): the same preset's seconds per trajectory of
an RL step if it has run before, else those of measured runs of its kind (algorithm,
representation, LoRA or not), else of its algorithm's, else of every measured run, times the trajectories it
trains (steps x questions per step x samples), plus the questions it scores (the test
set; the curve's validation evaluations) at the measured seconds per question. The stages
already up to date count at the seconds they recorded, so the plan also says what the whole
set costs.

    python -m flows.plan          # print the plan of paper/dvc.yaml (runs nothing)
"""

from __future__ import annotations

import json
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from agent_r1.config import LearningCurveConfig, Params, experiment_params, load_params, read_presets, with_presets
from agent_r1.paths import split_seeded
from tasks.dvc_stage import dvc_command, pipeline_stages, training_target

PAPER_DIR = Path("paper")


# The warm start's bytes are made the same on every CPU, but a machine that still differs (other library
# versions, a CPU model not yet checked) marks every run keyed on it out of date (README, "Results that travel
# between machines")
WARM_START = "models/sft"


@dataclass(frozen=True)
class Planned:
    stage: str
    steps: int  # RL steps it trains (0: no training)
    seconds: float | None  # None: nothing measured to estimate from
    basis: str = ""  # what the time per step was taken from (Measurements.estimate)
    warm_start_only: bool = False  # out of date only because the warm start has other bytes than the lock's
    done: bool = False  # up to date: ``seconds`` is what it recorded when it ran, on the machine that ran it


def dvc_status(repo: Path, dvcfile: str) -> dict[str, list]:
    """DVC's status of ``dvcfile``: stage -> what changed."""
    proc = subprocess.run([*dvc_command(), "status", dvcfile, "--json"], cwd=repo, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"dvc status {dvcfile} failed: {proc.stderr.strip()}")
    return json.loads(proc.stdout or "{}")


def only_the_warm_start_changed(changes: list) -> bool:
    """A stage's status entries say nothing changed but the warm start (a modified dependency)."""
    return changes == [{"changed deps": {WARM_START: "modified"}}]


def measured(folder: Path, skip: frozenset[str] = frozenset()) -> dict[str, list[dict]]:
    """Preset -> the metrics of its measured runs (files with ``seconds``, or a training run's
    last step time) in ``folder``, but for the runs named in ``skip`` (file stems)."""
    out: dict[str, list[dict]] = {}
    for f in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        if f.stem in skip:
            continue
        data = json.loads(f.read_text())
        if isinstance(data, dict) and ("seconds" in data or "time/step_s" in data.get("last", {})):
            out.setdefault(split_seeded(f.stem)[0], []).append(data)
    return out


def per_step(runs: list[dict]) -> list[float]:
    """Seconds per RL step of each training run: its whole time over its steps, or (a run from
    before the stages timed themselves) its last step's time."""
    return [r["seconds"] / max(r["steps"] - r.get("start_step", 0), 1) if "seconds" in r else r["last"]["time/step_s"]
            for r in runs if r.get("steps")]


def trajectories_per_step(params: Params, name: str) -> int:
    """Trajectories experiment ``name`` rolls out and trains on each RL step."""
    p = experiment_params(params, name)
    return p.train.questions_per_step * p.rollout.n


def kind_of(params: Params, name: str) -> tuple[str, str, bool]:
    """What sets an experiment's cost per step: its algorithm (a critic doubles the update),
    representation, and whether it trains LoRA adapters."""
    p = experiment_params(params, name)
    return p.algorithm.name, p.algorithm.representation, p.train.lora is not None


@dataclass
class Measurements:
    """Seconds per trajectory of an RL step by experiment and by kind (:func:`kind_of`), and
    seconds per evaluated question, from the paper's runs and the default pipeline's."""

    trajectory_s: dict[str, list[float]]
    kind_trajectory_s: dict[tuple[str, str, bool], list[float]]
    question_s: list[float]
    questions: int  # the test set's size, as last evaluated

    @classmethod
    def read(cls, repo: Path, paper: Params, default: Params,
             outdated: frozenset[str] = frozenset()) -> "Measurements":
        """``outdated``: the paper runs (file stems) whose measurements no longer hold."""
        trajectory_s: dict[str, list[float]] = {}
        kind_trajectory_s: dict[tuple[str, str, bool], list[float]] = {}
        sources = ((repo / PAPER_DIR / "metrics" / "train", paper, outdated),
                   (repo / "metrics" / "train", default, frozenset()))
        for folder, params, skip in sources:
            for name, runs in measured(folder, skip).items():
                if name not in params.experiments:
                    continue
                rates = [s / trajectories_per_step(params, name) for s in per_step(runs)]
                if params is paper:
                    trajectory_s.setdefault(name, []).extend(rates)
                kind_trajectory_s.setdefault(kind_of(params, name), []).extend(rates)
        evals = [r for folder, skip in ((repo / PAPER_DIR / "metrics" / "eval", outdated),
                                        (repo / "metrics" / "eval", frozenset()))
                 for runs in measured(folder, skip).values() for r in runs if r.get("n") and "seconds" in r]
        return cls(trajectory_s, kind_trajectory_s, [r["seconds"] / r["n"] for r in evals],
                   max((r["n"] for r in evals), default=0))

    def estimate(self, name: str, kind: tuple[str, str, bool], trajectories: int,
                 questions: int) -> tuple[float | None, str]:
        """Seconds to train on ``trajectories`` (steps x trajectories a step) and score
        ``questions``; and what the time per trajectory was taken from: the run's own preset,
        runs of its kind, runs of its algorithm (a step-level or LoRA run costs about what the
        flat full-parameter one of its algorithm does; a critic roughly doubles it), or every run."""
        same_algorithm = [x for k, v in self.kind_trajectory_s.items() if k[0] == kind[0] for x in v]
        for rates, basis in ((self.trajectory_s.get(name), "its own runs"),
                             (self.kind_trajectory_s.get(kind), "its kind"),
                             (same_algorithm, "its algorithm"),
                             ([x for v in self.kind_trajectory_s.values() for x in v], "all runs")):
            if rates:
                eval_s = statistics.fmean(self.question_s) * questions if self.question_s else 0.0
                return trajectories * statistics.fmean(rates) + eval_s, basis
        return None, "nothing measured"


def questions_scored(curve: LearningCurveConfig | None, test_questions: int) -> int:
    """The questions a run scores: the test set once; the curve (``curve``, None for any other
    run), its validation questions at step 0 (curve_start), at every ``eval_every`` and once
    more at the end (re-scored)."""
    if curve is None:
        return test_questions
    return (curve.steps // curve.eval_every + 2) * curve.eval_questions


def outdated_runs(repo: Path, stale: list[str], status: dict[str, list]) -> frozenset[str]:
    """The runs (metrics file stems) of the ``stale`` stages out of date for more than the
    warm start: what they measured was trained with other params or code (another budget,
    say), and the machine it ran on may not be this one."""
    targets = (training_target(s, repo) for s in stale if not only_the_warm_start_changed(status[s]))
    return frozenset(t.live.name for t in targets if t is not None)


def locked_outputs(repo: Path, dvcfile: str) -> dict[str, list[Path]]:
    """Stage (as :func:`pipeline_stages` names it) -> the outputs ``dvcfile``'s lock lists for it."""
    lock_file = (repo / dvcfile).with_suffix(".lock")
    if not lock_file.is_file():
        return {}
    stages = (yaml.safe_load(lock_file.read_text()) or {}).get("stages") or {}
    return {f"{dvcfile}:{name}": [repo / out["path"] for out in entry.get("outs", [])] for name, entry in stages.items()}


def recorded_seconds(outputs: list[Path]) -> float:
    """Seconds a stage took when it last ran: the ``seconds`` its JSON ``outputs`` (its metrics) record."""
    total = 0.0
    for path in outputs:
        if path.suffix == ".json" and path.is_file():
            data = json.loads(path.read_text())
            if isinstance(data, dict) and isinstance(data.get("seconds"), (int, float)):
                total += data["seconds"]
    return total


def paper_plan(repo: Path = Path(".")) -> list[Planned]:
    """Every stage of paper/dvc.yaml: a stale one with its steps and estimated seconds, one up
    to date (``done``) with the seconds it recorded."""
    default = load_params(repo / "params.yaml")
    paper = with_presets(default, repo / PAPER_DIR / "presets.yaml")
    curve = read_presets(repo / PAPER_DIR / "presets.yaml").learning_curve
    dvcfile = str(PAPER_DIR / "dvc.yaml")
    status = dvc_status(repo, dvcfile)
    stages = pipeline_stages(str(repo), dvcfile)
    stale = [s for s in stages if s in status]
    known = Measurements.read(repo, paper, default, outdated_runs(repo, stale, status))
    outputs = locked_outputs(repo, dvcfile)
    plan = []
    for stage in stages:
        target = training_target(stage, repo)
        if stage not in status:
            plan.append(Planned(stage, target.steps if target else 0, recorded_seconds(outputs.get(stage, [])), done=True))
            continue
        warm = only_the_warm_start_changed(status[stage])
        if target is None:  # curve_start's questions are counted with the curve's
            plan.append(Planned(stage, 0, 0.0, warm_start_only=warm))
            continue
        scored = questions_scored(curve if target.live.name == "curve" else None, known.questions)
        seconds, basis = known.estimate(target.preset, kind_of(paper, target.preset),
                                        target.steps * trajectories_per_step(paper, target.preset), scored)
        plan.append(Planned(stage, target.steps, seconds, basis, warm))
    return plan


def describe(plan: list[Planned]) -> str:
    """The plan as the lines `make paper` prints: the stages to run, then the whole set's cost."""
    done = [p for p in plan if p.done]
    plan = [p for p in plan if not p.done]
    if not plan:
        return "\n".join(["paper/dvc.yaml: every stage is up to date; nothing to run.", *whole_set(done, plan)])
    lines = [f"paper/dvc.yaml: {len(plan)} stage(s) to run"]
    for p in plan:
        when = "not measured yet" if p.seconds is None else f"~{p.seconds / 60:.0f} min"
        basis = f"  (step time of {p.basis})" if p.basis and p.steps else ""
        lines.append(f"  {p.stage:<45} {p.steps:>4} RL steps  {when}{basis}")
    known = [p.seconds for p in plan if p.seconds is not None]
    unknown = sum(p.seconds is None for p in plan)
    total = f"~{sum(known) / 3600:.1f} h estimated" + (f", plus {unknown} run(s) not measured yet" if unknown else "")
    lines.append(f"  total: {total} (2 CPU cores; README, 'The paper's experiments')")
    if warm := sum(p.warm_start_only for p in plan):
        lines.append(f"  {warm} of them only because {WARM_START} came out with other bytes than the committed "
                     "lock's (README, 'Results that travel between machines'); "
                     f"`dvc pull {WARM_START}` from a remote filled on the lock's machine keeps their results")
    return "\n".join([*lines, *whole_set(done, plan)])


def whole_set(done: list[Planned], to_run: list[Planned]) -> list[str]:
    """The line on what the whole set costs: the seconds the ``done`` stages recorded (on the
    machines that ran them) and the estimates of the stages ``to_run``."""
    if not done:
        return []
    recorded = sum(p.seconds or 0.0 for p in done)
    if not to_run:
        return [f"  the whole set took ~{recorded / 3600:.1f} h: the seconds its {len(done)} stages recorded "
                "(training and evaluation, on the machines that ran them)"]
    estimated = recorded + sum(p.seconds for p in to_run if p.seconds is not None)
    unknown = sum(p.seconds is None for p in to_run)
    return [f"  the whole set: ~{estimated / 3600:.1f} h" + (f" and {unknown} run(s) not measured yet" if unknown else "")
            + f", ~{recorded / 3600:.1f} h of it recorded by the {len(done)} stages up to date (on the machines that ran them)"]


if __name__ == "__main__":
    print(describe(paper_plan()))
