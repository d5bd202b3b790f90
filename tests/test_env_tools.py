"""Tool argument validation, specs, and SearchTool over a real BM25 index and a fake one."""

from __future__ import annotations

import threading
from typing import Any

import pandas as pd
import pytest

from agent_r1.config import EnvConfig, RetrievalConfig
from agent_r1.env import ToolEnv
from agent_r1.env.tools import SearchTool, Tool
from agent_r1.errors import ToolInfrastructureError
from agent_r1.retrieval.base import Hit


class Calculator(Tool):
    name = "calc"
    description = "Add two numbers."
    parameters = {
        "type": "object",
        "properties": {"a": {"type": "number"}, "b": {"type": "number"}, "note": {"type": ["string", "null"]}},
        "required": ["a", "b"],
    }

    def execute(self, args: dict[str, Any]) -> float:
        return args["a"] + args["b"]


class CountingIndex:
    """Returns one hit per query echoing it; records every search call."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], int]] = []

    def search(self, queries: list[str], top_k: int) -> list[list[Hit]]:
        self.calls.append((list(queries), top_k))
        return [[Hit(f"d{i}", f"T{i}", q, 1.0)] for i, q in enumerate(queries)]


@pytest.mark.parametrize(
    "args, fragment",
    [
        ({"a": 1, "b": 2}, None),
        ({"a": 1.5, "b": -2, "note": None}, None),
        ({"a": 1, "b": 2, "note": "hi"}, None),
        ([1, 2], "must be a JSON object"),
        ("a=1", "must be a JSON object"),
        ({"a": 1}, "missing required argument(s) ['b']"),
        ({"a": 1, "b": 2, "c": 3}, "unexpected argument(s) ['c']"),
        ({"a": "1", "b": 2}, "argument 'a' of 'calc' must be of type number, got str"),
        ({"a": True, "b": 2}, "must be of type number, got bool"),
        ({"a": 1, "b": 2, "note": 5}, "must be of type string or null"),
    ],
)
def test_validate_follows_the_schema(args: Any, fragment: str | None) -> None:
    problem = Calculator().validate(args)
    if fragment is None:
        assert problem is None
    else:
        assert problem is not None and fragment in problem


def test_default_batch_execute_loops_and_spec_is_openai_style() -> None:
    calc = Calculator()
    assert calc.batch_execute([{"a": 1, "b": 2}, {"a": 0.5, "b": 0.5}]) == [3, 1.0]
    spec = calc.spec()
    assert spec == {
        "type": "function",
        "function": {"name": "calc", "description": "Add two numbers.", "parameters": Calculator.parameters},
    }


@pytest.mark.parametrize(
    "args, fragment",
    [
        ({"query": "  "}, "empty"),
        ({"query": ""}, "empty"),
        ({"query": "x" * 501}, "too long"),
        ({"query": 3}, "must be of type string"),
        ({"q": "x"}, "missing required argument(s) ['query']"),
        ({"query": "x", "top_k": 5}, "unexpected argument(s) ['top_k']"),
    ],
)
def test_search_validate_rejects_bad_queries(args: dict, fragment: str) -> None:
    problem = SearchTool(CountingIndex(), 2).validate(args)
    assert problem is not None and fragment in problem


def test_search_tool_batches_into_one_index_call() -> None:
    index = CountingIndex()
    tool = SearchTool(index, top_k=2)
    assert tool.validate({"query": "alpha"}) is None
    out = tool.batch_execute([{"query": " alpha "}, {"query": "beta"}])
    assert index.calls == [(["alpha", "beta"], 2)]
    assert [[h.text for h in hits] for hits in out] == [["alpha"], ["beta"]]
    assert tool.execute({"query": "gamma"})[0].text == "gamma"


def test_search_tool_rejects_a_short_index_answer_and_bad_top_k() -> None:
    class Short:
        def search(self, queries: list[str], top_k: int) -> list[list[Hit]]:
            return []

    with pytest.raises(RuntimeError, match="0 result lists for 1 queries"):
        SearchTool(Short(), 1).execute({"query": "x"})
    with pytest.raises(ValueError, match="top_k"):
        SearchTool(CountingIndex(), 0)


def test_search_tool_over_a_real_bm25_index(tmp_path) -> None:
    from agent_r1.retrieval import build_index

    corpus = pd.DataFrame(
        {
            "doc_id": ["d0", "d1", "d2", "d3"],
            "title": ["Velmora Labs", "Ilsa Brandt", "Quorvale", "Tarvel Systems"],
            "text": [
                "Velmora Labs is a robotics company founded by Ilsa Brandt.",
                "Ilsa Brandt is an engineer born in Quorvale.",
                "Quorvale is a harbour city on the northern coast.",
                "Tarvel Systems builds water pumps.",
            ],
        }
    )
    index = build_index("bm25", corpus, tmp_path / "idx", RetrievalConfig())
    tool = SearchTool(index, top_k=2)
    hits = tool.batch_execute([{"query": "Ilsa Brandt born"}, {"query": "water pumps"}])
    assert hits[0][0].title == "Ilsa Brandt" and len(hits[0]) <= 2
    assert hits[1][0].doc_id == "d3"


# ------------------------------------------------- failures that are not the agent's
class DeadBackend:
    """An index whose backend is gone: every search raises an infrastructure error."""

    deadline_s = 0.05  # it would give up by itself this fast

    def __init__(self, hang: bool = False) -> None:
        self.calls = 0
        self.hang = hang
        self.release = threading.Event()

    def search(self, queries: list[str], top_k: int) -> list[list[Hit]]:
        self.calls += 1
        if self.hang:
            self.release.wait(60)
            return [[] for _ in queries]
        raise ToolInfrastructureError("search backend at http://10.0.0.9:8765 is down")


TWO_SEARCHES = ["<search>alpha</search>", "<search>beta</search>"]
RECORD = {"id": "q", "question": "Where?", "answers": ["here"]}


def test_an_infrastructure_error_stops_the_step_instead_of_scoring_invalid_calls() -> None:
    index = DeadBackend()
    env = ToolEnv([SearchTool(index, 2)], EnvConfig())
    episodes = [env.reset(RECORD), env.reset(RECORD)]
    with pytest.raises(ToolInfrastructureError, match="http://10.0.0.9:8765 is down"):
        env.step_batch(episodes, TWO_SEARCHES)
    assert index.calls == 1  # not retried call by call: the backend, not a call, failed
    assert [ep.invalid_calls for ep in episodes] == [0, 0] and [ep.turn_rewards for ep in episodes] == [[], []]


def test_a_backend_that_overruns_its_own_deadline_stops_the_step() -> None:
    index = DeadBackend(hang=True)
    tool = SearchTool(index, 2)
    assert tool.backend_deadline_s == 0.05
    env = ToolEnv([tool], EnvConfig(tool_timeout_s=0.05))
    try:
        with pytest.raises(ToolInfrastructureError, match="'search' did not return within 0.1 s, although its backend"):
            env.step_batch([env.reset(RECORD)], TWO_SEARCHES[:1])
    finally:
        index.release.set()
