"""flows/sweep.py: the grid, and params checked before anything is queued (the real
queued sweep runs in tests/test_pipeline.py's DVC repo)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agent_r1.config import ParamsError
from flows.sweep import check_point, grid_points, parse_grid, render

ROOT = Path(__file__).resolve().parents[1]


def test_grid_is_the_cartesian_product_in_given_order() -> None:
    grid = parse_grid(["train.actor_lr=1e-5,3e-6", "train.seed=0,1,2"])
    points = grid_points(grid)
    assert len(points) == 6
    assert points[0] == {"train.actor_lr": "1e-5", "train.seed": "0"}
    assert points[-1] == {"train.actor_lr": "3e-6", "train.seed": "2"}


@pytest.mark.parametrize("spec", ["train.seed", "=1", "train.seed="])
def test_malformed_spec(spec: str) -> None:
    with pytest.raises(ValueError, match="expected key=value"):
        parse_grid([spec])


def test_points_are_checked_against_the_schema() -> None:
    base = yaml.safe_load((ROOT / "params.yaml").read_text())
    check_point(base, {"train.actor_lr": "3e-6", "algorithm.name": "rloo"}, "params.yaml")
    with pytest.raises(ParamsError, match=r"algorithm.name: unknown advantage estimator 'a2c'"):
        check_point(base, {"algorithm.name": "a2c"}, "params.yaml")
    with pytest.raises(ParamsError, match=r"train.stepz: unknown key"):
        check_point(base, {"train.stepz": "3"}, "params.yaml")
    with pytest.raises(ParamsError, match=r"trian.steps: no such params group 'trian'"):
        check_point(base, {"trian.steps": "3"}, "params.yaml")


def test_cli_rejects_a_bad_point_before_queueing(tmp_path: Path) -> None:
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    proc = subprocess.run(
        [sys.executable, "-m", "flows.sweep", "--repo", str(tmp_path), "-S", "retrieval.top_k=3,0"],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert proc.returncode == 2
    assert "retrieval.top_k=0" in proc.stderr and "retrieval.top_k: must be >= 1, got 0" in proc.stderr


def test_cli_names_a_duplicate_key_in_params_before_queueing(tmp_path: Path) -> None:
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text() + "train:\n  steps: 3\n")
    proc = subprocess.run(
        [sys.executable, "-m", "flows.sweep", "--repo", str(tmp_path), "-S", "train.seed=1,2"],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert proc.returncode == 2
    assert "duplicate key 'train'" in proc.stderr


def test_render_aligns_columns() -> None:
    text = render([{"experiment": "HEAD", "train.seed": "", "grpo.em": 0.25},
                   {"experiment": "s-0", "train.seed": "1", "grpo.em": 0.3}])
    lines = text.splitlines()
    assert lines[0].split() == ["experiment", "train.seed", "grpo.em"]
    assert lines[3].split() == ["s-0", "1", "0.3000"]


def _states(*snapshots: dict[str, str]):
    """A read_states that returns each snapshot in turn, then the last one forever."""
    it = iter(snapshots)
    return lambda: next(it, snapshots[-1])


def test_wait_for_queue_returns_once_every_experiment_finished() -> None:
    from flows.sweep import wait_for_queue

    log: list[str] = []
    read = _states({"s-0": "Queued", "s-1": "Queued"}, {"s-0": "Running", "s-1": "Queued"},
                   {"s-0": "Success", "s-1": "Running"}, {"s-0": "Success", "s-1": "Failed", "other": "Queued"})
    states = wait_for_queue(["s-0", "s-1"], read, poll_s=1, log=log.append, sleep=lambda s: None)
    assert states == {"s-0": "Success", "s-1": "Failed"}
    assert log[-1] == "experiment s-1: Failed" and "experiment s-0: Running" in log


def test_wait_for_queue_fails_instead_of_hanging() -> None:
    from flows.sweep import QueueStalled, wait_for_queue

    # the worker stopped after the first experiment: the second stays queued
    read = _states({"s-0": "Running", "s-1": "Queued"}, {"s-0": "Success", "s-1": "Queued"})
    with pytest.raises(QueueStalled, match=r"\['s-1'\] still queued, and no experiment has run for 60 s"):
        wait_for_queue(["s-0", "s-1"], read, poll_s=5, stall_s=60, log=lambda m: None, sleep=lambda s: None)
    # someone removed a queued experiment
    read = _states({"s-0": "Running", "s-1": "Queued"}, {"s-0": "Running"})
    with pytest.raises(QueueStalled, match=r"\['s-1'\] left the DVC queue"):
        wait_for_queue(["s-0", "s-1"], read, log=lambda m: None, sleep=lambda s: None)


def test_table_keeps_each_evaluation_apart_and_drops_unchanged_other_pipelines() -> None:
    from agent_r1.compare import Row
    from flows.sweep import table_rows

    def diff(grpo_new: float) -> list[Row]:
        return [
            Row("param", "params.yaml", "train.seed", 0, 1),
            Row("metric", "metrics/eval/grpo.json", "em", 0.1667, grpo_new),
            Row("metric", "metrics/eval/sft.json", "em", 0.1533, 0.1533),
            Row("metric", "metrics/train/grpo.json", "em", 0.0, 0.5),  # training metrics: not in the table
            # the paper pipeline's GRPO preset: same file stem as the default GRPO, unchanged by the sweep
            Row("metric", "paper/metrics/eval/grpo.json", "em", 0.1667, 0.1667),
            Row("metric", "paper/metrics/eval/rloo.json", "em", 0.16, 0.16 if grpo_new < 0.2 else 0.2),
        ]

    rows = table_rows("HEAD", ["s-0", "s-1"], [{"train.seed": "1"}, {"train.seed": "2"}], [diff(0.2067), diff(0.1733)])
    assert rows[0] == {"experiment": "HEAD", "train.seed": "", "grpo.em": 0.1667, "sft.em": 0.1533,
                       "paper/rloo.em": 0.16}
    assert rows[1] == {"experiment": "s-0", "train.seed": "1", "grpo.em": 0.2067, "sft.em": 0.1533,
                       "paper/rloo.em": 0.2}
    assert rows[2]["grpo.em"] == 0.1733 and rows[2]["paper/rloo.em"] == 0.16
