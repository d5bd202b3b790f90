"""SQuAD answer normalisation: when two answers count as the same.

The reward's EM and F1 (:mod:`agent_r1.env.rewards`) compare normalised answers, and the
question schema (:mod:`agent_r1.data.schema`) rejects a gold answer that normalises to the
empty string (an empty prediction would match it), so both use this one definition.
"""

from __future__ import annotations

import re
import string

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lowercase, drop punctuation and the articles a/an/the, squeeze whitespace."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", s).split())
