"""The search API over HTTP: validation, a real uvicorn + RemoteIndex roundtrip, failures.

Failures are real: the real ``agent-r1 serve`` process killed with SIGKILL, and
a stdlib HTTP server on loopback that answers what each test scripts (dropped
connections, 5xx, malformed JSON). Only the client's ``time.sleep`` is replaced
(by a recorder), so backoff is checked without waiting for it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from agent_r1.config import EnvConfig, ParamsError, RetrievalConfig, parse_params
from agent_r1.data.schema import SchemaError, corpus_frame
from agent_r1.env import SearchTool, ToolEnv
from agent_r1.retrieval import IndexFormatError, build_index, client, load_index
from agent_r1.retrieval.bm25 import BM25Index
from agent_r1.retrieval.client import (
    MAX_BODY_BYTES,
    MAX_QUERY_CHARS,
    MAX_TOP_K,
    RemoteIndex,
    RetrievalServerError,
    encode_body,
    request_chunks,
)
from agent_r1.retrieval.server import create_app, is_loopback

ROOT = Path(__file__).resolve().parents[1]
RECORD = {"id": "q", "question": "Which town has a violin maker?", "answers": ["Town 0"], "supporting_titles": ["Town 0"]}

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
    with pytest.raises(RetrievalServerError, match=rf"{url}/search failed 2 attempts in a row; last: ConnectError"):
        RemoteIndex(url, timeout=2.0, retries=1, backoff_s=0.0).search(["a"], 3)


def test_cli_search_reads_folder_and_url(live_url, index_dir, capsys):
    from agent_r1.cli import main

    for where in (str(index_dir), live_url):
        assert main(["search", "--index", where, "--top-k", "1", "--json", "violin maker"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and lines[0] == lines[1]


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    """The client's backoff delays, recorded instead of slept."""
    delays: list[float] = []
    monkeypatch.setattr(client, "time", SimpleNamespace(sleep=delays.append))
    return delays


# ------------------------------------------------------------ server limits
def test_server_bounds_query_length_and_top_k(http):
    resp = http.post("/search", json={"queries": ["violin", "x" * (MAX_QUERY_CHARS + 1)], "top_k": 3})
    assert resp.status_code == 422
    [err] = resp.json()["detail"]
    assert err["loc"] == ["body", "queries", 1] and f"at most {MAX_QUERY_CHARS} characters" in err["msg"]
    resp = http.post("/search", json={"queries": ["violin"], "top_k": MAX_TOP_K + 1})
    assert resp.status_code == 422 and resp.json()["detail"][0]["loc"] == ["body", "top_k"]


def test_server_refuses_large_bodies_and_the_client_stays_under_the_limit(http, live_url, index):
    queries = [f"violin maker {i} " + "harbour " * 200 for i in range(700)]  # each under MAX_QUERY_CHARS
    body = encode_body(queries, 3)
    assert len(body) > MAX_BODY_BYTES
    declared = http.post("/search", content=body, headers={"content-type": "application/json"})
    streamed = http.post(  # chunked: no Content-Length to trust, the server counts what arrives
        "/search", content=iter([body[i : i + 65536] for i in range(0, len(body), 65536)]),
        headers={"content-type": "application/json"},
    )
    for resp in (declared, streamed):
        assert resp.status_code == 413, resp.text[:300]
        assert resp.json() == {"detail": f"request body over {MAX_BODY_BYTES} bytes; send at most 1024 queries "
                                         f"of {MAX_QUERY_CHARS} characters per request"}
    chunks = request_chunks(queries, 3)
    assert len(chunks) == 2 and chunks[0] + chunks[1] == queries
    assert all(len(encode_body(c, 3)) <= MAX_BODY_BYTES for c in chunks)
    assert len(encode_body(chunks[0] + chunks[1][:1], 3)) > MAX_BODY_BYTES  # each request as full as allowed
    assert RemoteIndex(live_url).search(queries, 3) == index.search(queries, 3)


@contextmanager
def served(index_dir: Path, host: str = "127.0.0.1") -> Iterator[tuple[str, subprocess.Popen, list[str]]]:
    """The real ``agent-r1 serve`` in its own process: (URL, process, its log lines so far, access log included)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent_r1.cli", "serve", "--index", str(index_dir), "--host", host, "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    log: list[str] = []
    ready = threading.Event()

    def drain() -> None:  # keep reading, or the server blocks on a full pipe
        for line in proc.stdout:
            log.append(line)
            if "Uvicorn running on" in line:
                ready.set()
        ready.set()  # EOF: it exited

    threading.Thread(target=drain, daemon=True).start()
    ready.wait()
    try:
        assert any("Uvicorn running on" in line for line in log), "".join(log)
        yield f"http://127.0.0.1:{port}", proc, log
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_serve_warns_when_bound_beyond_loopback(index_dir):
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.5", "::1", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.7", "retrieval.example.org"))
    with served(index_dir, host="0.0.0.0") as (url, _, log):
        assert RemoteIndex(url).health()["status"] == "ok"
    [warning] = [line for line in log if "WARNING" in line]
    assert "binding 0.0.0.0, which is not a loopback address" in warning and "no authentication" in warning


# --------------------------------------------- transient and persistent failures
DROP = "drop"  # close the connection without answering


class _Scripted(BaseHTTPRequestHandler):
    """Answers each request with the next scripted reply; the last one repeats."""

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self._answer()

    def _answer(self) -> None:
        script = self.server.script  # type: ignore[attr-defined]
        reply = script.pop(0) if len(script) > 1 else script[0]
        self.server.paths.append(self.path)  # type: ignore[attr-defined]
        if reply == DROP:
            return  # an HTTP/1.0 handler closes the connection when it returns
        status, body = reply
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def scripted() -> Iterator[Callable[..., tuple[str, ThreadingHTTPServer]]]:
    servers: list[ThreadingHTTPServer] = []

    def start(*replies: object) -> tuple[str, ThreadingHTTPServer]:
        srv = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
        srv.script, srv.paths = list(replies), []  # type: ignore[attr-defined]
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}", srv

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def test_transient_failures_are_retried_with_backoff(scripted, http, index, sleeps):
    good = http.post("/search", json={"queries": ["violin maker"], "top_k": 3}).content  # the real server's answer
    url, srv = scripted(DROP, (502, b"bad gateway"), (503, b'{"detail": "overloaded"}'), (200, good))
    assert RemoteIndex(url).search(["violin maker"], 3) == index.search(["violin maker"], 3)
    assert srv.paths == ["/search"] * 4
    assert sleeps == [1.0, 2.0, 4.0]


def test_a_persistent_failure_names_the_url(scripted, sleeps):
    url, srv = scripted((503, b"down for maintenance"))
    with pytest.raises(RetrievalServerError, match=rf"{url}/search failed 6 attempts in a row; last: HTTP 503: down"):
        RemoteIndex(url).search(["violin"], 3)
    assert sleeps == [1.0, 2.0, 4.0, 8.0, 10.0]  # doubling, capped


HIT = b'{"doc_id": "d0", "title": "Town 0", "text": "x", "score": 1.5}'
GARBAGE = [
    (b"<html>proxy error</html>", "Invalid JSON"),
    (b'{"results": [[{"doc_id": "d0", "title": "Town 0", "text": null, "score": 1.0}]]}',
     "results.0.0.text: Input should be a valid string"),
    (b'{"results": [[{"doc_id": "d0", "title": "Town 0", "text": "x", "score": "high"}]]}',
     "results.0.0.score: Input should be a valid number"),
    (b'{"results": [[{"doc_id": "d0", "title": "Town 0", "score": 1.0}]]}', "results.0.0.text: Field required"),
    (b'{"hits": []}', "results: Field required"),
    (b'{"results": {"0": []}}', "results: Input should be a valid array"),
    (b'{"results": [[], []]}', "returned 2 result lists for 1 queries"),
    (b'{"results": [[' + b", ".join([HIT] * 4) + b"]]}", "more than top_k=3 hits"),
    (b'{"detail": "Not Found"}', "answered HTTP 404"),  # another service at that URL
]


def test_garbage_answers_are_named_errors(scripted, sleeps):
    url, srv = scripted()
    for body, problem in GARBAGE:
        srv.script = [(404 if b"Not Found" in body else 200, body)]
        with pytest.raises(RetrievalServerError) as err:
            RemoteIndex(url).search(["violin"], 3)
        assert f"retrieval server at {url}/search" in str(err.value) and problem in str(err.value), body
    srv.script = [(200, b'{"status": "ok", "kind": "bm25", "n_docs": "many"}')]
    with pytest.raises(RetrievalServerError, match=rf"{url}/health sent an answer that is not the documented JSON \(n_docs"):
        RemoteIndex(url).health()
    assert sleeps == []  # garbage is not retried


def test_garbage_reaches_the_env_as_a_named_error_not_a_crash(scripted):
    url, _ = scripted((200, GARBAGE[1][0]))  # text: null
    env = ToolEnv([SearchTool(RemoteIndex(url), 3)], EnvConfig())
    with pytest.raises(RetrievalServerError, match=rf"{url}/search .*results.0.0.text"):
        env.step_batch([env.reset(RECORD)], ["<search>violin maker</search>"])


def test_killed_server_stops_step_batch_instead_of_scoring_an_invalid_call(index_dir, sleeps):
    with served(index_dir) as (url, proc, log):
        env = ToolEnv([SearchTool(RemoteIndex(url), 2)], EnvConfig())
        [res] = env.step_batch([env.reset(RECORD)], ["<search>violin maker</search>"])
        assert res.observation.startswith("<information>Doc 1 (Town ") and not res.done
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        with pytest.raises(RetrievalServerError, match=rf"{url}/search failed 6 attempts in a row; last: ConnectError"):
            env.step_batch([env.reset(RECORD)], ["<search>violin maker</search>"])
    assert len(sleeps) == 5
    assert not any("loopback" in line for line in log)  # 127.0.0.1: no warning


def test_server_killed_mid_rollout_stops_run_episodes(policy_dir, tmp_path, monkeypatch, sleeps):
    """The warm start's real rollouts (scripted expert, real env) over HTTP; the server dies at turn 2."""
    import torch
    from transformers import AutoTokenizer

    from agent_r1.config import Params, SyntheticConfig
    from agent_r1.data.synthetic import generate
    from agent_r1.training import expert
    from agent_r1.training.sft import expert_demonstrations

    questions, corpus = generate(SyntheticConfig(n_train=12, n_test=4, n_test_ood=2, n_test_ood_2hop=2, n_test_paraphrase=2, entities_per_type=20), seed=5)
    build_index("bm25", corpus, tmp_path / "bm25", RetrievalConfig())
    records = questions[questions["split"] == "train"].head(4).to_dict("records")
    tok, params = AutoTokenizer.from_pretrained(policy_dir), Params()
    local = expert_demonstrations(params, tok, ToolEnv([SearchTool(load_index(tmp_path / "bm25"), 3)], params.env), records)
    with served(tmp_path / "bm25") as (url, proc, _):
        env = ToolEnv([SearchTool(RemoteIndex(url), 3)], params.env)
        remote = expert_demonstrations(params, tok, env, records)
        assert torch.equal(remote.input_ids, local.input_ids) and remote.info == local.info

        generate_turn, turns = expert.ExpertEngine.generate, []

        def kill_server_at_turn_2(self, *args, **kwargs):
            turns.append(1)
            if len(turns) == 2:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            return generate_turn(self, *args, **kwargs)

        monkeypatch.setattr(expert.ExpertEngine, "generate", kill_server_at_turn_2)
        with pytest.raises(RetrievalServerError, match=rf"{url}/search failed 6 attempts"):
            expert_demonstrations(params, tok, env, records)
    assert len(turns) == 2


# ------------------------------------------------------ params and stages
def test_retrieval_index_is_a_kind_and_the_server_url_its_own_key():
    from agent_r1.paths import INDEX_DIR, index_location

    for bad in ("bm26", "indexes/bm25", "http://h:1"):
        with pytest.raises(ParamsError, match=r"retrieval.index: must be 'bm25' or 'dense'"):
            parse_params({"retrieval": {"index": bad}})
    with pytest.raises(ParamsError, match=r"retrieval.index: .*a retrieval server's URL goes in retrieval.url"):
        parse_params({"retrieval": {"index": "http://h:1"}})
    for bad in ("ftp://x", "http://", "http://h:99999", "HTTP://h", "http://h:1/?k=v", "bm25"):
        with pytest.raises(ParamsError, match=r"retrieval.url: must be null or the http\(s\)://host:port"):
            parse_params({"retrieval": {"url": bad}})
    with pytest.raises(ParamsError, match=r"experiments.x.overrides.retrieval.url: must be"):
        parse_params({"experiments": {"x": {"init": "base", "overrides": {"retrieval": {"url": "ftp://x"}}}}})
    # the stages depend on indexes/<retrieval.index> of the shared params: no experiment searches another
    for override in ({"index": "dense"}, {"url": "http://127.0.0.1:8765"}):
        with pytest.raises(ParamsError, match=r"experiments.x.overrides.retrieval: the stages that search depend on"):
            parse_params({"experiments": {"x": {"init": "base", "overrides": {"retrieval": override}}}})
    for kind in ("bm25", "dense"):
        assert index_location(parse_params({"retrieval": {"index": kind}}).retrieval.index) == INDEX_DIR / kind
    url = "https://search.example.org:8443/agent"
    retrieval = parse_params({"retrieval": {"index": "dense", "url": url}}).retrieval
    assert index_location(retrieval.index, url=retrieval.url) == url


def test_stages_check_the_index_before_any_work(tmp_path, monkeypatch, live_url, sleeps):
    """In an empty folder, any work before the check would fail on a missing input instead."""
    from agent_r1.stages.baselines import baselines
    from agent_r1.stages.evaluate import evaluate
    from agent_r1.stages.sft import sft
    from agent_r1.stages.train import train

    monkeypatch.chdir(tmp_path)
    dead = f"http://127.0.0.1:{free_port()}"
    cases = [
        ({"url": dead}, RetrievalServerError, f"retrieval.url: retrieval server at {dead}/health failed 6 attempts"),
        ({"index": "bm25"}, IndexFormatError, "retrieval.index: index folder indexes/bm25 does not exist"),
        ({"index": "dense", "url": live_url}, RetrievalServerError,  # it serves bm25: DVC keys on indexes/dense
         f"retrieval.url: the retrieval server at {live_url} serves a bm25 index, but retrieval.index is 'dense'"),
        ({"url": live_url}, SchemaError, "data/prepared/"),  # a live server: on to the stage's first input
    ]
    for retrieval, error, message in cases:
        params = parse_params({"retrieval": retrieval})
        for stage, args in ((baselines, ()), (sft, ()), (evaluate, ("sft",)), (train, ("grpo",))):
            with pytest.raises(error) as err:
                stage(params, *args)
            assert message in str(err.value), (stage.__name__, retrieval)


@pytest.mark.slow
def test_baselines_stage_scores_the_same_through_the_server(policy_dir, tmp_path, monkeypatch):
    """The real baselines stage (Naive RAG + Base Tool Call, the 135M policy) with `retrieval.index` a folder, then
    the URL of `agent-r1 serve` over that folder: the metrics are identical."""
    import json

    from agent_r1.config import SyntheticConfig
    from agent_r1.data.synthetic import generate
    from agent_r1.stages.baselines import baselines

    monkeypatch.chdir(tmp_path)
    questions, corpus = generate(SyntheticConfig(n_train=8, n_test=6, n_test_ood=4, n_test_ood_2hop=4, n_test_paraphrase=4, entities_per_type=20), seed=3)
    Path("data/prepared").mkdir(parents=True)
    questions[questions["split"] == "test"].to_parquet("data/prepared/test.parquet", index=False)
    Path("models").mkdir()
    Path("models/policy").symlink_to(policy_dir)
    build_index("bm25", corpus, Path("indexes/bm25"), RetrievalConfig())
    small = {
        "eval": {"questions_per_source": 1, "naive_rag_max_new_tokens": 16},
        "env": {"max_turns": 2}, "rollout": {"max_new_tokens": 32},
    }
    metrics = {}
    with served(Path("indexes/bm25")) as (url, _, log):
        for index in ("bm25", url):
            baselines(parse_params({**small, "retrieval": {"url": None if index == "bm25" else index}}))
            metrics[index] = [json.loads(Path(f"metrics/eval/{m}.json").read_text()) for m in ("naive_rag", "base_tool_call")]
    assert metrics["bm25"] == metrics[url]
    assert any('"POST /search HTTP/1.1" 200' in line for line in log)  # Naive RAG searched through the server
