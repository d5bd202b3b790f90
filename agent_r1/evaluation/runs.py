"""A method's runs: one evaluation, or one per training seed (a presets file's
``<preset>.seed<k>.json`` / ``.jsonl``), read back as one row of the report.

A row trained with several seeds is the mean of its runs' metrics, with the
spread across seeds beside it: ``seed_sd``, the sample standard deviation over
seeds of each run's average EM (the mean over data sources, as the table's Avg).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent_r1.io import read_jsonl
from agent_r1.paths import seeded

# Metrics a row averages over its runs; the rest (n, method) are the same in every run.
MEAN_KEYS = ("em", "f1", "answer_rate", "mean_turns", "mean_tool_calls", "invalid_call_rate")


def run_seeds(experiments: Mapping[str, Any]) -> dict[str, list[int]]:
    """Experiment name -> its training seeds, for the experiments (ExperimentConfig) a presets file ran
    several times; the others are one run each, read as ``<name>.json``."""
    return {name: e.seeds for name, e in experiments.items() if e.seeds}


def run_files(folder: Path, name: str, suffix: str, seeds: list[int] | None) -> list[Path]:
    """The files of ``name``'s runs in ``folder``: one per seed of ``seeds`` that exists, or
    ``<name><suffix>`` when ``seeds`` is None (a single run)."""
    if seeds is None:
        return [f for f in [folder / f"{name}{suffix}"] if f.exists()]
    return [f for f in (folder / f"{seeded(name, k)}{suffix}" for k in seeds) if f.exists()]


def _avg_em(r: dict[str, Any]) -> float:
    by = r.get("by_source") or {}
    return sum(b["em"] for b in by.values()) / len(by) if by else float(r["em"])


def mean_of_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One metrics dict for several runs of a method: each metric the mean over runs (by source
    and by type too), plus ``seeds`` (how many runs) and ``seed_sd`` (None for one run)."""
    out = dict(runs[0])
    for key in MEAN_KEYS:
        if all(key in r for r in runs):
            out[key] = round(statistics.fmean(r[key] for r in runs), 4)
    for group in ("by_source", "by_type"):
        names = set.intersection(*(set(r.get(group, {})) for r in runs))
        out[group] = {g: {**runs[0][group][g], **{m: round(statistics.fmean(r[group][g][m] for r in runs), 4)
                                                   for m in ("em", "f1")}} for g in sorted(names)}
    out["seeds"] = len(runs)
    out["seed_sd"] = statistics.stdev(_avg_em(r) for r in runs) if len(runs) > 1 else None
    return out


def load_metrics(folder: Path, name: str, seeds: list[int] | None = None) -> dict[str, Any] | None:
    """``name``'s row from its metrics files in ``folder`` (None when it has none)."""
    files = run_files(folder, name, ".json", seeds)
    return mean_of_runs([json.loads(f.read_text()) for f in files]) if files else None


def load_outcome_runs(folder: Path, name: str, seeds: list[int] | None = None) -> list[list[dict[str, Any]]]:
    """``name``'s per-question rows, one list per run (empty when it has none)."""
    return [read_jsonl(f) for f in run_files(folder, name, ".jsonl", seeds)]


def spread(r: dict[str, Any]) -> str:
    """A table cell: the seed spread of a row, ``0.012 (3 seeds)``, or ``1 run``."""
    sd = r.get("seed_sd")
    return "1 run" if sd is None or math.isnan(sd) else f"{sd:.4f} ({r['seeds']} seeds)"
