"""A parameter sweep as DVC experiments, run and summarised by a Prefect flow.

    python -m flows.sweep -S train.actor_lr=1e-5,3e-6 -S train.seed=0,1
    python -m flows.sweep -S train.seed=0,1,2 --name seeds train@grpo evaluate@grpo report

Every point of the grid (the cartesian product of the ``-S key=v1,v2`` lists) is
checked against the params schema first (a bad key or value fails before
anything is queued), then queued with ``dvc exp run --queue -n NAME -S ...`` and
run by ``dvc queue start`` in isolated copies of the workspace. DVC caches every
stage, so a point re-runs only the stages its params reach. The flow publishes
one table (printed too): each experiment's swept params and held-out EM/F1
beside the baseline commit's, read back with ``dvc metrics diff``.
"""

from __future__ import annotations

import argparse
import itertools
import subprocess
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path

import yaml
from prefect import flow, task
from prefect.artifacts import create_table_artifact
from prefect.logging import get_run_logger

from agent_r1.compare import Row, collect
from agent_r1.config import ParamsError, parse_params, read_yaml
from flows.run_lock import cli_lock, exclusive_run, flow_run_name
from tasks.dvc_stage import dvc_command, stage_env

# What the table shows of each experiment: top-level keys of the evaluation metrics.
TABLE_METRICS = ("em", "f1")
FINISHED = {"Success", "Failed"}


def parse_grid(specs: Sequence[str]) -> dict[str, list[str]]:
    """``["a.b=1,2", "c=x"]`` -> ``{"a.b": ["1", "2"], "c": ["x"]}`` (the ``-S`` syntax of ``dvc exp run``)."""
    grid: dict[str, list[str]] = {}
    for spec in specs:
        key, sep, values = spec.partition("=")
        if not sep or not key or not values:
            raise ValueError(f"-S {spec!r}: expected key=value[,value...]")
        if key in grid:
            raise ValueError(f"-S {key}: given twice")
        grid[key] = values.split(",")
    return grid


def grid_points(grid: dict[str, list[str]]) -> list[dict[str, str]]:
    """The cartesian product, in the order the values were given."""
    return [dict(zip(grid, combo)) for combo in itertools.product(*grid.values())]


def check_point(base: dict, point: dict[str, str], source: str) -> None:
    """Raise ParamsError naming the key when ``point`` applied to params.yaml fails the schema."""
    raw = yaml.safe_load(yaml.safe_dump(base))
    for dotted, text in point.items():
        node = raw
        *parents, leaf = dotted.split(".")
        for key in parents:
            if not isinstance(node.get(key), dict):
                raise ParamsError(source, [f"{dotted}: no such params group {key!r}"])
            node = node[key]
        node[leaf] = yaml.safe_load(text)
    parse_params(raw, f"{source} with {', '.join(f'{k}={v}' for k, v in point.items())}")


def _dvc(args: Sequence[str], repo: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([*dvc_command(), *args], cwd=repo, env=stage_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"`dvc {' '.join(args)}` failed: {(proc.stderr or proc.stdout).strip()}")
    return proc


@task(name="queue-experiment", task_run_name="queue {name}")
def queue_experiment(name: str, point: dict[str, str], targets: list[str], repo: str = ".") -> str:
    sets = [arg for k, v in point.items() for arg in ("-S", f"{k}={v}")]
    _dvc(["exp", "run", "--queue", "-n", name, *sets, *targets], repo)
    return name


def queue_states(repo: str) -> dict[str, str]:
    """``{experiment name: status}`` from ``dvc queue status`` (Queued, Running, Success, Failed)."""
    states = {}
    for line in _dvc(["queue", "status"], repo).stdout.splitlines():
        cols = line.split()
        # rows: "<task> <name> <time> <AM|PM>? <status>"; the name column is empty for unnamed tasks
        if len(cols) >= 4 and cols[-1] in FINISHED | {"Queued", "Running"}:
            states[cols[1]] = cols[-1]
    return states


class QueueStalled(RuntimeError):
    """The sweep's experiments can no longer finish: one left the queue, or none runs."""


def wait_for_queue(
    names: list[str], read_states: Callable[[], dict[str, str]], poll_s: float = 5.0, stall_s: float = 120.0,
    log: Callable[[str], None] = print, sleep: Callable[[float], None] = time.sleep,
) -> dict[str, str]:
    """Poll ``read_states`` until every experiment of ``names`` is Success or Failed.

    Raises QueueStalled instead of waiting forever when an experiment leaves the queue
    (`dvc queue remove`) or when some are Queued and none has been Running for
    ``stall_s``: the workers are gone (`dvc queue stop`, a killed worker). ``dvc queue
    status``'s worker count cannot tell: a busy worker does not answer it."""
    seen: dict[str, str] = {}
    idle_s = 0.0
    while True:
        states = {n: s for n, s in read_states().items() if n in names}
        if gone := sorted(n for n in seen if n not in states):
            raise QueueStalled(f"experiment(s) {gone} left the DVC queue before finishing (`dvc queue remove`?)")
        for n, s in states.items():
            if seen.get(n) != s:
                log(f"experiment {n}: {s}")
        seen.update(states)
        if len(states) == len(names) and set(states.values()) <= FINISHED:
            return states
        queued = sorted(n for n, s in states.items() if s == "Queued")
        idle_s = idle_s + poll_s if queued and "Running" not in states.values() else 0.0
        if idle_s >= stall_s:
            raise QueueStalled(
                f"{queued} still queued, and no experiment has run for {stall_s:.0f} s: the DVC queue has no "
                "worker (stopped?). `dvc queue start` runs them; `dvc exp show` has the finished ones."
            )
        sleep(poll_s)


@task(name="run-queue")
def run_queue(names: list[str], jobs: int = 1, repo: str = ".", poll_s: float = 5.0) -> dict[str, str]:
    """Start the queue's workers and wait until every experiment of ``names`` has finished."""
    logger = get_run_logger()
    _dvc(["queue", "start", "-j", str(jobs)], repo)
    return wait_for_queue(names, lambda: queue_states(repo), poll_s=poll_s, log=logger.info)


def eval_column(file: str, key: str) -> str:
    """``metrics/eval/grpo.json``, ``em`` -> ``grpo.em``; another pipeline's evaluation keeps
    its folder (``paper/metrics/eval/grpo.json`` -> ``paper/grpo.em``): the stems collide."""
    return f"{file.replace('metrics/eval/', '').removesuffix('.json')}.{key}"


def table_rows(
    baseline: str, names: list[str], points: list[dict[str, str]], diffs: list[list[Row]]
) -> list[dict]:
    """One row per experiment (the baseline first): swept params, then EM/F1 of each
    evaluation file, from ``diffs[i]`` (``dvc metrics diff baseline names[i] --all``).
    The root pipeline's evaluations are always shown; another pipeline's (``paper/``)
    only where some experiment changed them, else its dozen unchanged columns bury the sweep."""
    evals = [[r for r in diff if r.kind == "metric" and r.key in TABLE_METRICS and "/eval/" in f"/{r.file}"]
             for diff in diffs]
    changed = {(r.file, r.key) for rows in evals for r in rows if r.old != r.new}
    shown = [[r for r in rows if r.file.startswith("metrics/") or (r.file, r.key) in changed] for rows in evals]
    table = [{"experiment": baseline, **{k: "" for k in points[0]}}
             | {eval_column(r.file, r.key): r.old for r in shown[0]}] if names else []
    for name, point, rows in zip(names, points, shown):
        table.append({"experiment": name, **point} | {eval_column(r.file, r.key): r.new for r in rows})
    return table


@task(name="sweep-table")
def sweep_table(names: list[str], points: list[dict[str, str]], repo: str = ".", baseline: str = "HEAD") -> list[dict]:
    """The sweep's table, read back with ``dvc params/metrics diff`` (see table_rows)."""
    diffs = [collect(baseline, name, repo=Path(repo), all_rows=True) for name in names]
    return table_rows(baseline, names, points, diffs)


def render(rows: list[dict]) -> str:
    header = list(dict.fromkeys(k for row in rows for k in row))
    cells = [[_fmt(row.get(k)) for k in header] for row in rows]
    widths = [max(len(x) for x in col) for col in zip(header, *cells)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    return "\n".join(lines + ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells])


def _fmt(value: object) -> str:
    return "—" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)


@flow(name="agent-r1-sweep", log_prints=True)
def sweep(
    grid: dict[str, list[str]], targets: list[str] | None = None, name: str | None = None,
    jobs: int = 1, repo: str = ".",
) -> list[dict]:
    points = grid_points(grid)
    source = str(Path(repo) / "params.yaml")
    base = read_yaml(Path(source))  # a duplicate key is named here, as in every stage
    for point in points:  # every point is valid before anything is queued
        check_point(base, point, source)
    prefix = name or "sweep-" + datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    names = [f"{prefix}-{i}" for i in range(len(points))]
    # queueing stashes the workspace and takes DVC's lock: not while a pipeline runs here
    with exclusive_run(repo, flow_run=flow_run_name()):
        for n, point in zip(names, points):
            queue_experiment(n, point, list(targets or []), repo=repo)
        states = run_queue(names, jobs=jobs, repo=repo)
        failed = sorted(n for n, s in states.items() if s != "Success")
        if failed:
            raise RuntimeError(f"experiments failed: {failed}; see `dvc queue logs NAME`")
        rows = sweep_table(names, points, repo=repo)
    create_table_artifact(table=rows, key="sweep", description=f"Sweep {prefix}: {', '.join(grid)}")
    print(render(rows))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("targets", nargs="*", help="stages each experiment reproduces (default: the pipeline)")
    parser.add_argument("-S", "--set-param", dest="sets", action="append", required=True,
                        metavar="KEY=V1[,V2...]", help="a params.yaml key and the values to sweep")
    parser.add_argument("--name", help="experiment name prefix (default: sweep-<UTC time>)")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="experiments run in parallel (default 1)")
    parser.add_argument("--repo", default=".")
    args = parser.parse_args()
    try:
        grid = parse_grid(args.sets)
        base = read_yaml(Path(args.repo) / "params.yaml")
        for point in grid_points(grid):
            check_point(base, point, str(Path(args.repo) / "params.yaml"))
    except (ValueError, ParamsError) as exc:
        parser.exit(2, f"error: {exc}\n")
    with cli_lock(args.repo):
        sweep(grid, targets=args.targets, name=args.name, jobs=args.jobs, repo=args.repo)


if __name__ == "__main__":
    main()
