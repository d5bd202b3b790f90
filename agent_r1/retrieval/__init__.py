"""Corpus indexes (BM25, dense) behind one search API, and the on-disk index folder.

Every index folder holds ``index.json`` (``{"kind", "n_docs", ...settings}``),
``docs.parquet`` (``doc_id, title, text`` in index order, so hits carry the
document without a second lookup) and the kind's own files. :func:`load_index`
dispatches on ``kind``, or returns a :class:`~agent_r1.retrieval.client.RemoteIndex`
for an ``http(s)://`` URL, so callers never care where the index lives.
:func:`check_index` is what a stage runs first: a missing folder or a server
that does not answer fails before any model is loaded.

Index kinds are imported lazily: ``load_index`` of a BM25 folder must not pay
for importing torch.

Conventions shared by every kind:

* a query that is empty, whitespace-only or (BM25) has no indexed term gets
  ``[]`` back: no evidence, no hits;
* ``top_k`` larger than the corpus returns every document;
* equal scores rank by position in the corpus (lower first), so results are
  reproducible and a batch returns exactly what one-by-one calls return.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd

from agent_r1.paths import REMOTE_INDEX_SCHEMES
from agent_r1.retrieval.base import Hit, SearchIndex
from agent_r1.retrieval.metrics import retrieval_metrics

if TYPE_CHECKING:
    from agent_r1.config import RetrievalConfig

__all__ = [
    "Hit",
    "IndexFormatError",
    "SearchIndex",
    "build_index",
    "check_index",
    "load_index",
    "retrieval_metrics",
]

INDEX_FILE = "index.json"
DOCS_FILE = "docs.parquet"
KINDS: tuple[str, ...] = ("bm25", "dense")

log = logging.getLogger(__name__)


class IndexFormatError(ValueError):
    """A folder is missing, is not an index, or its ``index.json`` is unusable; names the path."""


# ------------------------------------------------------------ folder format
def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    """Write ``index.json`` (inside a folder that is itself being written atomically)."""
    (folder / INDEX_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def read_manifest(folder: str | Path) -> dict[str, Any]:
    """Read and check ``index.json``; every failure names the folder and what is wrong."""
    folder = Path(folder)
    if not folder.is_dir():
        raise IndexFormatError(f"index folder {folder} does not exist (or is not a folder)")
    path = folder / INDEX_FILE
    if not path.is_file():
        raise IndexFormatError(f"{folder} is not an index folder: it has no {INDEX_FILE}")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise IndexFormatError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    if not isinstance(manifest, dict) or manifest.get("kind") not in KINDS:
        got = manifest.get("kind") if isinstance(manifest, dict) else manifest
        raise IndexFormatError(f"{path}: 'kind' must be one of {list(KINDS)}, got {got!r}")
    return manifest


def doc_strings(corpus: pd.DataFrame) -> list[str]:
    """What gets indexed: title and text together, since titles hold the entity names."""
    return [f"{t}\n{x}" for t, x in zip(corpus["title"].astype(str), corpus["text"].astype(str))]


class DocStore:
    """The documents of an index, in index order; turns (positions, scores) into hits."""

    def __init__(self, corpus: pd.DataFrame):
        self.doc_ids: list[str] = corpus["doc_id"].astype(str).tolist()
        self.titles: list[str] = corpus["title"].astype(str).tolist()
        self.texts: list[str] = corpus["text"].astype(str).tolist()

    @classmethod
    def load(cls, folder: Path) -> "DocStore":
        path = folder / DOCS_FILE
        if not path.is_file():
            raise IndexFormatError(f"{folder}: index folder has no {DOCS_FILE}")
        return cls(pd.read_parquet(path))

    def save(self, folder: Path) -> None:
        """Store the documents in index order so hits can carry title and text."""
        frame = pd.DataFrame({"doc_id": self.doc_ids, "title": self.titles, "text": self.texts})
        frame.to_parquet(folder / DOCS_FILE, index=False)

    def __len__(self) -> int:
        return len(self.doc_ids)

    def hits(self, positions: np.ndarray, scores: np.ndarray) -> list[Hit]:
        return [
            Hit(self.doc_ids[i], self.titles[i], self.texts[i], float(s))
            for i, s in zip(positions.tolist(), scores.tolist())
        ]


def top_k_positions(scores: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` best scores, best first; ties go to the lower position.

    ``argpartition`` alone breaks ties arbitrarily, so we keep every candidate
    tied with the k-th score and order them by ``(-score, position)``.
    """
    n = scores.shape[0]
    if k >= n:
        return np.lexsort((np.arange(n), -scores))
    kth = np.partition(scores, n - k)[n - k]
    cand = np.flatnonzero(scores >= kth)
    return cand[np.lexsort((cand, -scores[cand]))][:k]


def check_top_k(top_k: int) -> None:
    if not isinstance(top_k, (int, np.integer)) or isinstance(top_k, bool) or top_k < 1:
        raise ValueError(f"top_k must be an integer >= 1, got {top_k!r}")


# --------------------------------------------------------------- public API
def build_index(
    kind: Literal["bm25", "dense"],
    corpus: pd.DataFrame,
    out_dir: Path,
    cfg: "RetrievalConfig",
    encoder_dir: Path | None = None,
) -> SearchIndex:
    """Build a ``kind`` index over ``corpus``, write it atomically to ``out_dir``, return it loaded.

    ``encoder_dir`` (dense only) defaults to ``cfg.encoder.path`` and then to
    ``models/encoder``; the folder records the path as given.
    """
    from agent_r1.data.schema import validate_corpus
    from agent_r1.io import atomic_dir

    validate_corpus(corpus, f"corpus for the {kind} index {out_dir}")
    if len(corpus) == 0:
        raise ValueError(f"corpus for the {kind} index {out_dir} is empty: nothing to index")
    out_dir = Path(out_dir)
    if kind == "bm25":
        from agent_r1.retrieval.bm25 import BM25Index

        index: Any = BM25Index.from_corpus(corpus, cfg.bm25)
    elif kind == "dense":
        from agent_r1.paths import ENCODER_DIR
        from agent_r1.retrieval.dense import DenseIndex

        if encoder_dir is None:
            encoder_dir = Path(cfg.encoder.path) if cfg.encoder.path is not None else ENCODER_DIR
        index = DenseIndex.from_corpus(corpus, Path(encoder_dir), cfg.encoder)
    else:
        raise ValueError(f"unknown index kind {kind!r}; expected one of {list(KINDS)}")
    with atomic_dir(out_dir) as tmp:
        index.save(tmp)
    return load_index(out_dir)


def load_index(path_or_url: str | Path) -> SearchIndex:
    """Open an index folder (dispatching on ``index.json`` kind) or an ``http(s)://`` server."""
    text = str(path_or_url)
    if text.startswith(REMOTE_INDEX_SCHEMES):
        from agent_r1.retrieval.client import RemoteIndex

        return RemoteIndex(text)
    folder = Path(path_or_url)
    kind = read_manifest(folder)["kind"]
    if kind == "bm25":
        from agent_r1.retrieval.bm25 import BM25Index

        return BM25Index.load(folder)
    from agent_r1.retrieval.dense import DenseIndex

    return DenseIndex.load(folder)


def check_index(location: str | Path, key: str = "retrieval.index", kind: str | None = None) -> None:
    """Fail before any work if the index ``key`` names is unusable; errors name ``key`` and the location.

    A folder must hold a readable ``index.json``; a server must answer ``/health``
    with the documented JSON (after the client's usual retries, since it may be starting)
    and, when ``kind`` is given, serve an index of that kind: DVC keys the stages on the
    local folder of that kind, not on what the server holds.
    """
    if not str(location).startswith(REMOTE_INDEX_SCHEMES):
        try:
            read_manifest(location)
        except IndexFormatError as exc:
            raise IndexFormatError(f"{key}: {exc}") from None
        return
    from agent_r1.retrieval.client import RemoteIndex, RetrievalServerError

    with RemoteIndex(str(location)) as remote:
        try:
            health = remote.health()
        except RetrievalServerError as exc:
            raise RetrievalServerError(f"{key}: {exc}") from None
    if health["status"] != "ok":
        raise RetrievalServerError(f"{key}: retrieval server at {location} reports status {health['status']!r}")
    if kind is not None and health["kind"] != kind:
        raise RetrievalServerError(
            f"{key}: the retrieval server at {location} serves a {health['kind']} index, but retrieval.index "
            f"is {kind!r}: serve indexes/{kind}, or set retrieval.index: {health['kind']}"
        )
    log.info(
        "%s: the retrieval server at %s serves a %s index of %d documents", key, location, health["kind"], health["n_docs"]
    )
