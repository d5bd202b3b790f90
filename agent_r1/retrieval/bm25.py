"""Sparse retrieval with bm25s: BM25 scores precomputed into a sparse matrix at index time.

bm25s tokenizes a whole batch of queries in one call and scores each query
with a sparse lookup, orders of magnitude faster than rank-bm25's per-document
Python loop (see ``bench/retrieval.py``). English stopwords are removed;
terms are stemmed when PyStemmer is importable, and the folder records
whether they were, because queries must be processed like the corpus was.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import bm25s
import pandas as pd

from agent_r1.config import BM25Config
from agent_r1.retrieval import (
    DocStore,
    IndexFormatError,
    check_top_k,
    doc_strings,
    read_manifest,
    top_k_positions,
    write_manifest,
)
from agent_r1.retrieval.base import Hit

log = logging.getLogger(__name__)

STOPWORDS = "en"
MODEL_DIR = "bm25"


def english_stemmer() -> Callable[[list[str]], list[str]] | None:
    """PyStemmer's English stemmer, or None when it is not installed (then terms match exactly)."""
    try:
        import Stemmer  # PyStemmer
    except ImportError:
        return None
    return Stemmer.Stemmer("english").stemWords


def tokenize(
    texts: list[str], stemmer: Callable[[list[str]], list[str]] | None, as_ids: bool = False
) -> list[list[str]] | bm25s.tokenization.Tokenized:
    """Lowercase, split on words of 2+ characters, drop English stopwords, stem if we can.

    ``as_ids`` returns bm25s's id form, which indexes faster than strings.
    """
    return bm25s.tokenize(texts, stopwords=STOPWORDS, stemmer=stemmer, return_ids=as_ids, show_progress=False)


class BM25Index:
    """A bm25s index plus the documents it ranks."""

    kind = "bm25"

    def __init__(self, retriever: bm25s.BM25, docs: DocStore, settings: dict):
        self.retriever = retriever
        self.docs = docs
        self.settings = settings
        self._stemmer = english_stemmer() if settings["stemmer"] else None

    @property
    def n_docs(self) -> int:
        return len(self.docs)

    @classmethod
    def from_corpus(cls, corpus: pd.DataFrame, cfg: BM25Config) -> "BM25Index":
        """Index ``corpus`` (``doc_id, title, text``) in memory."""
        stemmer = english_stemmer()
        log.info("bm25: indexing %d documents (method=%s, stemming=%s)", len(corpus), cfg.method, bool(stemmer))
        retriever = bm25s.BM25(k1=cfg.k1, b=cfg.b, method=cfg.method)
        retriever.index(tokenize(doc_strings(corpus), stemmer, as_ids=True), show_progress=False)
        settings = {"k1": cfg.k1, "b": cfg.b, "method": cfg.method, "stopwords": STOPWORDS,
                    "stemmer": "english" if stemmer else None}  # fmt: skip
        return cls(retriever, DocStore(corpus), settings)

    def save(self, folder: Path) -> None:
        self.retriever.save(str(folder / MODEL_DIR))
        self.docs.save(folder)
        write_manifest(folder, {"kind": self.kind, "n_docs": self.n_docs, **self.settings})

    @classmethod
    def load(cls, folder: str | Path) -> "BM25Index":
        folder = Path(folder)
        manifest = read_manifest(folder)
        if manifest["kind"] != cls.kind:
            raise IndexFormatError(f"{folder}: index.json kind is {manifest['kind']!r}, not 'bm25'")
        if manifest.get("stemmer") and english_stemmer() is None:
            raise IndexFormatError(
                f"{folder}: the index was built with stemming but PyStemmer is not installed here;"
                " install it or rebuild the index"
            )
        if not (folder / MODEL_DIR).is_dir():
            raise IndexFormatError(f"{folder}: index folder has no {MODEL_DIR}/ (bm25s files)")
        retriever = bm25s.BM25.load(str(folder / MODEL_DIR), show_progress=False)
        docs = DocStore.load(folder)
        if len(docs) != retriever.scores["num_docs"]:
            raise IndexFormatError(
                f"{folder}: {len(docs)} documents in docs.parquet but {retriever.scores['num_docs']} in the bm25 index"
            )
        settings = {k: manifest.get(k) for k in ("k1", "b", "method", "stopwords", "stemmer")}
        return cls(retriever, docs, settings)

    def search(self, queries: list[str], top_k: int) -> list[list[Hit]]:
        """Rank documents for each query; a query with no indexed term gets ``[]``."""
        check_top_k(top_k)
        if not queries:
            return []
        results: list[list[Hit]] = []
        for terms in tokenize(list(queries), self._stemmer):
            ids = self.retriever.get_tokens_ids(terms)
            if not ids:
                results.append([])
                continue
            scores = self.retriever.get_scores_from_ids(ids)
            positions = top_k_positions(scores, top_k)
            results.append(self.docs.hits(positions, scores[positions]))
        return results
