"""Retrieval benchmark: bm25s vs rank-bm25 (BM25Okapi) vs dense (MiniLM + FAISS), side by side.

Why: the agent searches inside every rollout, so retrieval speed is training
speed; this measures what choosing bm25s (and dense) costs and buys.

Corpora are synthetic and deterministic (seeded): encyclopedia-like documents
about invented entities, each titled by a unique two-word name, written from
a Zipf-distributed pseudo-word vocabulary, and each mentioning another entity
so that names also occur in distractor documents. Query i asks about entity
i by category and surname only (surnames repeat across entities), so its
one relevant document is known and has look-alikes.

All engines tokenize the same way (bm25s's tokenizer, English stopwords) and
select top-k the same way, so the comparison is of the engines. Build time
is in-memory indexing including tokenization/encoding (no disk writes).
rank-bm25 scores each query with a Python loop over all documents, so it runs
on a capped query subset; its recall is over that subset.

    .venv/bin/python bench/retrieval.py [--sizes 10000 100000] [--queries 1000] [--k 10] [--full]
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent_r1.config import BM25Config, EncoderConfig  # noqa: E402
from agent_r1.data.schema import corpus_frame  # noqa: E402
from agent_r1.io import write_json  # noqa: E402
from agent_r1.retrieval import doc_strings, top_k_positions  # noqa: E402
from agent_r1.retrieval.base import Hit  # noqa: E402
from agent_r1.retrieval.bm25 import BM25Index, english_stemmer, tokenize  # noqa: E402
from agent_r1.retrieval.dense import DenseIndex  # noqa: E402

log = logging.getLogger("bench.retrieval")

SYLLABLES = ("ka ve lor min tas dro pel qui zan mor bel ti sor nak ur fen gal rho vis dem "
             "ar il os un ep tor mel bri cas nor").split()  # fmt: skip
CATEGORIES = ("company river village painter album bridge ship mountain novel club "
              "festival castle poet lake railway orchestra monastery island").split()  # fmt: skip
DENSE_BUDGET_S = 300.0  # encode the big corpus only if it fits (or with --full)
RANK_BM25_WORK = 3_000_000  # docs x queries for rank-bm25: ~a minute on one core


def pseudo_words(rng: np.random.Generator, n: int, min_syl: int = 2, max_syl: int = 3) -> list[str]:
    """``n`` distinct invented words, so no model can know the entities."""
    capacity = sum(len(SYLLABLES) ** k for k in range(min_syl, max_syl + 1))
    if n > 0.7 * capacity:
        raise ValueError(f"{n} distinct words of {min_syl}-{max_syl} syllables is too many (only {capacity} exist)")
    words: dict[str, None] = {}
    while len(words) < n:
        k = int(rng.integers(min_syl, max_syl + 1))
        words["".join(rng.choice(SYLLABLES, size=k))] = None
    return list(words)


def make_world(n_docs: int, n_queries: int, seed: int = 0) -> tuple[pd.DataFrame, list[str], np.ndarray]:
    """A corpus of ``n_docs`` documents, ``n_queries`` queries, and each query's relevant position."""
    rng = np.random.default_rng(seed)
    first = [w.capitalize() for w in pseudo_words(rng, 2000)]
    last = [w.capitalize() for w in pseudo_words(rng, 5000, 3, 4)]
    places = [w.capitalize() for w in pseudo_words(rng, 300, 3, 3)]
    vocab = pseudo_words(rng, 600, 1, 2)
    zipf = 1.0 / np.arange(1, len(vocab) + 1)
    zipf /= zipf.sum()

    pairs = rng.choice(len(first) * len(last), size=n_docs, replace=False)
    names = [f"{first[p // len(last)]} {last[p % len(last)]}" for p in pairs]
    cats = rng.choice(CATEGORIES, size=n_docs)
    where = rng.choice(places, size=n_docs)
    years = rng.integers(1500, 2020, size=n_docs)
    links = rng.integers(0, n_docs, size=n_docs)
    lengths = rng.integers(15, 35, size=n_docs)
    filler = rng.choice(vocab, size=int(lengths.sum()), p=zipf)
    ends = np.cumsum(lengths)
    records = []
    for i in range(n_docs):
        body = " ".join(filler[ends[i] - lengths[i] : ends[i]])
        text = (f"{names[i]} is a {cats[i]} from {where[i]}, first recorded in {years[i]}. {body}. "
                f"It is often mentioned together with {names[links[i]]}.")  # fmt: skip
        records.append({"doc_id": f"doc{i}", "title": names[i], "text": text})
    relevant = rng.choice(n_docs, size=min(n_queries, n_docs), replace=False)
    # Only the surname, which other entities share, and the category: not always enough at 100k.
    queries = [f"Which {cats[i]} is called {names[i].split()[1]}?" for i in relevant]
    return corpus_frame(records, f"<bench corpus {n_docs}>"), queries, relevant


def recall_at_k(ranked: list[np.ndarray], relevant: np.ndarray) -> float:
    return float(np.mean([rel in r for r, rel in zip(ranked, relevant)]))


def positions_of(hits_per_query: list[list[Hit]], doc_pos: dict[str, int]) -> list[np.ndarray]:
    return [np.array([doc_pos[h.doc_id] for h in hits]) for hits in hits_per_query]


def run_ours(
    index_build, corpus: pd.DataFrame, queries: list[str], relevant: np.ndarray, k: int, subset: int | None = None
) -> dict:
    """Time ``index_build()`` and a batched ``search`` of all queries; score recall@k.

    ``subset``: also score the first ``subset`` queries alone (rank-bm25's share), like with like.
    """
    t0 = time.perf_counter()
    index = index_build()
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    hits = index.search(queries, k)
    query_s = time.perf_counter() - t0
    doc_pos = {d: i for i, d in enumerate(corpus["doc_id"])}
    ranked = positions_of(hits, doc_pos)
    out = {"build_s": build_s, "queries": len(queries), "qps": len(queries) / query_s,
           "recall": recall_at_k(ranked, relevant)}  # fmt: skip
    if subset is not None:
        out["recall_on_rank_bm25_queries"] = recall_at_k(ranked[:subset], relevant[:subset])
    return out


def run_rank_bm25(corpus: pd.DataFrame, queries: list[str], relevant: np.ndarray, k: int, cfg: BM25Config) -> dict:
    """rank-bm25's BM25Okapi with the same tokenizer and the same top-k selection."""
    from rank_bm25 import BM25Okapi

    stemmer = english_stemmer()
    t0 = time.perf_counter()
    engine = BM25Okapi(tokenize(doc_strings(corpus), stemmer), k1=cfg.k1, b=cfg.b)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ranked = [top_k_positions(engine.get_scores(q), k) for q in tokenize(queries, stemmer)]
    query_s = time.perf_counter() - t0
    return {"build_s": build_s, "queries": len(queries), "qps": len(queries) / query_s,
            "recall": recall_at_k(ranked, relevant)}  # fmt: skip


def bench_size(n_docs: int, args: argparse.Namespace, dense_docs_per_s: float | None) -> tuple[dict, float | None]:
    """All engines on one corpus size; returns the row dict and the measured encoding rate."""
    log.info("generating %d documents", n_docs)
    corpus, queries, relevant = make_world(n_docs, args.queries, seed=args.seed)
    bm25_cfg, enc_cfg = BM25Config(), EncoderConfig()
    row: dict = {"n_docs": n_docs}

    n_rank = min(len(queries), max(50, RANK_BM25_WORK // n_docs))
    log.info("bm25s")
    row["bm25s"] = run_ours(lambda: BM25Index.from_corpus(corpus, bm25_cfg), corpus, queries, relevant, args.k, n_rank)
    log.info("rank-bm25 (%d queries)", n_rank)
    row["rank_bm25"] = run_rank_bm25(corpus, queries[:n_rank], relevant[:n_rank], args.k, bm25_cfg)

    estimate = n_docs / dense_docs_per_s if dense_docs_per_s else None
    if not args.no_dense and (args.full or estimate is None or estimate <= DENSE_BUDGET_S):
        log.info("dense (encoding %d documents)", n_docs)
        row["dense"] = run_ours(
            lambda: DenseIndex.from_corpus(corpus, args.encoder, enc_cfg), corpus, queries, relevant, args.k
        )
        dense_docs_per_s = n_docs / row["dense"]["build_s"]
    elif not args.no_dense:
        row["dense"] = {"skipped": f"encoding would take ~{estimate:.0f} s (> {DENSE_BUDGET_S:.0f} s); pass --full"}

    row["ratios"] = {
        "bm25s_build_speedup_vs_rank_bm25": row["rank_bm25"]["build_s"] / row["bm25s"]["build_s"],
        "bm25s_query_speedup_vs_rank_bm25": row["bm25s"]["qps"] / row["rank_bm25"]["qps"],
    }
    if "qps" in row.get("dense", {}):
        row["ratios"]["bm25s_query_speedup_vs_dense"] = row["bm25s"]["qps"] / row["dense"]["qps"]
    return row, dense_docs_per_s


def format_table(row: dict, k: int) -> str:
    lines = [f"\n== {row['n_docs']:,} documents (recall@{k}) ==",
             f"{'engine':<12}{'build s':>10}{'queries':>9}{'queries/s':>12}{f'recall@{k}':>11}"]  # fmt: skip
    for name in ("bm25s", "rank_bm25", "dense"):
        r = row.get(name)
        if r is None:
            continue
        if "skipped" in r:
            lines.append(f"{name:<12}  skipped: {r['skipped']}")
            continue
        lines.append(f"{name:<12}{r['build_s']:>10.2f}{r['queries']:>9}{r['qps']:>12.1f}{r['recall']:>11.3f}")
    lines += [f"  {name}: {value:.1f}x" for name, value in row["ratios"].items()]
    n_rank = row["rank_bm25"]["queries"]
    same, theirs = row["bm25s"]["recall_on_rank_bm25_queries"], row["rank_bm25"]["recall"]
    lines.append(f"  recall@{k} on rank-bm25's {n_rank} queries: bm25s {same:.3f}, rank-bm25 {theirs:.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    p.add_argument("--queries", type=int, default=1000, help="queries per size (rank-bm25 runs a capped subset)")
    p.add_argument("--k", type=int, default=3, help="recall@k; 3 is the agent's default top_k")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--encoder", type=Path, default=REPO / "models" / "encoder")
    p.add_argument("--full", action="store_true", help=f"encode every size even if over ~{DENSE_BUDGET_S:.0f} s")
    p.add_argument("--no-dense", action="store_true")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "retrieval.json")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")

    rows, rate = [], None
    for n in sorted(args.sizes):
        row, rate = bench_size(n, args, rate)
        rows.append(row)
        print(format_table(row, args.k), flush=True)
    result = {
        "k": args.k,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "stemming": english_stemmer() is not None,
        "sizes": rows,
    }
    write_json(args.out, result)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
