"""The search API over HTTP: validation, a real uvicorn + RemoteIndex roundtrip, failures."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from fastapi.testclient import TestClient

from agent_r1.config import RetrievalConfig
from agent_r1.data.schema import corpus_frame
from agent_r1.retrieval import build_index, client, load_index
from agent_r1.retrieval.bm25 import BM25Index
from agent_r1.retrieval.client import RemoteIndex, RetrievalServerError
from agent_r1.retrieval.server import create_app

QUERIES = ["violin maker", "tidal harbour", "", "granite quarry town", "Town 7"]


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory) -> Path:
    words = ["violin", "harbour", "granite", "quarry", "orchard", "tidal", "maker", "weaver", "mill", "ferry"]
    records = [
        {"doc_id": f"d{i}", "title": f"Town {i}", "text": f"Town {i} has a {words[i % 10]} and a {words[3 * i % 10]}."}
        for i in range(30)
    ]
    folder = tmp_path_factory.mktemp("srv") / "bm25"
    build_index("bm25", corpus_frame(records), folder, RetrievalConfig())
    return folder


@pytest.fixture(scope="module")
def index(index_dir) -> BM25Index:
    return load_index(index_dir)


@pytest.fixture(scope="module")
def http(index) -> TestClient:
    return TestClient(create_app(index))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def live_url(index) -> Iterator[str]:
    """A real uvicorn server on 127.0.0.1 in a background thread, stopped after the module."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(index), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(f"uvicorn failed to start on port {port}")
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join()


def test_health(http, index):
    assert http.get("/health").json() == {"status": "ok", "kind": "bm25", "n_docs": index.n_docs}


def test_search_matches_in_process(http, index):
    resp = http.post("/search", json={"queries": QUERIES, "top_k": 3})
    assert resp.status_code == 200
    expected = [[h.to_dict() for h in hits] for hits in index.search(QUERIES, 3)]
    assert resp.json() == {"results": expected}


@pytest.mark.parametrize(
    "body",
    [
        {"queries": ["a"], "top_k": 0},
        {"queries": ["a"], "top_k": -3},
        {"queries": ["a"], "top_k": "many"},
        {"queries": ["a"] * (client.MAX_QUERIES_PER_REQUEST + 1), "top_k": 3},
        {"queries": "not a list", "top_k": 3},
        {"queries": [1, 2], "top_k": 3},
        {"top_k": 3},
        {"queries": ["a"], "top_k": 3, "extra": True},
    ],
)
def test_bad_requests_get_422(http, body):
    resp = http.post("/search", json=body)
    assert resp.status_code == 422, resp.text


def test_remote_index_equals_in_process(live_url, index):
    remote = load_index(live_url)
    assert isinstance(remote, RemoteIndex)
    assert remote.search(QUERIES, 4) == index.search(QUERIES, 4)
    assert remote.search([], 4) == []
    assert remote.health()["n_docs"] == remote.n_docs == index.n_docs


def test_remote_index_splits_long_batches(live_url, index, monkeypatch):
    monkeypatch.setattr(client, "MAX_QUERIES_PER_REQUEST", 2)
    assert RemoteIndex(live_url).search(QUERIES, 2) == index.search(QUERIES, 2)


def test_remote_index_error_status_names_url(live_url):
    with pytest.raises(RetrievalServerError, match=rf"{live_url}/search answered HTTP 422"):
        RemoteIndex(live_url).search(["a"], 0)


def test_unreachable_server_names_url():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RetrievalServerError, match=rf"{url}/search unreachable after 2 attempts"):
        RemoteIndex(url, timeout=2.0, retries=1).search(["a"], 3)


def test_cli_search_reads_folder_and_url(live_url, index_dir, capsys):
    from agent_r1.cli import main

    for where in (str(index_dir), live_url):
        assert main(["search", "--index", where, "--top-k", "1", "--json", "violin maker"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and lines[0] == lines[1]

