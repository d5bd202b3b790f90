"""The sandboxed interpreter's own side (standard library only; run as ``python -I -S THIS LIMITS_JSON``).

It starts as a fresh single-threaded process and, before any model-written code runs:

1. lowers its resource limits (CPU seconds, address space, file size, open files,
   processes, no core files): the kernel enforces them on it and on everything it starts;
2. moves into new network, mount and PID namespaces: only a loopback device that is
   down, private tmpfs at /tmp, /var/tmp and /dev/shm (the only world-writable places),
   a /proc that shows its own processes only, and the caller's library folders
   (``paths``: the standard library and installed packages) bound read-only under
   /tmp/.lib, readable wherever they are installed (a Python under /root, say);
3. forks PID 1 of that namespace, which dies with this process (``PR_SET_PDEATHSIG``);
   the kernel kills every process of a namespace whose PID 1 dies, so a fork that left
   its session or process group dies too. PID 1 forks the interpreter and reaps;
4. the interpreter drops to a user of its own (as root: ``uid_base`` + its pid, no groups,
   no capabilities; otherwise the caller's user, mapped into a user namespace), so
   the process limit counts only its own processes and nothing root-owned is writable.

Then it reads requests from stdin and answers on the fd the parent passed: length-prefixed JSON. Each
request's code runs in one persistent globals dict (state carries from call to call,
as in a notebook; a trailing expression's repr is echoed); ``print`` and
``sys.stderr`` go to a buffer that keeps the first and last ``output_chars`` only.
"""

from __future__ import annotations

import ast
import ctypes
import json
import os
import resource
import select
import signal
import struct
import sys
import traceback

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 2, 4, 8, 32, 4096
MS_REC, MS_PRIVATE = 0x4000, 0x40000
PR_SET_PDEATHSIG = 1
REPLY_FD = 3  # replaced by the fd the parent passed (limits["reply_fd"])
libc = ctypes.CDLL(None, use_errno=True)


def check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def write_file(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def own_threads() -> int:
    """Threads running as this uid (a process limit counts them all, the trainer's too)."""
    count, uid = 0, str(os.getuid())
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if fields.get("Uid", "").split()[:1] == [uid]:
            count += int(fields.get("Threads", "1"))
    return count


def set_limits(limits: dict) -> None:
    """As root the sandbox gets a user of its own, so its process limit is its own; otherwise the
    limit counts the caller's threads too, and is raised by as many."""
    mb = 1024 * 1024
    nproc = limits["nproc"] + (0 if os.geteuid() == 0 else own_threads())
    for rlimit, soft, hard in ((resource.RLIMIT_CORE, 0, 0), (resource.RLIMIT_CPU, limits["cpu_s"], limits["cpu_s"] + 1),
                               (resource.RLIMIT_AS, limits["memory_mb"] * mb, limits["memory_mb"] * mb),
                               (resource.RLIMIT_FSIZE, limits["file_mb"] * mb, limits["file_mb"] * mb),
                               (resource.RLIMIT_NOFILE, limits["nofile"], limits["nofile"]),
                               (resource.RLIMIT_NPROC, nproc, nproc)):
        resource.setrlimit(rlimit, (soft, hard))


def enter_namespaces() -> bool:
    """New network, mount and PID namespaces; True if a user namespace was needed (not root)."""
    if os.geteuid() == 0:
        check(libc.unshare(CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID), "unshare(net, mount, pid)")
        return False
    uid, gid = os.getuid(), os.getgid()
    check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID), "unshare(user, net, mount, pid)")
    write_file("/proc/self/setgroups", "deny")
    write_file("/proc/self/uid_map", f"{uid} {uid} 1")
    write_file("/proc/self/gid_map", f"{gid} {gid} 1")
    return True


def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = (lambda s: s.encode() if s is not None else None)
    check(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def private_filesystem(limits: dict) -> None:
    """Run as PID 1 of the new namespace: private tmpfs where anyone may write, this namespace's /proc."""
    mount("none", "/", None, MS_REC | MS_PRIVATE)
    # held open first: a library under /tmp (a venv there) is hidden once the private /tmp is mounted
    libraries = [os.open(path, os.O_RDONLY | os.O_DIRECTORY) for path in limits["paths"]]
    for target in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(target):
            mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"size={limits['file_mb'] * 4}m,mode=1777")
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.chdir("/tmp")
    for i, path in enumerate(limits["paths"]):  # e.g. under /root (mode 700): bound where its user can read
        target = f"/tmp/.lib/{i}"
        os.makedirs(target)
        mount(f"/proc/self/fd/{libraries[i]}", target, None, MS_BIND | MS_REC)
        mount("none", target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
        os.close(libraries[i])


def rebase_imports(paths: list[str]) -> None:
    """Import from the read-only binds: ``sys.path``, and the packages already imported (encodings)."""
    def moved(path: str) -> str:
        for i, prefix in enumerate(paths):
            if path == prefix or path.startswith(prefix + os.sep):
                return f"/tmp/.lib/{i}" + path[len(prefix):]
        return path

    sys.path[:] = [f"/tmp/.lib/{i}" for i in range(len(paths))]
    for module in list(sys.modules.values()):
        if isinstance(getattr(module, "__path__", None), list):
            module.__path__[:] = [moved(p) for p in module.__path__]
    sys.path_importer_cache.clear()


def drop_privileges(limits: dict, in_user_namespace: bool) -> None:
    if in_user_namespace:
        return  # already the caller's own unprivileged user, mapped to itself
    os.setgroups([])
    os.setgid(limits["uid"])
    os.setuid(limits["uid"])


class Capped:
    """A text stream that keeps the first and the last ``limit`` characters written to it."""

    def __init__(self, limit: int):
        self.limit, self.head, self.tail, self.total = limit, "", "", 0

    def write(self, text: str) -> int:
        text = str(text)
        self.total += len(text)
        if len(self.head) < self.limit:
            take = self.limit - len(self.head)
            self.head, text = self.head + text[:take], text[take:]
        if text:
            self.tail = (self.tail + text)[-self.limit :]
        return len(text)

    def flush(self) -> None:
        pass

    def text(self) -> str:
        return self.head + self.tail


def read_message(stream) -> dict | None:
    header = stream.read(4)
    if len(header) < 4:
        return None
    (n,) = struct.unpack(">I", header)
    return json.loads(stream.read(n))


def send(message: dict) -> None:
    data = json.dumps(message).encode()
    os.write(REPLY_FD, struct.pack(">I", len(data)) + data)  # < PIPE_BUF or not, one reader: no interleaving


def run_code(code: str, scope: dict, out: Capped) -> str | None:
    """Execute ``code`` in ``scope``; the error's traceback (this file's frames left out), or None."""
    try:
        tree = ast.parse(code, "<code>", "exec")
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, "<code>", "exec"), scope)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), "<code>", "eval"), scope)
            if value is not None:
                out.write(repr(value) + "\n")
        return None
    except BaseException as e:  # noqa: BLE001 - whatever the code raised (SystemExit too) is its output
        frames = traceback.extract_tb(e.__traceback__)
        frames = [f for f in frames if f.filename == "<code>"]
        lines = traceback.format_list(frames) + traceback.format_exception_only(type(e), e)
        return "Traceback (most recent call last):\n" + "".join(lines) if frames else "".join(lines)


def serve(limit: int) -> None:
    scope: dict = {"__name__": "__main__"}
    stdin = sys.stdin.buffer
    send({"ready": True})
    while (request := read_message(stdin)) is not None:
        out = Capped(limit)
        sys.stdout = sys.stderr = out
        try:
            error = run_code(request["code"], scope, out)
        finally:
            sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        send({"out": out.text(), "chars": out.total, "error": error})


def refuse(error: OSError) -> None:
    send({"ready": False, "error": f"cannot isolate the sandbox: {error}"})
    os._exit(1)


def exit_like(status: int) -> None:
    """Exit as the waited-for child did: its code, or 128 + the signal that killed it."""
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)


def interpreter(limits: dict, in_user_namespace: bool) -> None:
    try:
        drop_privileges(limits, in_user_namespace)
    except OSError as e:
        refuse(e)
    rebase_imports(limits["paths"])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the file-size limit raises instead of killing
    serve(limits["output_chars"])
    os._exit(0)


def namespace_init(limits: dict, in_user_namespace: bool, bootstrap_alive: int) -> None:
    """PID 1 of the namespace: it dies with the bootstrap, and its death ends every process in it."""
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    if select.select([bootstrap_alive], [], [], 0)[0]:
        os._exit(1)  # the bootstrap died before the line above: no signal would come
    try:
        private_filesystem(limits)
    except OSError as e:
        refuse(e)
    child = os.fork()
    if child == 0:
        os.close(bootstrap_alive)
        interpreter(limits, in_user_namespace)
    while True:  # reap orphans adopted by PID 1 too
        pid, status = os.wait()
        if pid == child:
            exit_like(status)


def main() -> None:
    global REPLY_FD
    limits = json.loads(sys.argv[1])
    REPLY_FD = limits["reply_fd"]
    limits["uid"] = limits["uid_base"] + os.getpid()  # unique among the live sandboxes
    try:
        set_limits(limits)
        in_user_namespace = enter_namespaces()
    except OSError as e:
        refuse(e)
    alive_r, alive_w = os.pipe()
    init = os.fork()
    if init == 0:
        os.close(alive_w)
        namespace_init(limits, in_user_namespace, alive_r)
    os.close(alive_r)  # alive_w stays open as long as this process lives
    send({"init": init})  # the parent ends the sandbox by killing it: its exit waits for the namespace to empty
    _, status = os.waitpid(init, 0)
    exit_like(status)


if __name__ == "__main__":
    main()
