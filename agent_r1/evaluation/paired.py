"""Paired comparisons of two methods on the same held-out questions.

Every method answers the same seeded questions (``outcomes/<method>.jsonl``),
so a difference is measured question by question. For methods A and B and the
questions both answered, d_i = EM_A(i) - EM_B(i) in {-1, 0, 1}:

    delta   = mean(d)
    95% CI  = delta +- 1.96 * sd(d) / sqrt(n)           (sd: Bessel-corrected)
    p       = exact two-sided McNemar test: with w = #(d = +1), l = #(d = -1),
              p = min(1, 2 * P[Binomial(w + l, 1/2) <= min(w, l)])

McNemar's test uses only the questions where the two disagree, which is
where a paired design gains over comparing two independent scores: questions
both get right (or both get wrong) add no noise.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Z_95 = 1.959964


@dataclass(frozen=True)
class Paired:
    n: int  # questions both methods answered
    delta: float  # mean EM difference, A - B
    ci_low: float
    ci_high: float
    p: float  # exact McNemar, two-sided
    wins: int  # questions only A got right
    losses: int  # questions only B got right


def mcnemar_p(wins: int, losses: int) -> float:
    """Exact two-sided McNemar p-value for ``wins`` vs ``losses`` discordant pairs (1.0 when there are none)."""
    k, n = min(wins, losses), wins + losses
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired_em(a: Iterable[Mapping[str, Any]], b: Iterable[Mapping[str, Any]], sources: set[str] | None = None) -> Paired | None:
    """A vs B on the questions (ids) both answered, of ``sources`` only when given; None if there are none."""
    b_em = {r["id"]: float(r["em"]) for r in b if sources is None or r["source"] in sources}
    d = [float(r["em"]) - b_em[r["id"]] for r in a if r["id"] in b_em]
    n = len(d)
    if n == 0:
        return None
    delta = sum(d) / n
    sd = math.sqrt(sum((x - delta) ** 2 for x in d) / (n - 1)) if n > 1 else 0.0
    half = Z_95 * sd / math.sqrt(n)
    wins, losses = sum(x > 0 for x in d), sum(x < 0 for x in d)
    return Paired(n, delta, delta - half, delta + half, mcnemar_p(wins, losses), wins, losses)


def describe(p: Paired | None) -> tuple[str, str]:
    """``("+0.053 [+0.012, +0.094] (9/1)", "0.021")`` for a table cell pair; dashes when nothing was paired."""
    if p is None:
        return "–", "–"
    return f"{p.delta:+.3f} [{p.ci_low:+.3f}, {p.ci_high:+.3f}] ({p.wins}/{p.losses})", f"{p.p:.3g}"
