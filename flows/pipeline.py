"""The whole pipeline as a Prefect flow: each DVC stage a task, in dvc.yaml order.

    python -m flows.pipeline                 # every stage (cached ones are skipped by DVC)
    python -m flows.pipeline index --force   # one stage, forced
    python -m flows.pipeline --paper         # then every preset of paper/presets.yaml (`make paper`)
    python -m flows.pipeline --paper --plan  # only print what --paper would run, and its estimated time

One flow at a time per repository: a second one fails at once, naming the
running one (flows/run_lock.py). Each stage runs supervised: killing the flow,
even with ``kill -9``, ends its `dvc` and stage processes too (tasks/supervise.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from prefect import Task, flow
from prefect.tasks import exponential_backoff

from agent_r1.config import load_params, with_presets
from flows.plan import describe, paper_plan
from flows.run_lock import cli_lock, exclusive_run, flow_run_name
from tasks.dvc_stage import StageRun, pipeline_stages, publish_metrics, publish_reports, run_dvc_stage


PAPER_DVCFILE = "paper/dvc.yaml"  # the paper's presets: a pipeline of its own (`make paper`)


# Stages that reach the network (official data-set URLs, PyPI wheels): a failed attempt is
# retried after 10 s, 20 s, 40 s. A rerun is safe: every stage writes atomically, and DVC
# re-runs a stage whose outputs are missing.
TRANSIENT_RETRIES: dict[str, int] = {"download": 3}


def stage_task(stage: str) -> Task:
    """The Prefect task for ``stage``, with retries and backoff where failures can be transient."""
    retries = TRANSIENT_RETRIES.get(stage.split(":")[-1].split("@")[0], 0)
    if not retries:
        return run_dvc_stage
    return run_dvc_stage.with_options(retries=retries, retry_delay_seconds=exponential_backoff(backoff_factor=10))


@flow(name="agent-r1-pipeline", log_prints=False)
def pipeline(
    targets: list[str] | None = None, force: bool = False, repo: str = ".", paper: bool = False
) -> list[StageRun]:
    """Run ``targets`` (default: every stage; with ``paper``, then every paper preset)
    and publish the stage summary, the metrics and the report(s) as artifacts.
    Fails at once if another flow runs in ``repo`` (a scheduled run has no CLI to check it)."""
    # Bad params fail here, the key named (a duplicate, a missing local model folder...), before any stage runs.
    params = load_params(Path(repo) / "params.yaml")
    if paper:
        with_presets(params, Path(repo) / Path(PAPER_DVCFILE).parent / "presets.yaml")
    with exclusive_run(repo, flow_run=flow_run_name()):
        known = pipeline_stages(repo)
        if paper:
            known += pipeline_stages(repo, PAPER_DVCFILE)
        stages = targets or known
        unknown = sorted(set(stages) - set(known))
        if unknown:
            raise ValueError(f"unknown stage(s) {unknown}; known stages: {known}")
        if paper:  # hours of training: say what is about to run before it starts
            print(describe(paper_plan(Path(repo))), flush=True)
        runs = [stage_task(stage)(stage, repo=repo, force=force) for stage in stages]
        publish_metrics(repo=repo, runs=runs)
        publish_reports(repo=repo)
    for r in runs:
        print(f"{r.stage:<40} {'ran' if r.ran else 'cached':<7} {r.seconds:8.1f}s")
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("targets", nargs="*", help="stage names (default: all)")
    parser.add_argument("--force", action="store_true", help="re-run even if DVC says up to date")
    parser.add_argument("--repo", default=".")
    parser.add_argument("--paper", action="store_true", help=f"also run {PAPER_DVCFILE} (the paper's presets)")
    parser.add_argument("--plan", action="store_true", help=f"print what {PAPER_DVCFILE} would run, and how long; run nothing")
    args = parser.parse_args()
    if args.plan:
        print(describe(paper_plan(Path(args.repo))))
        return
    with cli_lock(args.repo):  # before Prefect starts: a second `make run` fails at once
        pipeline(targets=args.targets or None, force=args.force, repo=args.repo, paper=args.paper)


if __name__ == "__main__":
    main()
