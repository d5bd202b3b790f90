"""The one search API every index (BM25, dense, HTTP client) implements."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Hit:
    doc_id: str
    title: str
    text: str
    score: float

    def to_dict(self) -> dict:
        return asdict(self)


@runtime_checkable
class SearchIndex(Protocol):
    """``search(queries, top_k) -> one ranked list of hits per query``."""

    def search(self, queries: list[str], top_k: int) -> list[list[Hit]]: ...
