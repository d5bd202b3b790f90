"""Atomic writes: temp work outside every output folder, durable, and cleaned after a kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_r1.io import SCRATCH, atomic_dir, atomic_path, hash_tree, write_json
from agent_r1.stages.common import run_stage

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty project root as the working directory (stages run from the project root)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_temp_work_never_lands_in_the_output_folder(project: Path) -> None:
    """While an index or a metrics file is being written, the folders later stages read
    (indexes/, metrics/eval/) hold only finished outputs; temp work is in the scratch folder."""
    write_json("metrics/eval/a.json", {"em": 1.0})
    with atomic_dir("indexes/bm25") as tmp:
        (tmp / "index.json").write_text("{}")
        assert tmp.parent == project / SCRATCH
        assert os.listdir(project / "indexes") == []
    with atomic_path("metrics/eval/b.json") as tmp:
        tmp.write_text("{}")
        assert tmp.parent == project / SCRATCH
        assert os.listdir(project / "metrics/eval") == ["a.json"]
    assert sorted(os.listdir(project / "indexes")) == ["bm25"]
    assert sorted(os.listdir(project / "metrics/eval")) == ["a.json", "b.json"]
    assert os.listdir(project / SCRATCH) == []


def test_a_killed_writer_leaves_nothing_in_outputs_and_the_next_stage_start_cleans_it(project: Path) -> None:
    """kill -9 in the middle of writing indexes/bm25: indexes/ stays clean (its DVC hash
    unchanged); the next stage's start removes the dead writer's temp folder, not a live one's."""
    code = (
        "import os, signal\n"
        "from agent_r1.io import atomic_dir\n"
        "with atomic_dir('indexes/bm25') as tmp:\n"
        "    (tmp / 'part').write_text('half an index')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    killed = subprocess.run([sys.executable, "-c", code], cwd=project, env=env)
    assert killed.returncode == -signal.SIGKILL
    assert os.listdir(project / "indexes") == []
    [leftover] = (project / SCRATCH).iterdir()
    assert (leftover / "part").read_text() == "half an index"

    writing = "from agent_r1.io import atomic_dir\nwith atomic_dir('indexes/dense'):\n    input()\n"
    live = subprocess.Popen([sys.executable, "-c", writing], cwd=project, env=env, stdin=subprocess.PIPE)
    try:  # a stage running alongside, in the middle of its write
        while len(busy := [p for p in (project / SCRATCH).iterdir() if p != leftover]) == 0:
            assert live.poll() is None, "the concurrent writer died"
            time.sleep(0.1)
        ran = []
        run_stage("probe", lambda params: ran.append(params), argv=["--params", str(ROOT / "params.yaml")])
        assert ran and not leftover.exists() and busy[0].is_dir()
    finally:
        live.communicate(b"\n")
    assert live.returncode == 0 and (project / "indexes" / "dense").is_dir()


def test_atomic_writes_are_fsynced_before_and_after_the_rename(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[tuple[str, str]] = []
    fsync, replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))), fsync(fd)))
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", str(a))), replace(a, b)))
    write_json("metrics/x.json", {"a": 1})
    [(_, tmp)] = [e for e in events if e[0] == "replace"]
    at = events.index(("replace", tmp))
    assert ("fsync", tmp) in events[:at]  # the data is on disk before the name points at it
    assert ("fsync", str((project / "metrics").resolve())) in events[at + 1 :]  # and so is the new name

    events.clear()
    with atomic_dir("models/m") as d:
        (d / "sub").mkdir()
        (d / "sub" / "w.bin").write_bytes(b"\0" * 10)
    synced = {p for kind, p in events if kind == "fsync"}
    assert {str(Path(d, "sub", "w.bin")), str(Path(d, "sub")), str(d)} <= synced


def test_hash_tree_sees_a_content_change_at_the_same_path_size_and_mtime(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    weights = model / "model.safetensors"
    weights.write_bytes(b"a" * 1000)
    (model / "config.json").write_text("{}")
    before, stat = hash_tree(model), weights.stat()
    weights.write_bytes(b"a" * 999 + b"b")
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert hash_tree(model) != before
    weights.write_bytes(b"a" * 1000)
    assert hash_tree(model) == before
    (model / "config.json").rename(model / "other.json")
    assert hash_tree(model) != before
