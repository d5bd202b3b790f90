"""`agent-r1 compare` on a real git + DVC repo holding two committed runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_r1.cli import main
from agent_r1.compare import collect, render

BIN = Path(sys.executable).parent


def sh(repo: Path, *cmd: str) -> None:
    env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", "GIT_AUTHOR_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def commit_run(repo: Path, lr: float, em: float, message: str) -> None:
    (repo / "params.yaml").write_text(f"train:\n  actor_lr: {lr}\n  steps: 6\nalgorithm:\n  name: grpo\n")
    (repo / "metrics").mkdir(exist_ok=True)
    (repo / "metrics/grpo.json").write_text(json.dumps({"em": em, "f1": em + 0.01, "n": 100}))
    (repo / "dvc.yaml").write_text(
        "stages:\n  train:\n    cmd: echo\n    params: [train, algorithm]\n"
        "    metrics:\n      - metrics/grpo.json:\n          cache: false\n"
    )
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "commit", "-qm", message)


@pytest.fixture()
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PATH", f"{BIN}:{os.environ.get('PATH', '')}")
    sh(tmp_path, "git", "init", "-q")
    sh(tmp_path, "dvc", "init", "-q")
    commit_run(tmp_path, 2e-5, 0.09, "first run")
    sh(tmp_path, "git", "tag", "first")
    commit_run(tmp_path, 1e-5, 0.14, "second run")
    return tmp_path


def test_compare_two_commits_shows_changed_params_and_metrics_only(repo: Path) -> None:
    rows = collect("first", "HEAD", repo=repo)
    by_key = {(r.kind, r.key): r for r in rows}
    assert by_key[("param", "train.actor_lr")].old == 2e-5 and by_key[("param", "train.actor_lr")].new == 1e-5
    assert by_key[("metric", "em")].delta == pytest.approx(0.05)
    assert ("param", "train.steps") not in by_key and ("metric", "n") not in by_key  # unchanged: left out
    table = render(rows, "first", "HEAD")
    assert "train.actor_lr" in table and "+0.05" in table and "metrics/grpo.json" in table
    everything = {(r.kind, r.key) for r in collect("first", "HEAD", repo=repo, all_rows=True)}
    assert ("param", "train.steps") in everything and ("metric", "n") in everything


def test_compare_cli_default_is_head_vs_workspace(repo: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.chdir(repo)
    assert main(["compare"]) == 0
    assert "no params or metrics differ between HEAD and workspace" in capsys.readouterr().out
    (repo / "params.yaml").write_text("train:\n  actor_lr: 3.0e-05\n  steps: 6\nalgorithm:\n  name: ppo\n")
    assert main(["compare"]) == 0
    out = capsys.readouterr().out
    assert "algorithm.name" in out and "ppo" in out and "grpo" in out


def test_compare_names_a_bad_revision(repo: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.chdir(repo)
    assert main(["compare", "no-such-rev", "HEAD"]) == 2
    assert "no-such-rev" in capsys.readouterr().err
