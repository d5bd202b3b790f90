"""The Python sandbox under attack: each test is one way model-written code could escape,
exhaust the machine or lose the run, and names what stops it."""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_r1.env.sandbox import UID_BASE, PythonSandbox, SandboxLimits

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(os.geteuid() != 0 and not Path("/proc/self/ns/user").exists(),
                                reason="needs root or user namespaces")


@pytest.fixture
def box() -> Iterator[PythonSandbox]:
    sandbox = PythonSandbox(SandboxLimits(call_timeout_s=3, cpu_s=5, memory_mb=256, file_mb=4, nproc=8))
    yield sandbox
    sandbox.close()


def sandbox_processes() -> list[int]:
    """Pids of every live process run by a sandbox user (uid >= UID_BASE)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
        state = next(line for line in status.splitlines() if line.startswith("State:")).split()[1]
        if uid >= UID_BASE and state != "Z":
            pids.append(int(pid))
    return pids


def test_state_persists_across_calls_and_a_trailing_expression_is_shown(box: PythonSandbox) -> None:
    assert box.run("import math\nx = 6").output == ""
    result = box.run("def f(n):\n    return math.factorial(n)\nprint('x is', x)\nf(x) + 0")
    assert (result.status, result.output) == ("ok", "x is 6\n720\n")
    error = box.run("undefined_name + 1")
    assert error.status == "error" and "NameError: name 'undefined_name' is not defined" in error.output
    assert "sandbox_child" not in error.output  # the traceback shows the code's frames only
    assert box.run("x").output == "6\n"  # an error loses nothing


def test_an_infinite_loop_times_out_and_the_next_call_starts_afresh(box: PythonSandbox) -> None:
    """Stopped by: the per-call wall-clock timeout, which kills the interpreter's namespace."""
    box.run("x = 1")
    result = box.run("while True:\n    pass")
    assert result.status == "timeout" and "timed out after 3 s" in result.output and "lost" in result.output
    again = box.run("x")
    assert again.status == "error" and "NameError" in again.output
    assert box.run("1 + 1").output == "2\n"


def test_a_fork_bomb_is_capped_and_nothing_it_started_survives_close(box: PythonSandbox) -> None:
    """Stopped by: RLIMIT_NPROC on the sandbox's own user; close() kills the PID namespace's init,
    which takes every process in it, even those that left their session."""
    code = (
        "import os, time\n"
        "kids = 0\n"
        "try:\n"
        "    for _ in range(1000):\n"
        "        if os.fork() == 0:\n"
        "            os.setsid()\n"
        "            time.sleep(600)\n"
        "            os._exit(0)\n"
        "        kids += 1\n"
        "except OSError as e:\n"
        "    print('fork refused after', kids, type(e).__name__)\n"
    )
    result = box.run(code)
    assert result.status == "ok" and "fork refused after" in result.output, result.output
    assert int(result.output.split()[3]) < 8
    assert sandbox_processes(), "the sleeping children should be running until close"
    box.close()
    assert sandbox_processes() == []


def test_a_large_allocation_fails_inside_the_sandbox(box: PythonSandbox) -> None:
    """Stopped by: RLIMIT_AS (256 MB here): MemoryError, and the interpreter lives on."""
    result = box.run("x = bytearray(1024 * 1024 * 1024)")
    assert result.status == "error" and "MemoryError" in result.output
    assert box.run("y = 41\ny + 1").output == "42\n"


def test_huge_output_is_cut_to_its_head_and_tail(box: PythonSandbox) -> None:
    """Stopped by: the output buffer, which keeps the first and last output_chars only."""
    result = box.run("print('start'); print('x' * 10_000_000); print('end')")
    assert result.status == "ok" and result.output.startswith("start\n") and result.output.endswith("end\n")
    assert len(result.output) < 2 * 2000 + 100 and f"[{6 + 10_000_001 + 4 - 4000} characters cut]" in result.output


def test_no_network_not_even_the_hosts_loopback(box: PythonSandbox) -> None:
    """Stopped by: a network namespace of its own (its loopback is down)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        result = box.run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)")
        assert result.status == "error" and "Network is unreachable" in result.output, result.output
        result = box.run("import socket\nsocket.getaddrinfo('example.com', 80)")
        assert result.status == "error" and "gaierror" in result.output
    finally:
        server.close()


def test_writes_outside_its_directory_are_refused_and_its_tmp_is_private(box: PythonSandbox, tmp_path: Path) -> None:
    """Stopped by: an unprivileged user of its own (the repository, the caller's home are not writable) and
    private tmpfs at /tmp, /var/tmp and /dev/shm."""
    for target in (ROOT / "escaped.txt", Path.home() / "escaped.txt", Path("/etc/escaped.txt")):
        result = box.run(f"open({str(target)!r}, 'w').write('x')")
        # refused, or not even there (a repository under /tmp is hidden by the private /tmp)
        assert result.status == "error" and ("PermissionError" in result.output or "FileNotFoundError" in result.output), (target, result.output)
        assert not target.exists()
    name = f"sandbox-{os.getpid()}.txt"
    assert box.run(f"import os\nopen('/tmp/{name}', 'w').write('inside')\nos.getcwd()").output == "'/tmp'\n"
    assert not (Path("/tmp") / name).exists()  # the host's /tmp never saw it


def test_a_file_larger_than_its_limit_cannot_be_written(box: PythonSandbox) -> None:
    """Stopped by: RLIMIT_FSIZE (4 MB here): the write fails, the interpreter lives on."""
    result = box.run("f = open('big', 'wb')\nf.write(b'0' * (8 * 1024 * 1024))\nf.close()")
    assert result.status == "error" and "File too large" in result.output, result.output
    assert box.run("import os\nos.path.getsize('big') <= 4 * 1024 * 1024").output == "True\n"


def test_the_trainers_environment_and_processes_are_out_of_sight(box: PythonSandbox, monkeypatch) -> None:
    """Stopped by: a minimal environment, and a PID namespace whose /proc shows only its own processes."""
    monkeypatch.setenv("AGENT_R1_TEST_SECRET", "hunter2")
    box.close()  # the next call starts an interpreter after the variable is set
    result = box.run("import os\nsorted(os.environ)")
    assert "AGENT_R1_TEST_SECRET" not in result.output and "hunter2" not in result.output
    pids = box.run("import os\nsorted(int(p) for p in os.listdir('/proc') if p.isdigit())").output
    assert eval(pids) == [1, 2]  # its namespace's init and itself
    result = box.run(f"open('/proc/{os.getpid()}/environ').read()")
    assert result.status == "error" and "hunter2" not in result.output


def test_a_cpu_hog_is_stopped_at_its_cpu_limit_even_within_the_call_time() -> None:
    """Stopped by: RLIMIT_CPU (1 s here, under a 20 s call timeout): the interpreter is killed by
    SIGXCPU, the agent is told so, and the next call starts afresh."""
    box = PythonSandbox(SandboxLimits(call_timeout_s=20, cpu_s=1))
    try:
        result = box.run("while True:\n    pass")
        assert result.status == "crashed" and "CPU limit" in result.output, result.output
        assert box.run("2 ** 10").output == "1024\n"
    finally:
        box.close()


# Garbage into every open descriptor past stdio: the reply pipe is one of them, whatever its number.
GARBAGE_INTO_EVERY_FD = """import os
for fd in map(int, os.listdir('/proc/self/fd')):
    if fd > 2:
        try:
            os.write(fd, b'garbage, not a reply')
        except OSError:
            pass"""


def test_the_code_killing_its_own_interpreter_is_a_crash_the_run_survives(box: PythonSandbox) -> None:
    for code in ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "import os\nos._exit(3)", GARBAGE_INTO_EVERY_FD):
        result = box.run(code)
        assert result.status in ("crashed", "timeout") and "next call starts afresh" in result.output, (code, result)
        assert box.run("'alive'").output == "'alive'\n"


def test_two_replies_already_in_the_pipe_are_read_one_at_a_time() -> None:
    """The bootstrap's and the interpreter's start replies can both be waiting when the caller
    first reads (a loaded machine): reading the first must leave the second in the pipe."""
    box = PythonSandbox()
    read_end, write_end = os.pipe()
    try:
        for message in ({"init": 7}, {"ready": True}):
            data = json.dumps(message).encode()
            os.write(write_end, struct.pack(">I", len(data)) + data)
        box.reply_fd = read_end
        deadline = time.monotonic() + 5
        assert box._read_reply(deadline) == {"init": 7}
        assert box._read_reply(deadline) == {"ready": True}
    finally:
        os.close(write_end)
        box.close()  # closes read_end


@pytest.mark.parametrize("first", ["init", "ready"])
def test_the_start_reads_both_hellos_in_either_order(first: str) -> None:
    """The bootstrap's {"init": pid} and the interpreter's {"ready": true} come from two processes:
    on a loaded machine the second can come first. Both are read at the start, so neither is
    left in the pipe to be taken for the first call's reply."""
    messages = {"init": {"init": 1234}, "ready": {"ready": True}}
    order = [first, *(k for k in messages if k != first)]
    read_end, write_end = os.pipe()
    for key in [*order, "next"]:
        data = json.dumps(messages.get(key, {"out": "", "chars": 0, "error": None})).encode()
        os.write(write_end, struct.pack(">I", len(data)) + data)
    box = PythonSandbox()
    box.reply_fd = read_end
    try:
        assert box._handshake(time.monotonic() + 5) == (messages["init"], messages["ready"])
        assert box._read_reply(time.monotonic() + 5) == {"out": "", "chars": 0, "error": None}
    finally:
        os.close(write_end)
        box.close()


def test_a_start_that_fails_before_init_is_not_waited_on() -> None:
    """A sandbox that cannot confine itself says so at once, with no init to wait for."""
    read_end, write_end = os.pipe()
    refused = {"ready": False, "error": "cannot isolate the sandbox: [Errno 1] Operation not permitted"}
    data = json.dumps(refused).encode()
    os.write(write_end, struct.pack(">I", len(data)) + data)
    box = PythonSandbox()
    box.reply_fd = read_end
    try:
        assert box._handshake(time.monotonic() + 5) == (None, refused)
    finally:
        os.close(write_end)
        box.close()
