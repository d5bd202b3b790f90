"""``agent-r1 compare [A] [B]``: params and metrics of two runs in one table.

A run is anything DVC can read params and metrics from: a commit, a branch, a
tag, a DVC experiment name (``dvc exp run`` gives one) or, for ``B`` only,
the workspace. The rows come from ``dvc params diff A B --json`` and ``dvc
metrics diff A B --json`` (DVC reads each revision's files, cached or not), so
every number traces to a file DVC tracks. By default only what differs is
shown; ``--all`` adds the params and metrics that are equal.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


class CompareError(RuntimeError):
    """A dvc command failed: its message names the revision or file."""


@dataclass(frozen=True)
class Row:
    kind: str  # "param" | "metric"
    file: str
    key: str
    old: object
    new: object

    @property
    def delta(self) -> float | None:
        if isinstance(self.old, bool) or isinstance(self.new, bool):
            return None
        if isinstance(self.old, (int, float)) and isinstance(self.new, (int, float)):
            return float(self.new) - float(self.old)
        return None


def _dvc_json(args: Sequence[str], repo: Path) -> dict:
    # this interpreter's DVC: the one the pipeline ran with, whether or not the venv is on PATH
    proc = subprocess.run([sys.executable, "-m", "dvc", *args, "--json"], cwd=repo, capture_output=True, text=True)
    if proc.returncode != 0:
        raise CompareError(f"`dvc {' '.join(args)}` failed: {(proc.stderr or proc.stdout).strip()}")
    out = proc.stdout.strip()
    return json.loads(out) if out else {}


def _revs(a: str, b: str | None) -> list[str]:
    return [a] if b is None else [a, b]


def collect(a: str = "HEAD", b: str | None = None, *, repo: Path = Path("."), all_rows: bool = False) -> list[Row]:
    """Rows of params then metrics that differ between ``a`` and ``b`` (the workspace when None)."""
    rows: list[Row] = []
    flags = ["--all"] if all_rows else []
    for kind, command in (("param", "params"), ("metric", "metrics")):
        data = _dvc_json([command, "diff", *_revs(a, b), *flags], repo)
        for file, entries in sorted(data.items()):
            for key, change in sorted(entries.items()):
                row = Row(kind, file, key, change.get("old"), change.get("new"))
                if all_rows or row.old != row.new:
                    rows.append(row)
    return rows


def _fmt(value: object) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.4g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def render(rows: list[Row], a: str, b: str | None) -> str:
    """A plain-text table: kind, file, key, A, B, change (B − A for numbers)."""
    b_name = b or "workspace"
    if not rows:
        return f"no params or metrics differ between {a} and {b_name}"
    header = ("", "file", "key", a, b_name, "change")
    body = []
    for r in rows:
        d = r.delta
        change = "" if d is None else (f"{d:+.4g}" if d else "0")
        body.append((r.kind, r.file, r.key, _fmt(r.old), _fmt(r.new), change))
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(header, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip() for line in body]
    return "\n".join(lines)
