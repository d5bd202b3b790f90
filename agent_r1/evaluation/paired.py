"""Paired comparisons of two methods on the same held-out questions.

Every method answers the same seeded questions (``outcomes/<method>.jsonl``;
a method trained with several seeds has one file per seed), so a difference is
measured question by question. For methods A (runs 1..a) and B (runs 1..b) and
the questions both answered, with EM in {0, 1}:

    d_i     = mean_k EM_A,k(i) - mean_j EM_B,j(i)       (each method averaged over its seeds)
    delta   = mean(d)
    95% CI  = delta +- 1.96 * sd(d) / sqrt(n)           (sd: Bessel-corrected)
    p       = exact two-sided sign-flip (paired permutation) test of mean(d) = 0:
              the share of the 2^m sign patterns s of the m nonzero d_i with
              |sum_i s_i |d_i|| >= |sum_i d_i|

With one run each, d_i is in {-1, 0, 1} and the sign-flip test is exactly
McNemar's exact test, p = min(1, 2 * P[Binomial(w + l, 1/2) <= min(w, l)]) with
w = #(d = +1), l = #(d = -1). Either way only the questions where the two
disagree count, which is where a paired design gains over comparing two
independent scores. Questions are the unit: the test says whether these runs
differ on this question set; how much a method's score moves between training
seeds is reported beside it (the spread across seeds), not inside p.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Z_95 = 1.959964


@dataclass(frozen=True)
class Paired:
    n: int  # questions both methods answered
    delta: float  # mean EM difference, A - B
    ci_low: float
    ci_high: float
    p: float  # exact sign-flip test, two-sided (McNemar's with one run each)
    wins: int  # questions A did better on (with one run each: only A got right)
    losses: int  # questions B did better on


def mcnemar_p(wins: int, losses: int) -> float:
    """Exact two-sided McNemar p-value for ``wins`` vs ``losses`` discordant pairs (1.0 when there are none)."""
    k, n = min(wins, losses), wins + losses
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def sign_flip_p(scaled: list[int]) -> float:
    """Exact two-sided sign-flip p-value of integer differences ``scaled`` (d_i times a common
    factor): P[|sum s_i |x_i|| >= |sum x_i|] over independent fair signs s_i."""
    sizes = [abs(x) for x in scaled if x != 0]
    observed = abs(sum(scaled))
    if not sizes:
        return 1.0
    import numpy as np

    total = sum(sizes)
    dist = np.zeros(2 * total + 1)  # dist[S + total] = P(sum = S); no shift below wraps around
    dist[total] = 1.0
    for x in sizes:
        dist = (np.roll(dist, -x) + np.roll(dist, x)) / 2
    at = np.abs(np.arange(-total, total + 1))
    return float(min(1.0, dist[at >= observed].sum()))


def _em_sums(runs: Sequence[Iterable[Mapping[str, Any]]], sources: set[str] | None) -> dict[str, int]:
    """Question id -> how many of the runs got it right, over the questions every run answered."""
    per_run = [{r["id"]: int(float(r["em"]) > 0.5) for r in rows if sources is None or r["source"] in sources}
               for rows in runs]
    shared = set.intersection(*(set(d) for d in per_run)) if per_run else set()
    return {q: sum(d[q] for d in per_run) for q in shared}


def paired_runs(
    a: Sequence[Iterable[Mapping[str, Any]]], b: Sequence[Iterable[Mapping[str, Any]]], sources: set[str] | None = None
) -> Paired | None:
    """A vs B, each one or more runs (training seeds) of per-question rows, on the questions
    (ids) all answered, of ``sources`` only when given; None if there are none."""
    sa, sb = _em_sums(a, sources), _em_sums(b, sources)
    ids = sorted(set(sa) & set(sb))
    if not ids:
        return None
    scaled = [len(b) * sa[q] - len(a) * sb[q] for q in ids]  # d_i * |a| * |b|, an integer
    d = [x / (len(a) * len(b)) for x in scaled]
    n, delta = len(d), sum(d) / len(d)
    sd = math.sqrt(sum((x - delta) ** 2 for x in d) / (n - 1)) if n > 1 else 0.0
    half = Z_95 * sd / math.sqrt(n)
    wins, losses = sum(x > 0 for x in d), sum(x < 0 for x in d)
    return Paired(n, delta, delta - half, delta + half, sign_flip_p(scaled), wins, losses)


def paired_em(a: Iterable[Mapping[str, Any]], b: Iterable[Mapping[str, Any]], sources: set[str] | None = None) -> Paired | None:
    """One run of A vs one run of B (:func:`paired_runs`; its p is McNemar's exact test)."""
    return paired_runs([list(a)], [list(b)], sources)


def describe(p: Paired | None) -> tuple[str, str]:
    """``("+0.053 [+0.012, +0.094] (9/1)", "0.021")`` for a table cell pair; dashes when nothing was paired."""
    if p is None:
        return "–", "–"
    return f"{p.delta:+.3f} [{p.ci_low:+.3f}, {p.ci_high:+.3f}] ({p.wins}/{p.losses})", f"{p.p:.3g}"
