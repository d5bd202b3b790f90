"""One flow at a time per DVC repository.

Two flows driving ``dvc repro`` in one repository would race on the same outputs,
and the second would stall or fail midway on DVC's own lock, having already
started stages. The first flow holds an exclusive ``flock`` on
``.dvc/tmp/agent-r1-flow.lock``; a second one fails at once, before it touches
anything, with the holder's pid, command, start time and host, which the holder
writes into the file. The kernel drops the lock when the holder exits, however it
exits (``kill -9`` included), so there is never a stale lock to clean up.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime, timezone
from pathlib import Path

LOCK_FILE = Path(".dvc") / "tmp" / "agent-r1-flow.lock"


class FlowAlreadyRunning(RuntimeError):
    """Another flow holds the repository's lock."""


# Lock file -> [fd, depth] of the locks this process holds: the flow body re-enters
# the lock its CLI took (a second flock on a new descriptor would block on our own lock).
_held: dict[Path, list[int]] = {}


def dvc_root(repo: str | Path) -> Path:
    """The DVC repository ``repo`` is in (the folder holding ``.dvc``), as `dvc` itself finds it."""
    start = Path(repo).resolve()
    for folder in (start, *start.parents):
        if (folder / ".dvc").is_dir():
            return folder
    raise FileNotFoundError(f"{start} is not inside a DVC repository (no .dvc folder in it or above it)")


def holder_info(flow_run: str | None) -> dict[str, object]:
    return {
        "pid": os.getpid(),
        "command": shlex.join(sys.orig_argv),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "flow_run": flow_run,
    }


def describe(info: dict[str, object]) -> str:
    run = f", Prefect flow run {info['flow_run']!r}" if info.get("flow_run") else ""
    return f"pid {info['pid']} on {info['host']}, started {info['started']}{run}: {info['command']}"


def read_holder(path: Path) -> dict[str, object] | None:
    """The holder's info; None if it has not written it yet (it writes right after locking)."""
    for _ in range(20):
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            time.sleep(0.05)
    return None


def _write(fd: int, info: dict[str, object]) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(info).encode(), 0)


@contextmanager
def exclusive_run(repo: str | Path, flow_run: str | None = None) -> Iterator[Path]:
    """Hold the repository's flow lock for the block, or raise FlowAlreadyRunning naming the holder.

    Re-entrant within a process; ``flow_run`` (the Prefect run's name) is added to the
    holder's info when the flow body re-enters the lock its CLI took."""
    path = dvc_root(repo) / LOCK_FILE
    if path in _held:
        fd = _held[path][0]
        if flow_run:
            info = read_holder(path) or holder_info(None)
            _write(fd, {**info, "flow_run": flow_run})
        _held[path][1] += 1
        try:
            yield path
        finally:
            _held[path][1] -= 1
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        info = read_holder(path)
        who = describe(info) if info else "a process that has not said who it is yet"
        raise FlowAlreadyRunning(
            f"another flow is already running in {path.parent.parent.parent}: {who}. Nothing was started; "
            "wait for it to finish, or stop it first."
        ) from None
    _write(fd, holder_info(flow_run))
    _held[path] = [fd, 1]
    try:
        yield path
    finally:
        del _held[path]
        os.ftruncate(fd, 0)  # the lock is free: nobody to name
        os.close(fd)  # releases the flock


@contextmanager
def cli_lock(repo: str | Path) -> Iterator[None]:
    """exclusive_run for a command line: a refusal exits with the message (status 1), no traceback."""
    with ExitStack() as stack:
        try:
            stack.enter_context(exclusive_run(repo))
        except (FlowAlreadyRunning, FileNotFoundError) as exc:
            raise SystemExit(f"error: {exc}") from None
        yield


def flow_run_name() -> str | None:
    """The Prefect flow run executing this code, if any (a scheduled run has no CLI to name it)."""
    from prefect.runtime import flow_run

    return flow_run.name
