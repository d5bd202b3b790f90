"""Serve the pipeline flow on a cron taken from params.yaml (group ``schedule``).

    prefect server start                       # terminal 1: the local Prefect server (UI on :4200)
    prefect config set PREFECT_API_URL=http://127.0.0.1:4200/api
    python -m flows.schedule                   # terminal 2: registers the deployment, runs it on schedule

Each scheduled run is an ordinary ``agent-r1-pipeline`` flow run: DVC skips
every stage whose inputs did not change, so a nightly run after a
``params.yaml`` edit re-runs exactly the affected stages. Stop with Ctrl-C
(the schedule is paused on shutdown). ``--once`` registers the deployment and
exits without serving (CI, or to inspect it in the UI first).

The deployment runs one at a time (a concurrency limit of 1): a run that comes
due while one runs is cancelled, not queued. A scheduled run while a
``make run`` runs in the same repository fails at once, naming it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agent_r1.config import ParamsError, ScheduleConfig, load_params


def cron_schedule(cfg: ScheduleConfig, source: str = "params.yaml"):
    """The Prefect cron schedule; a bad expression names ``schedule.cron``."""
    from prefect.client.schemas.schedules import CronSchedule
    from pydantic import ValidationError

    try:
        return CronSchedule(cron=cfg.cron, timezone=cfg.timezone)
    except ValidationError as exc:
        problem = exc.errors()[0]
        field = problem["loc"][0] if problem["loc"] else "cron"
        got = getattr(cfg, str(field), cfg.cron)
        raise ParamsError(source, [f"schedule.{field}: {problem['msg']} (got {got!r})"]) from None


def flow_parameters(cfg: ScheduleConfig, repo: Path) -> dict:
    return {"targets": list(cfg.targets) or None, "force": cfg.force, "repo": str(repo.resolve())}


def one_run_at_a_time():
    """The deployment's concurrency limit: one run at a time, and a run due while one
    is running is cancelled rather than queued (the flow's repository lock would refuse
    it anyway; queued runs would pile up behind a long training run)."""
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy

    return ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--repo", default=".")
    parser.add_argument("--once", action="store_true", help="register the deployment and exit (no serving)")
    args = parser.parse_args(argv)
    try:
        cfg = load_params(args.params).schedule
        schedule = cron_schedule(cfg, args.params)
    except ParamsError as exc:
        print(exc, file=sys.stderr)
        return 2

    from flows.pipeline import pipeline

    parameters = flow_parameters(cfg, Path(args.repo))
    if args.once:
        deployment_id = pipeline.to_deployment(
            name=cfg.deployment, schedules=[schedule], parameters=parameters, concurrency_limit=one_run_at_a_time()
        ).apply()
        print(f"registered deployment agent-r1-pipeline/{cfg.deployment} ({deployment_id}): cron {cfg.cron!r} {cfg.timezone}")
        return 0
    pipeline.serve(
        name=cfg.deployment, schedules=[schedule], parameters=parameters, global_limit=one_run_at_a_time(), limit=1
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
