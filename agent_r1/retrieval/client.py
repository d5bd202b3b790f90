"""The search API over HTTP: :class:`RemoteIndex` is a drop-in for an in-process index.

One retrieval server can serve many rollout workers, so the index (and the
encoder's memory) lives once. The limits below are the server's; the client
splits a long batch into requests that respect them, so only a broken server
or a wrong URL can make a search fail.

Failures are of two kinds, and neither reaches the agent as a bad tool call:

* transient (connection refused or reset, timeouts, HTTP 5xx): retried with
  exponential backoff, up to :attr:`RemoteIndex.retries` times, since a server
  that is restarting or briefly overloaded comes back;
* anything else (HTTP 4xx, an answer that is not the documented JSON):
  :class:`RetrievalServerError` at once, naming the URL and what is wrong.

A search that still fails after the retries raises
:class:`RetrievalServerError` too. It is a
:class:`~agent_r1.errors.ToolInfrastructureError`, so the env stops the run
instead of scoring it as an invalid call.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, ValidationError

from agent_r1.errors import ToolInfrastructureError
from agent_r1.retrieval.base import Hit

log = logging.getLogger(__name__)

# The server's limits (agent_r1.retrieval.server enforces them; one source for both sides).
MAX_QUERIES_PER_REQUEST = 1024
MAX_QUERY_CHARS = 2000  # the agent's SearchTool stops at 500; the CLI may send longer questions
MAX_TOP_K = 100  # retrieval.top_k and env.top_k are capped at 100 too
MAX_BODY_BYTES = 1 << 20  # 1 MiB: 1024 queries of 500 plain characters fit in one request


class RetrievalServerError(ToolInfrastructureError):
    """The retrieval server could not be reached, failed, or answered garbage; names the URL."""


class _HitJSON(BaseModel):
    """One hit as the server documents it; strict, so ``text: null`` or ``score: "1"`` is an error."""

    model_config = ConfigDict(strict=True)

    doc_id: str
    title: str
    text: str
    score: float


class _SearchJSON(BaseModel):
    model_config = ConfigDict(strict=True)

    results: list[list[_HitJSON]]


class _HealthJSON(BaseModel):
    model_config = ConfigDict(strict=True)

    status: str
    kind: str
    n_docs: int


def _parse(model: type[BaseModel], content: bytes, url: str) -> Any:
    """``content`` validated against ``model``; anything else names the URL and the first problems."""
    try:
        return model.model_validate_json(content)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or '<body>'}: {e['msg']}" for e in exc.errors()[:3]
        )
        raise RetrievalServerError(
            f"retrieval server at {url} sent an answer that is not the documented JSON ({problems}); "
            f"body starts {content[:200]!r}"
        ) from None


def encode_body(queries: list[str], top_k: int) -> bytes:
    """The ``POST /search`` body exactly as sent (compact JSON), so its size is known before sending."""
    return json.dumps({"queries": queries, "top_k": top_k}, separators=(",", ":")).encode()


def request_chunks(queries: list[str], top_k: int) -> list[list[str]]:
    """Consecutive slices of ``queries``, each within the server's query-count and body-size limits."""
    overhead = len(encode_body([], top_k))
    chunks: list[list[str]] = []
    current: list[str] = []
    size = overhead
    for query in queries:
        cost = len(json.dumps(query).encode())
        if current and (len(current) == MAX_QUERIES_PER_REQUEST or size + 1 + cost > MAX_BODY_BYTES):
            chunks.append(current)
            current, size = [], overhead
        size += cost + (1 if current else 0)  # a comma before every query but the first
        current.append(query)
    if current:
        chunks.append(current)
    return chunks


class RemoteIndex:
    """``search(queries, top_k)`` against an ``agent_r1.retrieval.server`` at ``url``.

    ``timeout`` bounds each attempt; a transient failure is retried ``retries``
    times after ``backoff_s``, ``2 * backoff_s``, ... (at most ``max_backoff_s``)
    seconds. The class attributes are the defaults every stage gets.
    """

    kind = "remote"
    timeout: float = 30.0
    retries: int = 5
    backoff_s: float = 1.0
    max_backoff_s: float = 10.0

    def __init__(
        self, url: str, timeout: float | None = None, retries: int | None = None, backoff_s: float | None = None
    ):
        self.url = url.rstrip("/")
        if timeout is not None:
            self.timeout = timeout
        if retries is not None:
            self.retries = retries
        if backoff_s is not None:
            self.backoff_s = backoff_s
        if self.retries < 0 or self.backoff_s < 0 or self.timeout <= 0:
            raise ValueError(
                f"need retries >= 0, backoff_s >= 0, timeout > 0; got {self.retries}, {self.backoff_s}, {self.timeout}"
            )
        self._http = httpx.Client(timeout=self.timeout)

    def _delay(self, attempt: int) -> float:
        return min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s)

    @property
    def deadline_s(self) -> float:
        """The longest one request can take before it raises: every attempt times out, every backoff slept.

        (httpx applies ``timeout`` to each connect/read/write, so a server trickling bytes could take longer;
        the env treats an overrun of this deadline as an infrastructure failure too.)
        """
        return (self.retries + 1) * self.timeout + sum(self._delay(a) for a in range(1, self.retries + 1))

    def _request(self, method: str, path: str, body: bytes | None = None) -> bytes:
        """The body of a 200 answer, after retrying transient failures; else :class:`RetrievalServerError`."""
        url = f"{self.url}{path}"
        headers = {"content-type": "application/json"} if body is not None else None
        for attempt in range(1, self.retries + 2):
            try:
                resp = self._http.request(method, url, content=body, headers=headers)
            except httpx.TransportError as exc:  # refused, reset, timed out: the server may come back
                problem = f"{type(exc).__name__}: {exc}"
            except httpx.HTTPError as exc:
                raise RetrievalServerError(f"retrieval server at {url}: request failed: {exc!r}") from exc
            else:
                if resp.status_code == 200:
                    return resp.content
                if resp.status_code < 500:  # repeating a request the server refuses cannot help
                    raise RetrievalServerError(
                        f"retrieval server at {url} answered HTTP {resp.status_code}: {resp.text[:500]}"
                    )
                problem = f"HTTP {resp.status_code}: {resp.text[:200]}"
            if attempt > self.retries:
                raise RetrievalServerError(
                    f"retrieval server at {url} failed {attempt} attempts in a row; last: {problem}"
                )
            delay = self._delay(attempt)
            log.warning(
                "retrieval server at %s: attempt %d failed (%s); retrying in %.2g s", url, attempt, problem, delay
            )
            time.sleep(delay)
        raise AssertionError("unreachable")

    def health(self) -> dict:
        """``{"status": "ok", "kind": ..., "n_docs": ...}`` from the server."""
        url = f"{self.url}/health"
        return _parse(_HealthJSON, self._request("GET", "/health"), url).model_dump()

    @property
    def n_docs(self) -> int:
        return int(self.health()["n_docs"])

    def search(self, queries: list[str], top_k: int) -> list[list[Hit]]:
        results: list[list[Hit]] = []
        url = f"{self.url}/search"
        for chunk in request_chunks(list(queries), top_k):
            answer: _SearchJSON = _parse(_SearchJSON, self._request("POST", "/search", encode_body(chunk, top_k)), url)
            if len(answer.results) != len(chunk):
                raise RetrievalServerError(
                    f"retrieval server at {url} returned {len(answer.results)} result lists for {len(chunk)} queries"
                )
            if any(len(hits) > top_k for hits in answer.results):
                raise RetrievalServerError(
                    f"retrieval server at {url} returned more than top_k={top_k} hits for a query"
                )
            results.extend([Hit(**h.model_dump()) for h in hits] for hits in answer.results)
        return results

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "RemoteIndex":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
