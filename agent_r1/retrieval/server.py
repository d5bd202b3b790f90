"""Serve any index over HTTP with the same API: ``POST /search``, ``GET /health``.

Requests are validated by pydantic (422 naming the offending field) and
bounded server-side, whatever the client does, so one request cannot hold the
server for minutes or fill its memory: at most
:data:`~agent_r1.retrieval.client.MAX_QUERIES_PER_REQUEST` queries of
:data:`~agent_r1.retrieval.client.MAX_QUERY_CHARS` characters, ``top_k`` up to
:data:`~agent_r1.retrieval.client.MAX_TOP_K`, and a body of at most
:data:`~agent_r1.retrieval.client.MAX_BODY_BYTES` (413, checked while the body
streams in, so a chunked upload without ``Content-Length`` is cut off too).

There is no authentication: :func:`serve` binds the loopback address by
default and warns when told to bind any other.

Searches run one at a time under a lock: the CPU is the bottleneck, and the
indexes are not promised to be thread-safe (FastAPI runs sync endpoints in a
thread pool).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import threading
from pathlib import Path
from typing import Annotated, Any

import fastapi
from pydantic import BaseModel, ConfigDict, Field

from agent_r1.retrieval.base import SearchIndex
from agent_r1.retrieval.client import MAX_BODY_BYTES, MAX_QUERIES_PER_REQUEST, MAX_QUERY_CHARS, MAX_TOP_K

log = logging.getLogger(__name__)


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    queries: list[Annotated[str, Field(max_length=MAX_QUERY_CHARS)]] = Field(max_length=MAX_QUERIES_PER_REQUEST)
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


class BodySizeLimit:
    """ASGI middleware: a request body over ``max_bytes`` gets 413 before the app parses any of it."""

    def __init__(self, app: Any, max_bytes: int = MAX_BODY_BYTES):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if not declared.isdigit() or int(declared) > self.max_bytes:
            await self._reject(send)
            return
        seen = 0

        async def counted() -> dict:  # Content-Length can be absent (chunked): count what arrives
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:  # FastAPI re-raises an HTTPException from reading the body as is
                raise fastapi.HTTPException(status_code=413, detail=self.detail)
            return message

        await self.app(scope, counted, send)

    @property
    def detail(self) -> str:
        return (
            f"request body over {self.max_bytes} bytes; send at most {MAX_QUERIES_PER_REQUEST} queries "
            f"of {MAX_QUERY_CHARS} characters per request"
        )

    async def _reject(self, send: Any) -> None:
        body = json.dumps({"detail": self.detail}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def create_app(index: SearchIndex, max_body_bytes: int = MAX_BODY_BYTES) -> fastapi.FastAPI:
    """A FastAPI app answering searches against ``index`` (any :class:`SearchIndex`)."""
    app = fastapi.FastAPI(title="agent-r1 retrieval", version="1")
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
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


def is_loopback(host: str) -> bool:
    """Whether ``host`` is only reachable from this machine (a hostname other than localhost is not assumed to be)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(index_path: str | Path, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Load the index at ``index_path`` and serve it until interrupted (localhost by default)."""
    import uvicorn

    from agent_r1.retrieval import load_index

    if not is_loopback(host):
        log.warning(
            "binding %s, which is not a loopback address: anyone who can reach port %d can query the index "
            "(there is no authentication); bind 127.0.0.1 unless the rollout workers run on other machines",
            host, port,
        )
    index = load_index(index_path)
    log.info("serving %s index %s on http://%s:%d", getattr(index, "kind", "?"), index_path, host, port)
    uvicorn.run(create_app(index), host=host, port=port, log_level="info")
