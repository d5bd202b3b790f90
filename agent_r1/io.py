"""Atomic, durable writes: a killed stage never leaves a half-written output behind,
nor temp files inside folders that other stages read.

Everything is written to a temporary path in a scratch folder (``.agent_r1_tmp/``
in the working directory, which is the project root for every stage), fsync'ed,
and moved into place with ``os.replace`` (atomic on POSIX for files; for
directories the old one is removed first, so a reader sees either nothing or the
complete new folder); then the destination's folder is fsync'ed, so the new
entry survives a power loss. Temp names start with the writer's pid and host: a
stage's start removes the leftovers of this host's writers that are no longer
alive (:func:`clean_scratch`), never those of a stage running alongside.

``os.replace`` needs the temp path on the destination's filesystem. When the
project's scratch folder is not (an output folder symlinked to another disk),
the scratch folder is ``.agent_r1_tmp/`` at the root of that filesystem, and
only when that is not writable a hidden sibling of the destination.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd

log = logging.getLogger(__name__)

SCRATCH = ".agent_r1_tmp"  # gitignored and dvcignored
_OWNER = re.compile(r"^\.(\d+)-([A-Za-z0-9-]*)\.")  # every temp name starts with .<pid>-<host>.
_CHUNK = 1 << 20
_fallback_scratch: dict[int, Path | None] = {}  # per filesystem, when the project's is elsewhere


# ------------------------------------------------------------------ scratch folder
def _host() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (it may belong to another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_scratch(folder: str | Path = SCRATCH) -> list[Path]:
    """Remove temp files and folders left in ``folder`` by writers that are no longer alive.

    Returns what was removed. Entries of live processes (a stage running
    concurrently), of other hosts (a shared filesystem) and entries whose name
    carries no pid are left alone.
    """
    folder, removed = Path(folder), []
    if not folder.is_dir():
        return removed
    for entry in folder.iterdir():
        owner = _OWNER.match(entry.name)
        if owner is None or owner.group(2) != _host():
            continue
        pid = int(owner.group(1))
        if pid == os.getpid() or pid_alive(pid):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
        removed.append(entry)
    if removed:
        log.info("removed %d temp leftover(s) of killed processes from %s", len(removed), folder)
    return removed


def _usable_scratch(folder: Path, device: int) -> bool:
    try:
        folder.mkdir(exist_ok=True)
        return os.stat(folder).st_dev == device and os.access(folder, os.W_OK)
    except OSError:
        return False


def _mount_root(folder: Path) -> Path:
    """The outermost ancestor of ``folder`` on the same filesystem."""
    folder = folder.resolve()
    device = os.stat(folder).st_dev
    while folder.parent != folder and os.stat(folder.parent).st_dev == device:
        folder = folder.parent
    return folder


def scratch_for(parent: Path) -> Path:
    """The scratch folder for outputs in ``parent``: on its filesystem, outside every output folder."""
    device = os.stat(parent).st_dev
    project = Path.cwd() / SCRATCH
    if _usable_scratch(project, device):
        return project
    if device not in _fallback_scratch:  # resolved (and its leftovers cleaned) once per process
        fallback: Path | None = _mount_root(parent) / SCRATCH
        if _usable_scratch(fallback, device):
            clean_scratch(fallback)
        else:
            log.warning("no writable scratch folder on the filesystem of %s: temp files go next to it", parent)
            fallback = None
        _fallback_scratch[device] = fallback
    return _fallback_scratch[device] or parent


def _temp_prefix(path: Path) -> str:
    return f".{os.getpid()}-{_host()}.{path.name}."


# ------------------------------------------------------------------ durability
def fsync_path(path: str | Path) -> None:
    """Flush a file's data, or a folder's entries, to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:  # some filesystems cannot fsync a folder; its files still were
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP) or not os.path.isdir(path):
            raise
    finally:
        os.close(fd)


def fsync_tree(root: str | Path) -> None:
    """fsync every file and folder under ``root`` (``root`` included)."""
    root = Path(root)
    for folder, _, files in os.walk(root):
        for name in files:
            if not os.path.islink(os.path.join(folder, name)):
                fsync_path(os.path.join(folder, name))
        fsync_path(folder)


# ------------------------------------------------------------------ atomic writes
@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary file path in the scratch folder; move it into place on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=scratch_for(path.parent))
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; outputs are ordinary files
        fsync_path(tmp)
        os.replace(tmp, path)
        fsync_path(path.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield an empty temporary directory in the scratch folder; swap it in on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(path), suffix=".tmp", dir=scratch_for(path.parent)))
    try:
        yield tmp
        os.chmod(tmp, 0o755)
        fsync_tree(tmp)
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
        fsync_path(path.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | Path, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """A JSON-lines file's objects (blank lines skipped)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def write_parquet(path: str | Path, df: pd.DataFrame) -> None:
    with atomic_path(path) as tmp:
        df.to_parquet(tmp, index=False)


# ------------------------------------------------------------------ content hashes
def hash_files(files: Iterable[tuple[str, Path]]) -> str:
    """sha256 over (name, bytes) pairs in the given order: equal iff names and contents are."""
    h = hashlib.sha256()
    for name, path in files:
        h.update(name.encode() + b"\0" + str(path.stat().st_size).encode() + b"\0")
        with open(path, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
    return h.hexdigest()


def hash_tree(root: str | Path) -> str:
    """Content hash of a folder (every file, by relative path) or of one file."""
    root = Path(root)
    if root.is_file():
        return hash_files([(root.name, root)])
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such file or folder to hash")
    files = sorted((p.relative_to(root).as_posix(), p) for p in root.rglob("*") if p.is_file())
    return hash_files(files)
