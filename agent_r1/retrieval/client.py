"""The search API over HTTP: :class:`RemoteIndex` is a drop-in for an in-process index.

One retrieval server can serve many rollout workers, so the index (and the
encoder's memory) lives once. Long query batches are split into requests of
at most :data:`MAX_QUERIES_PER_REQUEST`, the server's limit. Connection
failures and 5xx answers are retried (the server may still be starting);
4xx answers are not, since repeating a bad request cannot help.
"""

from __future__ import annotations

import logging
import time

import httpx

from agent_r1.retrieval.base import Hit

log = logging.getLogger(__name__)

MAX_QUERIES_PER_REQUEST = 1024


class RetrievalServerError(RuntimeError):
    """The retrieval server could not be reached or answered with an error; names the URL."""


class RemoteIndex:
    """``search(queries, top_k)`` against an ``agent_r1.retrieval.server`` at ``url``."""

    kind = "remote"

    def __init__(self, url: str, timeout: float = 30.0, retries: int = 2):
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.url = url.rstrip("/")
        self.retries = retries
        self._http = httpx.Client(timeout=timeout)

    def _request(self, method: str, path: str, payload: dict | None = None) -> dict:
        url = f"{self.url}{path}"
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                resp = self._http.request(method, url, json=payload)
            except httpx.HTTPError as exc:
                if last:
                    raise RetrievalServerError(
                        f"retrieval server at {url} unreachable after {attempt + 1} attempts: {exc!r}"
                    ) from exc
            else:
                if resp.status_code == 200:
                    return resp.json()
                if resp.status_code < 500 or last:
                    raise RetrievalServerError(
                        f"retrieval server at {url} answered HTTP {resp.status_code}: {resp.text[:500]}"
                    )
            log.warning("retrieval server at %s: attempt %d failed, retrying", url, attempt + 1)
            time.sleep(0.5 * 2**attempt)
        raise AssertionError("unreachable")

    def health(self) -> dict:
        """``{"status": "ok", "kind": ..., "n_docs": ...}`` from the server."""
        return self._request("GET", "/health")

    @property
    def n_docs(self) -> int:
        return int(self.health()["n_docs"])

    def search(self, queries: list[str], top_k: int) -> list[list[Hit]]:
        results: list[list[Hit]] = []
        for start in range(0, len(queries), MAX_QUERIES_PER_REQUEST):
            chunk = list(queries[start : start + MAX_QUERIES_PER_REQUEST])
            body = self._request("POST", "/search", {"queries": chunk, "top_k": top_k})
            try:
                batch = [[Hit(**hit) for hit in hits] for hits in body["results"]]
            except (KeyError, TypeError) as exc:
                raise RetrievalServerError(
                    f"retrieval server at {self.url}/search sent a malformed answer: {exc!r}"
                ) from exc
            if len(batch) != len(chunk):
                raise RetrievalServerError(
                    f"retrieval server at {self.url}/search returned {len(batch)} result lists for {len(chunk)} queries"
                )
            results.extend(batch)
        return results

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "RemoteIndex":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
