"""Per-episode results -> the metrics JSON every method writes.

Shape (external checks read it; keep it): ``{"em", "f1", "n", "by_source":
{source: {"em", "f1", "n"}}, "by_type": {...}, "answer_rate", "mean_turns",
"mean_tool_calls", "invalid_call_rate", ...}``.

Next to it, every evaluation writes its per-question outcomes
(:func:`write_outcomes`, one JSON object a line, sorted by question id): the
paired comparisons between methods are made on these.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from agent_r1.io import write_text

# What an outcome line holds: the question, how the method did on it, what it answered.
OUTCOME_KEYS: tuple[str, ...] = ("id", "source", "type", "em", "f1", "answered", "turns", "tool_calls",
                                 "invalid_calls", "termination", "answer")


def _mean(xs: list[float]) -> float:
    return round(sum(xs) / len(xs), 4) if xs else 0.0


def _group(rows: list[Mapping[str, Any]]) -> dict[str, float | int]:
    return {
        "em": _mean([float(r["em"]) for r in rows]),
        "f1": _mean([float(r["f1"]) for r in rows]),
        "n": len(rows),
    }


def summarize_episodes(episodes: Iterable[Mapping[str, Any]], method: str) -> dict[str, Any]:
    """Summarise episodes (dicts with em, f1, source, type, and optionally
    answered, turns, tool_calls, invalid_calls) into the metrics JSON."""
    rows = list(episodes)
    if not rows:
        raise ValueError(f"no episodes to summarize for {method!r}")
    out: dict[str, Any] = {"method": method, **_group(rows)}
    for key in ("source", "type"):
        groups: dict[str, list] = defaultdict(list)
        for r in rows:
            groups[str(r[key])].append(r)
        out[f"by_{key}"] = {k: _group(v) for k, v in sorted(groups.items())}
    out["answer_rate"] = _mean([float(bool(r.get("answered", True))) for r in rows])
    out["mean_turns"] = _mean([float(r.get("turns", 1)) for r in rows])
    calls = [float(r.get("tool_calls", 0)) for r in rows]
    invalid = [float(r.get("invalid_calls", 0)) for r in rows]
    out["mean_tool_calls"] = _mean(calls)
    out["invalid_call_rate"] = round(sum(invalid) / sum(calls), 4) if sum(calls) else 0.0
    return out


def outcome_rows(episodes: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row of :data:`OUTCOME_KEYS` per episode (a missing key is null), sorted by question id;
    a rollout's ``question_id`` is the row's ``id``."""
    rows = [{k: (r.get("id", r.get("question_id")) if k == "id" else r.get(k)) for k in OUTCOME_KEYS}
            for r in episodes]
    return sorted(rows, key=lambda r: str(r["id"]))


def write_outcomes(path: str | Path, episodes: Iterable[Mapping[str, Any]]) -> None:
    """The per-question outcomes as JSON lines (atomic)."""
    lines = [json.dumps(r, ensure_ascii=False, sort_keys=False, default=str) for r in outcome_rows(episodes)]
    write_text(path, "\n".join(lines) + "\n")
