"""A persistent Python interpreter for model-written code, run under OS limits.

:class:`PythonSandbox` is one episode's interpreter: its variables carry from one
call to the next, and it is started on the first call (most episodes never run
code) and killed by :meth:`PythonSandbox.close`. What confines it is set up by the
interpreter's own process before any code runs (``sandbox_child.py``): resource
limits, no network, a private /tmp, its own PID namespace (killing it kills
everything it started) and an unprivileged user. The caller sees three outcomes
of a call, all of them observations for the agent, never exceptions: the output
(with the traceback if the code raised), a timeout (the interpreter is killed and
its state lost; the next call starts a fresh one), or a crash (a limit killed it).
Only a machine that cannot isolate the interpreter at all raises
:class:`~agent_r1.errors.ToolInfrastructureError`: the run stops instead of
executing model output unconfined.

Not confined: files the whole machine may read stay readable (no filesystem is
hidden, only made unwritable), and CPU time is bounded per process by
``cpu_s`` and per call by ``call_timeout_s``.
"""

from __future__ import annotations

import json
import os
import select
import signal
import struct
import subprocess
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from agent_r1.errors import ToolInfrastructureError

CHILD = Path(__file__).with_name("sandbox_child.py")
MAX_REPLY_BYTES = 1 << 20  # a reply holds 2 x output_chars of text and a traceback
UID_BASE = 100_000  # as root, interpreter n runs as uid UID_BASE + its bootstrap's pid: a user of its own


@dataclass(frozen=True)
class SandboxLimits:
    call_timeout_s: float = 5.0  # wall clock per call: then the interpreter is killed, state lost
    cpu_s: int = 30  # CPU seconds per process of the interpreter (RLIMIT_CPU)
    memory_mb: int = 512  # address space per process (RLIMIT_AS)
    file_mb: int = 16  # largest file it may write (RLIMIT_FSIZE); its tmpfs holds 4x this
    nproc: int = 16  # processes and threads at once (RLIMIT_NPROC)
    nofile: int = 64  # open files per process (RLIMIT_NOFILE)
    output_chars: int = 2000  # the observation keeps the first and last this many characters


@dataclass(frozen=True)
class RunResult:
    output: str  # what the code printed, its trailing expression's repr, and any traceback
    status: str  # "ok", "error" (the code raised), "timeout", "crashed"
    cut_chars: int = 0  # characters of output left out of ``output``

    def observation(self) -> str:
        return self.output if self.output else ("(no output)" if self.status == "ok" else "")


def _cut(head_and_tail: str, total: int, limit: int) -> tuple[str, int]:
    """First and last ``limit`` characters of an output of ``total``, the cut marked."""
    if total <= 2 * limit:
        return head_and_tail, 0
    cut = total - 2 * limit
    return f"{head_and_tail[:limit]}\n...[{cut} characters cut]...\n{head_and_tail[limit:]}", cut


class PythonSandbox:
    def __init__(self, limits: SandboxLimits = SandboxLimits()):
        self.limits = limits
        self.proc: subprocess.Popen | None = None
        self.init_pid: int | None = None  # the PID namespace's init, as the host numbers it
        self.reply_fd = -1

    def run(self, code: str) -> RunResult:
        """Run ``code`` in this episode's interpreter (started on first use)."""
        if self.proc is None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None
        data = json.dumps({"code": code}).encode()
        deadline = time.monotonic() + self.limits.call_timeout_s
        try:
            self.proc.stdin.write(struct.pack(">I", len(data)) + data)
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # it died: the reply read says how
        reply = self._read_reply(deadline)
        if reply is None:
            return self._lost(timed_out=time.monotonic() >= deadline)
        output, cut = _cut(reply["out"], reply["chars"], self.limits.output_chars)
        if reply["error"]:
            output += reply["error"]
        return RunResult(output, "error" if reply["error"] else "ok", cut)

    def _lost(self, timed_out: bool) -> RunResult:
        """The interpreter gave no answer: kill what is left; say why, and that its state is gone."""
        code = None if timed_out else self._exit_code()
        self.close()
        if timed_out:
            why = f"timed out after {self.limits.call_timeout_s:g} s"
        elif code is not None and code > 128 and (name := _signal_name(code - 128)):
            why = {"SIGXCPU": f"stopped at its CPU limit ({self.limits.cpu_s} s)"}.get(name, f"killed by {name}")
        else:
            why = f"exited (code {code})"
        return RunResult(f"Error: the interpreter {why}; its variables are lost and the next call starts afresh.",
                         "timeout" if timed_out else "crashed")

    # ------------------------------------------------------------ lifecycle
    def _start(self) -> None:
        reply_r, reply_w = os.pipe()
        env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
               "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        limits = {**asdict(self.limits), "uid_base": UID_BASE, "reply_fd": reply_w, "paths": library_paths()}
        try:  # no preexec_fn (not safe with threads): the child confines itself first thing
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(CHILD), json.dumps(limits)],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=(reply_w,), env=env, cwd="/", start_new_session=True,
            )
        finally:
            os.close(reply_w)
        self.reply_fd = reply_r
        init, hello = self._handshake(time.monotonic() + 60)
        self.init_pid = init.get("init") if init else None
        if hello is None or not hello.get("ready"):
            why = hello.get("error") if hello else f"it exited with code {self._exit_code()}"
            self.close()
            raise ToolInfrastructureError(f"python sandbox: {why}")

    def _handshake(self, deadline: float) -> tuple[dict | None, dict | None]:
        """The bootstrap's ``{"init": pid}`` and the interpreter's hello (ready, or an error), in
        whichever order they come: two processes write them, and on a loaded machine the hello can
        come first. Both are read here, so neither is left in the pipe to be taken for a reply."""
        init = hello = None
        while hello is None or (init is None and hello.get("ready")):
            reply = self._read_reply(deadline)
            if reply is None:
                break
            if "init" in reply:
                init = reply
            else:
                hello = reply
        return init, hello

    def _read_reply(self, deadline: float) -> dict | None:
        """One length-prefixed JSON reply, or None at the deadline or if the interpreter is gone."""
        buf = b""
        need = 4
        while len(buf) < need:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([self.reply_fd], [], [], wait)[0]:
                return None
            # never past this reply: the next one (init's, then the interpreter's) may already be in the pipe
            chunk = os.read(self.reply_fd, min(need - len(buf), 1 << 16))
            if not chunk:
                return None
            buf += chunk
            if need == 4 and len(buf) >= 4:
                need = 4 + struct.unpack(">I", buf[:4])[0]
                if need > MAX_REPLY_BYTES:
                    return None  # not a reply: the code wrote into the reply pipe
        try:
            return json.loads(buf[4:need])
        except ValueError:
            return None  # something wrote into the reply pipe: treated as a crash

    def _exit_code(self) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        """Kill the interpreter and everything it started (its namespace's PID 1 dies with it)."""
        if self.proc is not None:
            if self.init_pid and self.proc.poll() is None:  # alive: it has not reaped init, so the pid is init's
                # the namespace's init first: the bootstrap exits once it is reaped, and the kernel
                # reaps a namespace's init only after every other process in it is gone
                try:
                    os.kill(self.init_pid, signal.SIGKILL)
                    self.proc.wait(timeout=10)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    pass
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            self.init_pid = None
            if self.proc.stdin:
                try:
                    self.proc.stdin.close()
                except BrokenPipeError:
                    pass
            self.proc = None
        if self.reply_fd >= 0:
            os.close(self.reply_fd)
            self.reply_fd = -1

    def __del__(self) -> None:
        self.close()


def library_paths() -> list[str]:
    """This interpreter's standard library (with its compiled modules) and installed packages."""
    paths = sysconfig.get_paths()
    dynload = [p for p in sys.path if Path(p).name == "lib-dynload"]  # the compiled stdlib modules
    found = [paths["stdlib"], *dynload, paths["purelib"], paths["platlib"]]
    return [p for i, p in enumerate(found) if Path(p).is_dir() and p not in found[:i]]


def _signal_name(number: int) -> str | None:
    try:
        return signal.Signals(number).name
    except ValueError:
        return None
