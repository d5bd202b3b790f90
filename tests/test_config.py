"""The params schema: every bad key is named, before any work starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agent_r1.config import Params, ParamsError, load_params, parse_params

ROOT = Path(__file__).resolve().parents[1]


def test_repo_params_file_is_valid() -> None:
    params = load_params(ROOT / "params.yaml")
    assert params.data.source == "synthetic"
    # params.yaml spells out every knob: the file and the schema's defaults agree on the key set.
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert set(raw) == set(Params.model_fields)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"retrieval": {"top_k": 0}}, "retrieval.top_k: must be >= 1, got 0"),
        ({"data": {"source": "wiki"}}, "data.source: must be one of"),
        ({"retrieval": {"topk": 3}}, "retrieval.topk: unknown key"),
        ({"trainn": {}}, "trainn: unknown key"),
        ({"data": {"synthetic": {"n_train": "many"}}}, "data.synthetic.n_train:"),
        ({"env": {"reward": {"process": {"cap": 2}}}}, "env.reward.process.cap: must be <= 1"),
        ({"data": {"real": {"sha256": "abc"}}}, "data.real.sha256:"),
        ({"rollout": {"max_new_tokens": 4096}}, "max_new_tokens must be smaller"),
    ],
)
def test_bad_values_name_the_key(raw: dict, expected: str) -> None:
    with pytest.raises(ParamsError) as err:
        parse_params(raw, "p.yaml")
    assert expected in str(err.value)
    assert "p.yaml" in str(err.value)


def test_all_problems_reported_at_once() -> None:
    with pytest.raises(ParamsError) as err:
        parse_params({"retrieval": {"top_k": 0}, "data": {"source": "wiki"}})
    assert len(err.value.problems) == 2


def test_yaml_syntax_error_names_line(tmp_path: Path) -> None:
    bad = tmp_path / "params.yaml"
    bad.write_text("data:\n  source: synthetic\n  seed: [1, 2\n")
    with pytest.raises(ParamsError, match="line"):
        load_params(bad)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ParamsError, match="file not found"):
        load_params(tmp_path / "nope.yaml")


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    f = tmp_path / "params.yaml"
    f.write_text("")
    assert load_params(f) == Params()


@pytest.mark.parametrize(
    ("content", "code", "needle"),
    [
        ("retrieval:\n  top_k: 0\n", 2, "retrieval.top_k: must be >= 1, got 0"),
        ("data:\n  source: wiki\n", 2, "data.source"),
        ("retrieval:\n  top_k: 5\n", 0, "ok"),
    ],
)
def test_cli_params_check(tmp_path: Path, content: str, code: int, needle: str) -> None:
    f = tmp_path / "params.yaml"
    f.write_text(content)
    proc = subprocess.run(
        [sys.executable, "-m", "agent_r1.cli", "params", "check", str(f)], capture_output=True, text=True
    )
    assert proc.returncode == code
    assert needle in proc.stdout + proc.stderr


def test_stage_rejects_bad_params_before_work(tmp_path: Path) -> None:
    """A stage with a bad params file exits 2 with the key named and writes nothing."""
    (tmp_path / "params.yaml").write_text("retrieval:\n  top_k: 0\n")
    proc = subprocess.run(
        [sys.executable, "-m", "agent_r1.stages.index"], cwd=tmp_path, capture_output=True, text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 2
    assert "retrieval.top_k: must be >= 1, got 0" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]
