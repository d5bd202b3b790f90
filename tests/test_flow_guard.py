"""One flow at a time, and none leaves orphans: the real flow CLI, a real Prefect
server, a tiny DVC repo whose stage stands in for training (it heartbeats while a
``hold`` file exists and starts a child that leaves its process group and session,
as a detached rank or helper could)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_schedule import POLLS, wait_for

from tasks.dvc_stage import stage_env

ROOT = Path(__file__).resolve().parents[1]

STAGE = '''\
import os, subprocess, sys, time
from pathlib import Path

with open("starts.log", "a") as f:
    f.write(f"{os.getpid()}\\n")
child = subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); "
                          "open('child.pid', 'w').write(str(os.getpid())); time.sleep(600)"])
for _ in range(6000):  # bounded: an orphan left by a broken flow does not run for ever
    if not Path("hold").exists():
        break
    Path("heartbeat").write_text(str(time.time()))
    time.sleep(0.1)
child.kill()
Path("out.txt").write_text("done\\n")
'''
DVC_YAML = "stages:\n  slow:\n    cmd: python stage.py\n    deps: [stage.py]\n    outs: [out.txt]\n"


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env or stage_env(), capture_output=True, text=True)


def tiny_repo(repo: Path) -> Path:
    repo.mkdir()
    (repo / "stage.py").write_text(STAGE)
    (repo / "dvc.yaml").write_text(DVC_YAML)
    shutil.copy(ROOT / "params.yaml", repo / "params.yaml")  # what the flows' CLIs validate
    for cmd in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"],
                ["git", "add", "-A"], ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tiny"]):
        assert run(cmd, repo).returncode == 0, cmd
    return repo


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of ``pid``, None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()
    except OSError:
        return None
    return fields[0].decode(), int(fields[1]), int(fields[19])


def descendants(root: int) -> dict[int, int]:
    """``{pid: start time}`` of every live process below ``root``."""
    stats = {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := proc_stat(int(p)))}
    found, todo = {}, [root]
    while todo:
        parent = todo.pop()
        for pid, (state, ppid, start) in stats.items():
            if ppid == parent and state != "Z":
                found[pid] = start
                todo.append(pid)
    return found


def alive(pid: int, start: int) -> bool:
    stat = proc_stat(pid)
    return stat is not None and stat[2] == start and stat[0] != "Z"  # same process (no pid reuse), not a zombie


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "?"


@pytest.fixture(scope="module")
def flow(tmp_path_factory: pytest.TempPathFactory, prefect_api) -> Iterator[tuple[subprocess.Popen, Path, dict[str, str]]]:
    """`python -m flows.pipeline slow` running in a tiny repo, its stage holding (the session's Prefect server)."""
    folder = tmp_path_factory.mktemp("guard")
    repo = tiny_repo(folder / "repo")
    (repo / "hold").touch()
    api, server_env = prefect_api
    env = {**server_env, "PREFECT_API_URL": api, "PYTHONPATH": str(ROOT)}
    log = open(folder / "flow.log", "w")
    first = subprocess.Popen([sys.executable, "-m", "flows.pipeline", "slow", "--repo", str(repo)],
                             cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: (repo / "child.pid").exists() and (repo / "heartbeat").exists(),
                 "the stage to start", first)
        yield first, repo, env
    finally:
        first.kill()
        first.wait()
        log.close()
        # the old flow left orphans: end them here, not let them hold the repo for 10 min
        leftovers = [int(p) for p in (repo / "starts.log").read_text().split()] if (repo / "starts.log").exists() else []
        if (repo / "child.pid").exists():
            leftovers.append(int((repo / "child.pid").read_text()))
        for pid in leftovers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_second_run_fails_at_once_naming_the_running_one(flow) -> None:
    first, repo, env = flow
    starts = (repo / "starts.log").read_text()

    def refused(cmd: list[str]) -> str:
        proc = run(cmd, ROOT, env)
        assert proc.returncode != 0, f"{cmd} ran beside the running flow:\n{proc.stdout}\n{proc.stderr}"
        return proc.stderr

    # a second `make run` / `make paper` / sweep: refused before Prefect or DVC is touched
    for cmd in (["flows.pipeline", "slow"], ["flows.pipeline", "--paper"], ["flows.sweep", "-S", "train.seed=1,2"]):
        err = refused([sys.executable, "-m", *cmd, "--repo", str(repo)])
        assert f"another flow is already running in {repo}: pid {first.pid} on {socket.gethostname()}" in err, err
        assert "python -m flows.pipeline slow --repo" in err and ", started 20" in err, err
        assert "Traceback" not in err and "Beginning flow run" not in err, err  # no Prefect run was even created
    # a scheduled run (the flow itself, started by Prefect's runner, no CLI): refused as it starts
    err = refused([sys.executable, "-c", f"from flows.pipeline import pipeline; pipeline(['slow'], repo={str(repo)!r})"])
    assert f"another flow is already running in {repo}: pid {first.pid}" in err and "Prefect flow run '" in err, err

    # nothing changed: the first run's stage still runs, started once; no second stage, no output
    assert first.poll() is None
    assert (repo / "starts.log").read_text() == starts and len(starts.split()) == 1
    assert not (repo / "out.txt").exists()
    assert not (repo / ".dvc" / "tmp" / "exps").exists()  # the sweep queued nothing


def test_kill_9_of_the_flow_ends_dvc_and_its_stage(flow) -> None:
    first, repo, env = flow
    tree = descendants(first.pid)
    stage_pid, child_pid = int((repo / "starts.log").read_text().split()[0]), int((repo / "child.pid").read_text())
    # the tree holds what a kill must end: `dvc repro`, the stage, and the child that left its session
    assert stage_pid in tree and child_pid in tree, {p: cmdline(p) for p in tree}
    assert any("dvc repro --single-item slow" in cmdline(p) for p in tree), {p: cmdline(p) for p in tree}

    first.send_signal(signal.SIGKILL)
    first.wait()
    for _ in range(POLLS):
        left = {p: cmdline(p) for p, start in tree.items() if alive(p, start)}
        if not left:
            break
        time.sleep(0.5)
    assert not left, f"still running after the flow was killed: {left}"

    # the next run is not blocked by DVC's lock (nor by the flow's): it runs the stage to the end
    (repo / "hold").unlink()
    second = run([sys.executable, "-m", "flows.pipeline", "slow", "--repo", str(repo)], ROOT, env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert (repo / "out.txt").read_text() == "done\n"
    assert len((repo / "starts.log").read_text().split()) == 2
