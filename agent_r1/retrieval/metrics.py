"""How well an index surfaces the supporting documents of multi-hop questions.

Two query strategies bound what an agent can get from its search tool:
``question`` issues the whole question once (what Naive RAG does) and
``sub_queries`` issues each gold hop query separately and unions the hits
(what a well-behaved agent does). A document counts as found when its title
equals a supporting title exactly: titles may repeat in a corpus, and
disambiguated titles such as "Veltrax (electronics company)" must not match
"Veltrax".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from agent_r1.retrieval.base import SearchIndex

STRATEGIES: tuple[str, ...] = ("question", "sub_queries")


def _found_fraction(gold: set[str], found_titles: set[str]) -> float:
    return len(gold & found_titles) / len(gold)


def _score_strategy(
    index: SearchIndex, queries: list[str], owners: list[int], gold: list[set[str]], top_k: int
) -> np.ndarray:
    """Search all queries in one batch; return, per question, the fraction of its titles found."""
    titles: list[set[str]] = [set() for _ in gold]
    for owner, hits in zip(owners, index.search(queries, top_k)):
        titles[owner].update(h.title for h in hits)
    return np.array([_found_fraction(g, t) for g, t in zip(gold, titles)], dtype=np.float64)


def _summary(recall: np.ndarray) -> dict[str, float]:
    return {"recall": float(recall.mean()), "all_found": float((recall == 1.0).mean())}


def _hop_queries(row: pd.Series) -> Sequence[str]:
    """The gold sub-queries, or the supporting titles when the source gives none."""
    subs = [q for q in row["sub_queries"] if str(q).strip()]
    return subs if subs else list(row["supporting_titles"])


def retrieval_metrics(index: SearchIndex, questions: pd.DataFrame, top_k: int) -> dict:
    """Recall@k and all-found@k for both strategies, overall and per question type and source.

    ``recall`` is the mean over questions of the share of distinct supporting
    titles found in the top ``top_k`` hits; ``all_found`` is the share of
    questions with every supporting title found. Questions without supporting
    titles cannot be scored: they are left out and counted in ``n_skipped``.
    """
    gold_all = [set(map(str, titles)) for titles in questions["supporting_titles"]]
    keep = np.array([len(g) > 0 for g in gold_all], dtype=bool)
    qs = questions.loc[keep].reset_index(drop=True)
    gold = [g for g, k in zip(gold_all, keep) if k]
    out: dict = {"top_k": int(top_k), "n_questions": len(qs), "n_skipped": int((~keep).sum())}
    if len(qs) == 0:
        return out | {s: {"recall": 0.0, "all_found": 0.0} for s in STRATEGIES} | {"by_type": {}, "by_source": {}}

    recalls: dict[str, np.ndarray] = {
        "question": _score_strategy(index, qs["question"].astype(str).tolist(), list(range(len(qs))), gold, top_k)
    }
    hop_lists = [_hop_queries(row) for _, row in qs.iterrows()]
    hop_queries = [str(q) for hops in hop_lists for q in hops]
    hop_owners = [i for i, hops in enumerate(hop_lists) for _ in hops]
    recalls["sub_queries"] = _score_strategy(index, hop_queries, hop_owners, gold, top_k)

    for s in STRATEGIES:
        out[s] = _summary(recalls[s])
    for column, key in (("type", "by_type"), ("source", "by_source")):
        groups = qs[column].astype(str).to_numpy()
        out[key] = {
            g: {"n": int((groups == g).sum())} | {s: _summary(recalls[s][groups == g]) for s in STRATEGIES}
            for g in sorted(set(groups))
        }
    return out
