"""Run a command so that nothing it starts outlives the process that started it.

    python tasks/supervise.py PARENT_PID -- COMMAND [ARG...]

The flow starts ``dvc repro`` through this. A flow killed with ``kill -9`` cannot
clean up, and on its own `dvc` (holding DVC's repository lock), the stage's
shell and the stage (a training run, its DeepSpeed ranks) would keep running,
orphaned. Linux tells this supervisor when its parent dies
(``prctl(PR_SET_PDEATHSIG)``), and the supervisor then kills every process below
it. As a child subreaper (``PR_SET_CHILD_SUBREAPER``) it also adopts the
descendants whose own parent died first, whatever process group or session they
moved to, so none escapes. Standard library only: it starts before every stage.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


class ParentDied(Exception):
    pass


def prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value}) failed")


def parent_pids() -> dict[int, int]:
    """``{pid: parent pid}`` of every live (not zombie) process, from /proc."""
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # it exited meanwhile
        state, ppid = stat.rpartition(b")")[2].split()[:2]  # the name in (...) may hold spaces
        if state != b"Z":
            parents[int(entry)] = int(ppid)
    return parents


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, ppid in parent_pids().items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def reap() -> None:
    """Collect every exited child: the subreaper inherits its descendants' zombies."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def kill_descendants() -> int:
    """SIGKILL every process below this one until none is left (a process forking
    meanwhile leaves an orphan, which this subreaper adopts and the next pass kills)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the parent dying now changes nothing: all is being killed
    killed: set[int] = set()
    while pids := descendants(os.getpid()):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        reap()
        time.sleep(0.01)
    reap()
    return len(killed)


_parent_died = False


def on_parent_death(signum: int, frame: object) -> None:
    """Raise once. A parent dying can signal twice in a row (its thread exits, the
    supervisor is handed to a sibling thread, which exits too): a second raise
    landing in the ``except ParentDied`` block would end the supervisor before it
    kills anything, orphaning the stage."""
    global _parent_died
    if not _parent_died:
        _parent_died = True
        raise ParentDied()


def main(argv: list[str]) -> int:
    parent, sep, *cmd = argv
    if sep != "--" or not cmd:
        raise SystemExit("usage: supervise.py PARENT_PID -- COMMAND [ARG...]")
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    signal.signal(signal.SIGTERM, on_parent_death)
    # Ctrl-C reaches the whole foreground group: the command handles it (dvc stops the
    # stage and releases its locks). A Python handler, not SIG_IGN: that would be inherited.
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(parent):  # it died before the line above: no signal will come
        return 128 + signal.SIGTERM
    try:
        child = os.posix_spawnp(cmd[0], cmd, os.environ)
        while True:  # also collects adopted orphans' exits
            pid, status = os.waitpid(-1, 0)
            if pid == child:
                break
    except FileNotFoundError:
        print(f"supervise: {cmd[0]}: command not found", file=sys.stderr)
        return 127
    except ParentDied:
        kill_descendants()
        return 128 + signal.SIGTERM
    if left := kill_descendants():
        print(f"supervise: `{' '.join(cmd)}` exited, leaving {left} process(es) running: killed them", file=sys.stderr)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    code = main(sys.argv[1:])
    if code < 0:  # the command was killed by a signal: die of the same one, so the caller sees it
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        code = 128 - code  # a signal whose default action is not to terminate
    sys.exit(code)
