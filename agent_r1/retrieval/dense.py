"""Dense retrieval: a sentence encoder (default all-MiniLM-L6-v2) and an exact FAISS index.

Embeddings are L2-normalised, so the inner product of ``IndexFlatIP`` is the
cosine similarity; flat (exact) search is the right trade-off at the corpus
sizes we run on a CPU. The encoder is read from a local folder only
(``local_files_only``): a missing folder is an error, never a hub download.
The index folder records the encoder path as it was given, because a query
must be embedded by the same encoder as the documents.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import faiss
import numpy as np
import pandas as pd

from agent_r1.config import EncoderConfig
from agent_r1.retrieval import DocStore, IndexFormatError, check_top_k, doc_strings, read_manifest, write_manifest
from agent_r1.retrieval.base import Hit

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

log = logging.getLogger(__name__)

FAISS_FILE = "faiss.index"


def load_encoder(encoder_dir: Path, max_seq_length: int) -> "SentenceTransformer":
    """Load a sentence-transformers folder on CPU, offline; the error names the folder."""
    if not (encoder_dir / "modules.json").is_file() and not (encoder_dir / "config.json").is_file():
        raise IndexFormatError(
            f"encoder folder {encoder_dir} is missing or not a sentence-transformers model"
            " (no modules.json / config.json); the pipeline's download stage writes it"
        )
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(encoder_dir), device="cpu", local_files_only=True)
    model.max_seq_length = max_seq_length
    return model


def encode(model: "SentenceTransformer", texts: list[str], batch_size: int) -> np.ndarray:
    """Unit-length float32 embeddings, one row per text (a progress bar for big corpora).

    The batches are made here, longest text first in a stable order, not by
    ``SentenceTransformer.encode``: it sorts by length with ``np.argsort``, whose order of
    equal lengths depends on the CPU's SIMD (AVX-512 or AVX2), and an embedding's bits
    depend on the batch it is in (its padding), so the same index came out with other bytes
    on another CPU even under ``PORTABLE_CPU_NUMERICS``.
    """
    import torch
    from tqdm.auto import tqdm

    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))  # stable: CPU-independent batches
    # sentence-transformers >= 6 names / 5 names
    dim = getattr(model, "get_embedding_dimension", model.get_sentence_embedding_dimension)()
    features = getattr(model, "preprocess", model.tokenize)
    emb = np.empty((len(texts), dim), dtype=np.float32)
    starts = range(0, len(order), batch_size)
    model.eval()  # as SentenceTransformer.encode does: no dropout
    with torch.inference_mode():
        for start in tqdm(starts, desc="Batches", disable=len(texts) < 5000):
            rows = order[start : start + batch_size]
            out = model(features([texts[i] for i in rows]))["sentence_embedding"]
            emb[rows] = torch.nn.functional.normalize(out.float(), p=2, dim=1).numpy()
    return emb


class DenseIndex:
    """Exact cosine-similarity search over encoded documents."""

    kind = "dense"

    def __init__(self, index: faiss.Index, docs: DocStore, model: "SentenceTransformer", settings: dict):
        self.index = index
        self.docs = docs
        self.model = model
        self.settings = settings

    @property
    def n_docs(self) -> int:
        return len(self.docs)

    @classmethod
    def from_corpus(cls, corpus: pd.DataFrame, encoder_dir: Path, cfg: EncoderConfig) -> "DenseIndex":
        """Encode ``corpus`` (``doc_id, title, text``) with the encoder at ``encoder_dir``."""
        model = load_encoder(Path(encoder_dir), cfg.max_seq_length)
        log.info("dense: encoding %d documents with %s", len(corpus), encoder_dir)
        emb = encode(model, doc_strings(corpus), cfg.batch_size)
        index = faiss.IndexFlatIP(emb.shape[1])
        index.add(emb)
        settings = {"encoder": str(encoder_dir), "dim": int(emb.shape[1]),
                    "max_seq_length": cfg.max_seq_length, "batch_size": cfg.batch_size,
                    "metric": "cosine (inner product of L2-normalised embeddings)"}  # fmt: skip
        return cls(index, DocStore(corpus), model, settings)

    def save(self, folder: Path) -> None:
        faiss.write_index(self.index, str(folder / FAISS_FILE))
        self.docs.save(folder)
        write_manifest(folder, {"kind": self.kind, "n_docs": self.n_docs, **self.settings})

    @classmethod
    def load(cls, folder: str | Path, encoder_dir: str | Path | None = None) -> "DenseIndex":
        """Open a dense index folder; ``encoder_dir`` overrides the recorded encoder path."""
        folder = Path(folder)
        manifest = read_manifest(folder)
        if manifest["kind"] != cls.kind:
            raise IndexFormatError(f"{folder}: index.json kind is {manifest['kind']!r}, not 'dense'")
        missing = [k for k in ("encoder", "dim", "max_seq_length", "batch_size") if k not in manifest]
        if missing:
            raise IndexFormatError(f"{folder}/index.json: missing keys {missing}")
        if not (folder / FAISS_FILE).is_file():
            raise IndexFormatError(f"{folder}: index folder has no {FAISS_FILE}")
        index = faiss.read_index(str(folder / FAISS_FILE))
        docs = DocStore.load(folder)
        if index.ntotal != len(docs) or index.d != manifest["dim"]:
            raise IndexFormatError(
                f"{folder}: faiss index holds {index.ntotal} vectors of dim {index.d},"
                f" but docs.parquet has {len(docs)} documents and index.json says dim {manifest['dim']}"
            )
        enc = Path(encoder_dir if encoder_dir is not None else manifest["encoder"])
        try:
            model = load_encoder(enc, manifest["max_seq_length"])
        except IndexFormatError as exc:
            where = "" if enc.is_absolute() else f" (relative to the current directory {Path.cwd()})"
            raise IndexFormatError(
                f"{folder}: cannot load its encoder{where}: {exc}; pass encoder_dir= to DenseIndex.load to override"
            ) from None
        keys = ("encoder", "dim", "max_seq_length", "batch_size", "metric")
        settings = {k: manifest[k] for k in keys if k in manifest}
        return cls(index, docs, model, settings)

    def search(self, queries: list[str], top_k: int) -> list[list[Hit]]:
        """Encode the batch once and search it at once; empty queries get ``[]``.

        FAISS may order equal scores either way, so each list is re-sorted by
        ``(-score, position)``.
        """
        check_top_k(top_k)
        results: list[list[Hit]] = [[] for _ in queries]
        live = [i for i, q in enumerate(queries) if q.strip()]
        if not live or self.n_docs == 0:
            return results
        emb = encode(self.model, [queries[i] for i in live], self.settings["batch_size"])
        scores, positions = self.index.search(emb, min(top_k, self.n_docs))
        for row, i in enumerate(live):
            order = np.lexsort((positions[row], -scores[row]))
            results[i] = self.docs.hits(positions[row][order], scores[row][order])
        return results
