"""Serve any index over HTTP with the same API: ``POST /search``, ``GET /health``.

Requests are validated by pydantic (422 with the offending field on bad
input) and capped at :data:`~agent_r1.retrieval.client.MAX_QUERIES_PER_REQUEST`
queries so one request cannot hold the server for minutes. Searches run one
at a time under a lock: the CPU is the bottleneck, and the indexes are not
promised to be thread-safe (FastAPI runs sync endpoints in a thread pool).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import fastapi
from pydantic import BaseModel, ConfigDict, Field

from agent_r1.retrieval.base import SearchIndex
from agent_r1.retrieval.client import MAX_QUERIES_PER_REQUEST

log = logging.getLogger(__name__)

MAX_TOP_K = 1000


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    queries: list[str] = Field(max_length=MAX_QUERIES_PER_REQUEST)
    top_k: int = Field(ge=1, le=MAX_TOP_K)


class HitOut(BaseModel):
    doc_id: str
    title: str
    text: str
    score: float


class SearchResponse(BaseModel):
    results: list[list[HitOut]]


class Health(BaseModel):
    status: str
    kind: str
    n_docs: int


def create_app(index: SearchIndex) -> fastapi.FastAPI:
    """A FastAPI app answering searches against ``index`` (any :class:`SearchIndex`)."""
    app = fastapi.FastAPI(title="agent-r1 retrieval", version="1")
    lock = threading.Lock()
    kind = str(getattr(index, "kind", type(index).__name__))

    @app.get("/health", response_model=Health)
    def health() -> Health:
        return Health(status="ok", kind=kind, n_docs=int(getattr(index, "n_docs", -1)))

    @app.post("/search", response_model=SearchResponse)
    def search(req: SearchRequest) -> SearchResponse:
        with lock:
            results = index.search(req.queries, req.top_k)
        return SearchResponse(results=[[HitOut(**h.to_dict()) for h in hits] for hits in results])

    return app


def serve(index_path: str | Path, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Load the index at ``index_path`` and serve it until interrupted (localhost by default)."""
    import uvicorn

    from agent_r1.retrieval import load_index

    index = load_index(index_path)
    log.info("serving %s index %s on http://%s:%d", getattr(index, "kind", "?"), index_path, host, port)
    uvicorn.run(create_app(index), host=host, port=port, log_level="info")
