"""The RL recipe, chosen on the validation split: validation EM against training minutes, side by side.

Each side is a name and ``--set`` overrides of a preset of ``paper/presets.yaml`` (``--experiment``:
the learning curve's ``grpo``, from the warm start ``models/sft``, unless named), trained by the train stage itself for
``--steps`` iterations with a greedy evaluation on the validation split every
``--eval-every`` (``--eval-questions`` of it: 100 is the whole split, as the
learning curve's). Nothing here reads the test split. Runs are resumable (their
checkpoints live under ``build/recipe/``): run the command again after a kill.

    .venv/bin/python bench/recipe.py --steps 30 \\
        full-1e-5=train.actor_lr=1e-5 \\
        lora8-1e-4=train.lora.rank=8,train.actor_lr=1e-4
    .venv/bin/python bench/recipe.py --experiment grpo-base --steps 40 --eval-every 20 \\
        --out bench/results/recipe_from_base.json paper=train.seed=0 penalty-0.1=train.seed=0,env.reward.format_score=0.9

Writes ``bench/results/recipe.json`` (every side's validation EM at each
evaluation, the training minutes before it, the machine it ran on) and
``bench/results/recipe.png``: EM against minutes, beside the learning curve
committed in ``paper/`` (the old recipe on the old code), whose step 0 (the
warm start's validation EM) every side shares. A preset trained from the base model
(``init: base``) has neither: its points start at its first evaluation.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from rl_step import machine  # noqa: E402

OUT = ROOT / "bench" / "results"
WORK = ROOT / "build" / "recipe"
CURVE = ROOT / "paper" / "dvclive" / "curve" / "plots" / "metrics"
WARM_START = ROOT / "paper" / "metrics" / "curve_start.json"
PRESETS = ROOT / "paper" / "presets.yaml"  # the learning curve's experiment (its grpo: no one-shot example)


def tsv(path: Path) -> dict[int, float]:
    """A dvclive metric's history: step -> value."""
    with path.open() as f:
        return {int(row["step"]): float(row[path.stem]) for row in csv.DictReader(f, delimiter="\t")}


def curve_points(live_metrics: Path, start_em: float | None) -> list[dict[str, float]]:
    """(iterations, training minutes, validation EM) at each evaluation, from a run's dvclive folder;
    minutes are the iterations' own time (rollout + update), evaluations excluded. ``start_em``:
    step 0's, when known (the warm start's)."""
    em, step_s = tsv(live_metrics / "eval" / "em.tsv"), tsv(live_metrics / "time" / "step_s.tsv")
    points = [] if start_em is None else [{"iterations": 0, "minutes": 0.0, "em": start_em}]
    for step in sorted(em):
        points.append({"iterations": step + 1, "minutes": sum(v for s, v in step_s.items() if s <= step) / 60,
                       "em": em[step]})
    return points


def train_side(experiment: str, name: str, sets: list[str], steps: int, eval_every: int, eval_questions: int) -> Path:
    """The train stage for one side of ``experiment`` (resumes its own checkpoint); its dvclive metrics folder."""
    out = WORK / experiment / name
    cmd = [sys.executable, "-m", "agent_r1.stages.train", "--presets", str(PRESETS), "--experiment", experiment,
           "--set", f"train.steps={steps}", "--set", f"train.eval_every={eval_every}",
           "--set", f"train.eval_questions={eval_questions}", "--set", f"train.save_every={eval_every}",
           *[a for s in sets for a in ("--set", s)],
           "--out", str(out / "model"), "--checkpoints", str(out / "ckpt"), "--live", str(out / "live"),
           "--metrics", str(out / "train.json")]
    print(f"[{name}] {' '.join(sets)}", flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    return out / "live" / "plots" / "metrics"


def preset_init(experiment: str) -> str:
    """What preset ``experiment`` of paper/presets.yaml trains from: ``sft`` (the warm start) or ``base``."""
    from agent_r1.config import load_params, with_presets

    found = with_presets(load_params(ROOT / "params.yaml"), PRESETS).experiments  # validated: the schema's defaults
    if experiment not in found:
        raise SystemExit(f"--experiment {experiment!r}: not a preset of {PRESETS} (has {sorted(found)})")
    return found[experiment].init


def plot(sides: dict[str, dict], curve: list[dict[str, float]] | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    if curve is not None:
        ax.plot([p["minutes"] for p in curve], [p["em"] for p in curve], "k--", marker=".",
                label="learning curve (full fine-tune, lr 1e-5, before prefix sharing)")
    for name, side in sides.items():
        pts = side["points"]
        where = side.get("machine", {}).get("cpu", "?").replace("(R)", "")
        ax.plot([p["minutes"] for p in pts], [p["em"] for p in pts], marker="o", label=f"{name} ({where})")
    if curve is not None:  # the targets the warm-start recipe was chosen against
        ax.axhline(0.49, color="grey", lw=0.8, ls=":")
        ax.axvline(40, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("training minutes (rollout + update, 2 CPU cores)")
    ax.set_ylabel("validation EM (100 questions, greedy)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sides", nargs="+", help="NAME=KEY=VALUE[,KEY=VALUE...] (params keys, as the stage's --set)")
    ap.add_argument("--experiment", default="grpo", help="a preset of paper/presets.yaml (experiments or extra)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--eval-questions", type=int, default=100)
    ap.add_argument("--out", type=Path, default=OUT / "recipe.json")
    args = ap.parse_args()
    from_sft = preset_init(args.experiment) == "sft"
    start_em = json.loads(WARM_START.read_text())["em"] if from_sft else None
    results = json.loads(args.out.read_text()) if args.out.exists() else {"sides": {}}
    results["experiment"] = args.experiment
    for side in args.sides:
        name, _, spec = side.partition("=")
        sets = spec.split(",") if spec else []
        live = train_side(args.experiment, name, sets, args.steps, args.eval_every, args.eval_questions)
        results["sides"][name] = {"sets": sets, "steps": args.steps, "points": curve_points(live, start_em),
                                  "machine": machine()}  # sides may run on different machines: minutes are each one's
        args.out.write_text(json.dumps(results, indent=2) + "\n")  # after each side: a kill loses no finished one
        print(json.dumps(results["sides"][name]["points"]), flush=True)
    curve = curve_points(CURVE, start_em) if from_sft else None  # the curve trains from the warm start
    results["learning_curve"] = curve
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    plot(results["sides"], curve, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
