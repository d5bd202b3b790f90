"""Prefect tasks over DVC: run one stage, publish metrics.

The flow never re-implements caching: ``dvc repro --single-item STAGE`` decides
whether the stage is up to date, and we only report what it did.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, NamedTuple

from prefect import task
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.logging import get_run_logger

from agent_r1.paths import seeded
from tasks.offline import telemetry_off

# Phrases `dvc repro` prints for a stage it did not run.
_CACHED_MARKERS = ("didn't change, skipping", "is cached - skipping", "Restored stage")


DISTRIBUTED_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass
class StageRun:
    stage: str
    ran: bool
    seconds: float
    returncode: int


def stage_env() -> dict[str, str]:
    """Stage commands say ``python``: make that the interpreter running this flow."""
    # A stage is its own job: it must not join a process group its caller belongs to
    # (an in-process DeepSpeed user leaves RANK/MASTER_PORT set, and the stage would try to bind that port).
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_VARS}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    telemetry_off(env)  # offline by design, in any repo whose config does not say so
    return env


def dvc_command() -> list[str]:
    return [sys.executable, "-m", "dvc"]


def pipeline_stages(repo: str = ".", dvcfile: str = "dvc.yaml") -> list[str]:
    """Stage names (foreach stages expanded, e.g. ``train@grpo``) in ``dvcfile`` order,
    which is topological by construction. Stages of another file than the root
    dvc.yaml are named ``path/dvc.yaml:stage``, as `dvc repro` takes them."""
    proc = subprocess.run(
        [*dvc_command(), "stage", "list", dvcfile, "--name-only", "--fail"], cwd=repo, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"dvc stage list failed in {Path(repo).resolve()}: {proc.stderr.strip()}")
    return proc.stdout.split()


SUPERVISOR = Path(__file__).with_name("supervise.py")


def supervised(cmd: list[str]) -> list[str]:
    """``cmd`` run so that it and everything it starts die with this process, even
    by ``kill -9``: no orphaned stage keeps training, no orphaned `dvc` keeps the
    repository locked (see supervise.py)."""
    return [sys.executable, str(SUPERVISOR), str(os.getpid()), "--", *cmd]


def _stream(pipe: IO[bytes]) -> Iterator[tuple[str, bool]]:
    """Split a subprocess's output into ``(text, is_progress)``: lines ended by a newline,
    and carriage-return frames (tqdm progress bars), as they arrive."""
    buf = b""
    while chunk := os.read(pipe.fileno(), 65536):
        buf += chunk
        while (cut := min((i for i in (buf.find(b"\n"), buf.find(b"\r")) if i >= 0), default=-1)) >= 0:
            piece, sep, buf = buf[:cut], buf[cut : cut + 1], buf[cut + 1 :]
            if piece or sep == b"\n":
                yield piece.decode(errors="replace"), sep == b"\r"
    if buf:
        yield buf.decode(errors="replace"), False


class TrainingTarget(NamedTuple):
    steps: int  # RL steps the stage trains
    live: Path  # its dvclive folder
    preset: str  # the experiment (preset) it runs


def training_target(stage: str, repo: Path) -> TrainingTarget | None:
    """What a stage that trains runs: ``train@NAME``; or, of ``<dir>/dvc.yaml`` with its
    ``<dir>/presets.yaml``, a run ``run@PRESET-SEED`` / ``extra@PRESET-SEED`` or the
    ``curve``. None for any other stage."""
    from agent_r1.config import experiment_params, load_params, read_presets, with_presets

    dvcfile, _, name = stage.rpartition(":")
    kind, _, item = name.partition("@")
    root = repo / Path(dvcfile).parent if dvcfile else repo
    if kind == "train" and item and not dvcfile:
        steps = experiment_params(load_params(repo / "params.yaml"), item).train.steps
        return TrainingTarget(steps, root / "dvclive" / item, item)
    if dvcfile and kind in ("run", "extra") and item:
        preset, _, seed = item.rpartition("-")
        params = with_presets(load_params(repo / "params.yaml"), root / "presets.yaml")
        steps = experiment_params(params, preset).train.steps
        return TrainingTarget(steps, root / "dvclive" / seeded(preset, int(seed)), preset)
    if dvcfile and kind == "curve" and (curve := read_presets(root / "presets.yaml").learning_curve):
        return TrainingTarget(curve.steps, root / "dvclive" / "curve", curve.experiment)
    return None


class TrainProgress:
    """A Prefect progress artifact that follows a training stage: the share of RL steps
    done, read from the step dvclive writes after each one."""

    POLL_S = 2.0

    def __init__(self, live_metrics: Path, total_steps: int, key: str):
        self.live_metrics, self.total_steps = live_metrics, total_steps
        self.started = time.time()  # an older metrics.json (persisted from the last run) says nothing
        self.last_poll = 0.0
        self.artifact = create_progress_artifact(0.0, key=key, description=f"{key}: RL steps done")

    @classmethod
    def for_stage(cls, stage: str, repo: str = ".") -> TrainProgress | None:
        """None unless ``stage`` trains (:func:`training_target`)."""
        target = training_target(stage, Path(repo))
        if target is None:
            return None
        steps, live, _ = target
        key = re.sub(r"[^a-z0-9-]+", "-", f"progress-{stage.rpartition(':')[2]}".lower()).strip("-")
        return cls(live / "metrics.json", steps, key)

    def steps_done(self) -> int:
        try:
            if self.live_metrics.stat().st_mtime < self.started:
                return 0
            return int(json.loads(self.live_metrics.read_text())["step"]) + 1
        except (OSError, ValueError, KeyError):
            return 0  # not written yet, or caught mid-write

    def poll(self, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self.last_poll < self.POLL_S:
            return
        self.last_poll = now
        done = self.total_steps if final else min(self.steps_done(), self.total_steps)
        update_progress_artifact(self.artifact, 100.0 * done / max(self.total_steps, 1))


@task(name="dvc-stage", task_run_name="{stage}")
def run_dvc_stage(stage: str, repo: str = ".", force: bool = False) -> StageRun:
    """``dvc repro --single-item STAGE``, streaming its log; report ran vs cached.
    A train stage also keeps a progress artifact up to date."""
    logger = get_run_logger()
    cmd = [*dvc_command(), "repro", "--single-item", stage] + (["--force"] if force else [])
    logger.info("$ %s", " ".join(cmd[2:]))
    start = time.monotonic()
    progress = TrainProgress.for_stage(stage, repo)
    proc = subprocess.Popen(
        supervised(cmd), cwd=repo, env=stage_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    lines: list[str] = []
    for text, is_progress in _stream(proc.stdout):
        if progress is not None:
            progress.poll()
        if is_progress:  # a progress bar redrawing itself: show it live, don't log every frame
            sys.stderr.write("\r" + text[:160])
            sys.stderr.flush()
            continue
        lines.append(text)
        if text.strip():
            logger.info(text)
    cached = any(m in line for line in lines for m in _CACHED_MARKERS)
    rc = proc.wait()
    result = StageRun(stage=stage, ran=not cached, seconds=round(time.monotonic() - start, 2), returncode=rc)
    if rc != 0:
        tail = "\n".join(lines[-40:])
        raise RuntimeError(f"stage {stage!r} failed (exit {rc}):\n{tail}")
    if progress is not None:
        progress.poll(final=True)
    logger.info("stage %s %s in %.1fs", stage, "ran" if result.ran else "was cached", result.seconds)
    return result


def flatten(prefix: str, obj: object, out: dict[str, object]) -> dict[str, object]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``: metrics files become table rows."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = obj
    return out


def read_metrics(repo: str = ".") -> list[dict[str, object]]:
    """Every metrics file DVC tracks in ``repo`` as rows ``{file, metric, value}``."""
    proc = subprocess.run(
        [*dvc_command(), "metrics", "show", "--json"], cwd=repo, env=stage_env(), capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"dvc metrics show failed: {proc.stderr.strip()}")
    rows: list[dict[str, object]] = []
    shown = json.loads(proc.stdout or "{}")
    for rev in shown.values():
        for path, content in sorted((rev.get("data") or {}).items()):
            for key, value in flatten("", content.get("data", {}), {}).items():
                if isinstance(value, (int, float, str, bool)) or value is None:
                    rows.append({"file": path, "metric": key, "value": value})
    return rows


@task(name="publish-metrics")
def publish_metrics(repo: str = ".", runs: list[StageRun] | None = None) -> list[dict[str, object]]:
    """Publish the stage summary and every tracked metric as Prefect table artifacts."""
    if runs:
        create_table_artifact(
            key="stages", table=[asdict(r) for r in runs], description="What this flow run executed"
        )
    rows = read_metrics(repo)
    if rows:
        create_table_artifact(key="metrics", table=rows, description="Metrics of the DVC pipeline")
    return rows


# Report files a flow run publishes as markdown artifacts (when they exist), by artifact key,
# with the presets file (None: params.yaml's own) whose experiments the report shows.
REPORTS = {
    "report": (Path("reports/results.md"), None),
    "paper-report": (Path("paper/reports/results.md"), Path("paper/presets.yaml")),
}


def report_experiments(repo: Path, presets: Path | None) -> dict[str, Any]:
    """The experiments a report shows (name -> ExperimentConfig): those of params.yaml, or of a presets file."""
    from agent_r1.config import load_params, with_presets

    params = load_params(repo / "params.yaml")
    if presets is not None:
        params = with_presets(params, repo / presets)
    return params.experiments


@task(name="publish-reports")
def publish_reports(repo: str = ".") -> list[str]:
    """Publish each report (markdown) and its EM table (a table artifact, one row per method)."""
    from agent_r1.evaluation.report import results_rows
    from agent_r1.evaluation.runs import run_seeds

    published = []
    for key, (rel, presets) in REPORTS.items():
        md = Path(repo) / rel
        if not md.exists():
            continue
        create_markdown_artifact(md.read_text(), key=key, description=f"{rel} of this run")
        eval_dir, baseline_dir = md.parent.parent / "metrics" / "eval", Path(repo) / "metrics" / "eval"
        shown = report_experiments(Path(repo), presets)
        rows = results_rows(eval_dir, baseline_dir, tuple(shown), run_seeds(shown))
        if rows:
            create_table_artifact(table=rows, key=f"{key}-results", description=f"Held-out EM/F1 in {rel}")
        published.append(key)
    return published
