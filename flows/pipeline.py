"""The whole pipeline as a Prefect flow: each DVC stage a task, in dvc.yaml order.

    python -m flows.pipeline                 # every stage (cached ones are skipped by DVC)
    python -m flows.pipeline index --force   # one stage, forced
"""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path

# Offline by design: no usage telemetry from the Prefect server or SDK (set before prefect loads).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")

from prefect import Task, flow  # noqa: E402
from prefect.tasks import exponential_backoff  # noqa: E402

from tasks.dvc_stage import StageRun, dvc_command, publish_metrics, run_dvc_stage  # noqa: E402


def pipeline_stages(repo: str = ".") -> list[str]:
    """Stage names (foreach stages expanded, e.g. ``train@grpo``) in dvc.yaml order,
    which is topological by construction."""
    proc = subprocess.run(
        [*dvc_command(), "stage", "list", "--name-only", "--fail"], cwd=repo, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"dvc stage list failed in {Path(repo).resolve()}: {proc.stderr.strip()}")
    return proc.stdout.split()


# Stages that reach the network (official data-set URLs, PyPI wheels): a failed attempt is
# retried after 10 s, 20 s, 40 s. A rerun is safe: every stage writes atomically, and DVC
# re-runs a stage whose outputs are missing.
TRANSIENT_RETRIES: dict[str, int] = {"download": 3}


def stage_task(stage: str) -> Task:
    """The Prefect task for ``stage``, with retries and backoff where failures can be transient."""
    retries = TRANSIENT_RETRIES.get(stage.split("@")[0], 0)
    if not retries:
        return run_dvc_stage
    return run_dvc_stage.with_options(retries=retries, retry_delay_seconds=exponential_backoff(backoff_factor=10))


@flow(name="agent-r1-pipeline", log_prints=False)
def pipeline(targets: list[str] | None = None, force: bool = False, repo: str = ".") -> list[StageRun]:
    known = pipeline_stages(repo)
    stages = targets or known
    unknown = sorted(set(stages) - set(known))
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; dvc.yaml has {known}")
    runs = [stage_task(stage)(stage, repo=repo, force=force) for stage in stages]
    publish_metrics(repo=repo, runs=runs)
    for r in runs:
        print(f"{r.stage:<12} {'ran' if r.ran else 'cached':<7} {r.seconds:8.1f}s")
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("targets", nargs="*", help="stage names (default: all)")
    parser.add_argument("--force", action="store_true", help="re-run even if DVC says up to date")
    parser.add_argument("--repo", default=".")
    args = parser.parse_args()
    pipeline(targets=args.targets or None, force=args.force, repo=args.repo)


if __name__ == "__main__":
    main()
