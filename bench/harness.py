"""What the training benchmarks share: params resized through the public experiment
mechanism, /proc readings, and each measurement in a fresh subprocess (its memory its own).

A worker script (``bench/update.py``, ``bench/rl_ranks.py``) runs one measurement:
``python bench/X.py --spec FILE`` reads a JSON spec and writes its result to
``spec['result']``; :func:`run_worker` starts it (under the ``deepspeed`` launcher for
several ranks), watches its resident set and collects the result.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LAUNCHER = Path(sys.executable).parent / "deepspeed"

log = logging.getLogger("bench.train")


def status_kib(field: str, pid: int | str = "self") -> int | None:
    """A ``/proc/PID/status`` field in KiB (``VmRSS``, ``VmHWM``), None once the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None


def mem_available_kib() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    except FileNotFoundError:
        pass
    return None


def bench_params(spec: dict) -> Any:
    """``spec['params']`` with ``spec['experiment']``'s overrides, then ``spec['overrides']`` (nested
    groups) applied the way an experiment's are, validated."""
    from agent_r1.config import ExperimentConfig, experiment_params, load_params

    params = load_params(spec["params"])
    if spec.get("experiment") and spec["experiment"] in params.experiments:
        params = experiment_params(params, spec["experiment"])
    resized = ExperimentConfig(overrides=spec.get("overrides", {}))
    return experiment_params(params.model_copy(update={"experiments": {"bench": resized}}), "bench")


def worker_main(measure: Callable[[dict], dict | None], doc: str | None, argv: list[str] | None = None) -> None:
    """A worker script's entry: ``--spec FILE`` in, ``measure(spec)`` out to ``spec['result']`` (unless None)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", type=Path, required=True, help="JSON spec written by bench/train.py")
    p.add_argument("--local_rank", type=int, default=0, help=argparse.SUPPRESS)  # from the deepspeed launcher
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")
    spec = json.loads(args.spec.read_text())
    result = measure(spec)
    if result is not None:
        Path(spec["result"]).write_text(json.dumps(result))


def worker_command(script: Path, spec_path: Path, ranks: int) -> list[str]:
    """The command line of one worker: plain Python, or the deepspeed launcher for ``ranks > 1``."""
    from agent_r1.training.distributed import free_port

    args = [str(script), "--spec", str(spec_path)]
    if ranks > 1:
        return [str(LAUNCHER), "--num_accelerators", str(ranks), "--master_port", str(free_port()), *args]
    return [sys.executable, *args]


def worker_env(threads: int | None) -> dict[str, str]:
    """This environment minus a launcher's rank variables, the repo importable, ``OMP_NUM_THREADS`` if set,
    and ``DS_ACCELERATOR`` chosen here (the launcher imports deepspeed before any worker code runs)."""
    from agent_r1.accelerator import select_accelerator

    select_accelerator()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def watch(proc: subprocess.Popen, cap_kib: int | None) -> bool:
    """Wait for ``proc``; kill it (our own child, by pid) once its resident set passes ``cap_kib``.
    Returns whether it was killed."""
    try:
        while proc.poll() is None:
            rss = status_kib("VmRSS", proc.pid)
            if cap_kib and rss and rss > cap_kib:
                proc.kill()
                proc.wait()
                return True
            time.sleep(0.1)
    except BaseException:
        proc.kill()
        raise
    return False


def run_worker(
    script: Path, spec: dict, *, ranks: int = 1, threads: int | None = None, cap_kib: int | None = None
) -> dict:
    """Run worker ``script`` on ``spec`` in a fresh process (under the deepspeed launcher when ``ranks > 1``).

    Returns its result, ``{'killed_above_mib': cap}`` when its resident set passed the cap,
    or ``{'error': ...}`` with the tail of its log.
    """
    with tempfile.TemporaryDirectory(prefix="bench_train_") as tmp:
        spec = {**spec, "result": str(Path(tmp) / "result.json"), "tmp": tmp}
        spec_path, log_path = Path(tmp) / "spec.json", Path(tmp) / "log.txt"
        spec_path.write_text(json.dumps(spec))
        start = time.perf_counter()
        with open(log_path, "w") as fh:
            proc = subprocess.Popen(worker_command(script, spec_path, ranks), cwd=REPO, env=worker_env(threads),
                                    stdout=fh, stderr=subprocess.STDOUT)
            killed = watch(proc, cap_kib)
            proc.wait()
        wall = time.perf_counter() - start
        if killed:
            log.info("  killed: resident set passed the %.1f GiB cap", cap_kib / 2**20)
            return {"killed_above_mib": round(cap_kib / 1024), "wall_s": wall}
        result_path = Path(spec["result"])
        if proc.returncode != 0 or not result_path.exists():
            tail = log_path.read_text()[-3000:]
            log.error("  worker failed (rc %s):\n%s", proc.returncode, tail)
            return {"error": f"rc {proc.returncode}", "log_tail": tail, "wall_s": wall}
        return {**json.loads(result_path.read_text()), "wall_s": wall}
