"""ToolEnv: reset, batched stepping, termination, failing and hanging tools, metrics, fuzzing."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_r1.config import EnvConfig, ProcessRewardConfig, RetrievalConfig, RewardConfig
from agent_r1.env import TERMINATIONS, Episode, SearchTool, Tool, ToolEnv
from agent_r1.retrieval.base import Hit

RECORD = {
    "id": "q0",
    "question": "Where was the founder of Velmora Labs born?",
    "answers": ["Quorvale", "Quorvale City"],
    "supporting_titles": ["Velmora Labs", "Ilsa Brandt"],
}


class CountingIndex:
    """One hit per query, titled by the query; records every search call."""

    def __init__(self, text: str = "some text") -> None:
        self.calls: list[list[str]] = []
        self.text = text

    def search(self, queries: list[str], top_k: int) -> list[list[Hit]]:
        self.calls.append(list(queries))
        return [[Hit(f"doc:{q}", q, self.text, 1.0)] for q in queries]


class Calculator(Tool):
    name = "calc"
    description = "Add two numbers."
    parameters = {
        "type": "object",
        "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        "required": ["a", "b"],
    }

    def execute(self, args: dict[str, Any]) -> float:
        if args["a"] < 0:
            raise ValueError("negative numbers are not supported")
        return args["a"] + args["b"]


class HangingTool(Tool):
    name = "search"
    description = "Never returns until released."
    parameters = SearchTool.parameters

    def __init__(self) -> None:
        self.release = threading.Event()
        self.finished = threading.Event()

    def execute(self, args: dict[str, Any]) -> list[Hit]:
        self.release.wait(60)
        self.finished.set()
        return []


# Process rewards that pay for calls too (params.yaml's valid_call is 0), so every term shows in the sums below.
PAID_CALLS = RewardConfig(process=ProcessRewardConfig(valid_call=0.02, new_support_doc=0.1, invalid_call=-0.05, cap=0.3))


def make_env(index: Any = None, **cfg: Any) -> tuple[ToolEnv, CountingIndex]:
    index = index or CountingIndex()
    return ToolEnv([SearchTool(index, 3)], EnvConfig(**{"reward": PAID_CALLS, **cfg})), index


# ----------------------------------------------------------------- reset
def test_reset_tags_messages() -> None:
    env, _ = make_env()
    ep = env.reset(RECORD)
    roles = [m["role"] for m in ep.messages]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user", "assistant", "user"]
    assert ep.messages[0]["content"] == env.system_prompt and "<search>query</search>" in env.system_prompt
    assert ep.messages[-1] == {"role": "user", "content": f"Question: {RECORD['question']}"}
    assert env.tool_specs() is None
    assert (ep.turn, ep.done, ep.turn_rewards, ep.termination) == (0, False, [], None)

    plain, _ = make_env(one_shot=False)
    assert [m["role"] for m in plain.reset(RECORD).messages] == ["system", "user"]
    # episodes never share (and so never corrupt) the example messages
    ep.messages[1]["content"] = "changed"
    assert env.reset(RECORD).messages[1]["content"] != "changed"


def test_reset_tool_call_messages_and_specs() -> None:
    env, _ = make_env(format="tool_call")
    ep = env.reset(RECORD)
    assert [m["role"] for m in ep.messages] == ["system", "user", "assistant", "tool", "assistant", "tool",
                                                "assistant", "user"]
    assert env.tool_specs() == [SearchTool(CountingIndex(), 3).spec()]
    assert env.tool_specs()[0]["function"]["name"] == "search"


@pytest.mark.parametrize(
    "record, fragment",
    [
        ({"id": "x", "question": " ", "answers": ["a"]}, "record 'x' has no question text"),
        ({"id": "y", "question": "Why?", "answers": []}, "record 'y' has no answers"),
        ({"id": "z", "question": "Why?"}, "record 'z' has no answers"),
    ],
)
def test_reset_rejects_bad_records(record: dict, fragment: str) -> None:
    env, _ = make_env()
    with pytest.raises(ValueError, match=fragment):
        env.reset(record)


def test_env_rejects_bad_tool_sets() -> None:
    with pytest.raises(ValueError, match="at least one tool"):
        ToolEnv([], EnvConfig())
    with pytest.raises(ValueError, match="unique"):
        ToolEnv([SearchTool(CountingIndex(), 1), SearchTool(CountingIndex(), 2)], EnvConfig())
    with pytest.raises(ValueError, match="'calc' takes arguments"):
        ToolEnv([Calculator()], EnvConfig(format="tags"))


# ------------------------------------------------------------------ step
def test_search_then_answer_episode() -> None:
    env, index = make_env(index=CountingIndex(text="word " * 200), doc_chars=20)
    ep = env.reset(RECORD)
    n0 = len(ep.messages)
    [res] = env.step_batch([ep], ["<think>the company first</think><search>Velmora Labs</search>"])
    assert not res.done and res.observation_role == "user"
    assert res.observation == "<information>Doc 1 (Velmora Labs): word word word word...</information>"
    assert ep.messages[n0:] == [
        {"role": "assistant", "content": "<think>the company first</think><search>Velmora Labs</search>"},
        {"role": "user", "content": res.observation},
    ]
    assert ep.seen_doc_ids == {"doc:Velmora Labs"} and ep.support_titles_found == {"Velmora Labs"}
    assert ep.turn_rewards == [pytest.approx(0.12)]
    [res] = env.step_batch([ep], ["<answer>quorvale city</answer>"])
    assert res == type(res)(observation=None, observation_role="user", done=True)
    assert ep.messages[-1] == {"role": "assistant", "content": "<answer>quorvale city</answer>"}
    assert ep.termination == "answer" and ep.answer == "quorvale city"
    assert ep.outcome_reward == 1.0 and ep.final_turn_rewards == [pytest.approx(0.12), 0.0]
    assert ep.metrics == {
        "em": 1.0, "f1": 1.0, "answered": True, "format_valid": True, "answer": "quorvale city",
        "tool_calls": 1, "invalid_calls": 0, "turns": 2, "support_docs_found": 1, "support_docs_total": 2,
        "termination": "answer", "outcome_reward": 1.0, "process_reward": pytest.approx(0.12),
    }


def test_step_batch_runs_all_searches_in_one_index_call() -> None:
    env, index = make_env()
    eps = [env.reset({**RECORD, "id": f"q{i}"}) for i in range(5)]
    actions = [
        "<search>alpha</search>",
        "<answer>Quorvale</answer>",
        "<search>beta</search><search>gamma</search>",
        "<search>unclosed",
        "<search>delta</search>",
    ]
    results = env.step_batch(eps, actions)
    assert index.calls == [["alpha", "beta", "gamma", "delta"]]
    assert [r.done for r in results] == [False, True, False, False, False]
    assert results[2].observation == ("<information>Doc 1 (beta): some text</information>\n"
                                      "<information>Doc 1 (gamma): some text</information>")
    assert results[3].observation.startswith("<information>Error: unclosed <search> tag")
    assert [e.tool_calls for e in eps] == [1, 0, 2, 1, 1]
    assert [e.invalid_calls for e in eps] == [0, 0, 0, 1, 0]
    assert env.step_batch([], []) == [] and index.calls == [["alpha", "beta", "gamma", "delta"]]


def test_invalid_calls_get_error_observations_and_do_not_run() -> None:
    env, index = make_env()
    ep = env.reset(RECORD)
    [res] = env.step_batch([ep], ["<search>  </search><search>Ilsa Brandt</search>"])
    assert res.observation == ("<information>Error: search query is empty</information>\n"
                               "<information>Doc 1 (Ilsa Brandt): some text</information>")
    assert index.calls == [["Ilsa Brandt"]]
    assert (ep.tool_calls, ep.invalid_calls) == (2, 1)
    assert ep.turn_rewards == [pytest.approx(0.02 + 0.1 - 0.05)]


def test_termination_on_no_action() -> None:
    env, _ = make_env()
    ep = env.reset(RECORD)
    [res] = env.step_batch([ep], ["The founder was born somewhere, I think."])
    assert res.done and res.observation is None
    assert ep.termination == "no_action" and ep.outcome_reward == pytest.approx(-0.9)
    assert ep.metrics["answered"] is False and ep.metrics["f1"] == 0.0


def test_termination_on_max_turns_does_not_run_the_last_calls() -> None:
    env, index = make_env(max_turns=2)
    ep = env.reset(RECORD)
    assert not env.step_batch([ep], ["<search>Velmora Labs</search>"])[0].done
    [res] = env.step_batch([ep], ["<search>Ilsa Brandt</search>"])
    assert res.done and ep.termination == "max_turns"
    assert index.calls == [["Velmora Labs"]]  # the result of the last call could never be read
    assert ep.turn_rewards == [pytest.approx(0.12), pytest.approx(0.02)]
    assert ep.final_turn_rewards == [0.0, 0.0]  # not answered: positive process rewards withheld
    assert ep.metrics["tool_calls"] == 2 and ep.metrics["support_docs_found"] == 1


def test_malformed_turns_continue_until_max_turns() -> None:
    env, _ = make_env(max_turns=3)
    ep = env.reset(RECORD)
    for text in ["<answer>a</answer><answer>b</answer>", "<search>q</search><answer>a</answer>"]:
        assert not env.step_batch([ep], [text])[0].done
    env.step_batch([ep], ["<answer></answer>"])
    assert ep.termination == "max_turns" and ep.invalid_calls == 3
    assert ep.final_turn_rewards == [pytest.approx(-0.05)] * 3


def test_finish_for_length_and_misuse() -> None:
    env, _ = make_env()
    ep = env.reset(RECORD)
    env.step_batch([ep], ["<search>Velmora Labs</search>"])
    env.finish(ep, "max_length")
    assert ep.done and ep.termination == "max_length" and ep.outcome_reward == pytest.approx(-0.9)
    assert ep.final_turn_rewards == [0.0]
    with pytest.raises(ValueError, match="already finished \\(max_length\\)"):
        env.finish(ep, "answer")
    with pytest.raises(ValueError, match="already ended"):
        env.step_batch([ep], ["<answer>x</answer>"])
    with pytest.raises(ValueError, match="unknown termination 'timeout'"):
        env.finish(env.reset(RECORD), "timeout")
    with pytest.raises(ValueError, match="2 episodes but 1 actions"):
        env.step_batch([env.reset(RECORD), env.reset(RECORD)], ["x"])


def test_parquet_records_with_numpy_lists() -> None:
    env, _ = make_env()
    record = {**RECORD, "answers": np.array(["Quorvale"]), "supporting_titles": np.array(["Velmora Labs"])}
    ep = env.reset(record)
    env.step_batch([ep], ["<search>Velmora Labs</search>"])
    env.step_batch([ep], ["<answer>Quorvale</answer>"])
    assert ep.metrics["em"] == 1.0 and ep.metrics["support_docs_found"] == 1


# ------------------------------------------------------ failing tools
def test_raising_tool_becomes_an_error_observation() -> None:
    class Broken:
        def search(self, queries: list[str], top_k: int) -> list[list[Hit]]:
            raise ConnectionError("index server unreachable")

    env, _ = make_env(index=Broken())
    ep = env.reset(RECORD)
    [res] = env.step_batch([ep], ["<search>Velmora Labs</search>"])
    assert not res.done
    assert res.observation == ("<information>Error: tool 'search' failed: ConnectionError: "
                               "index server unreachable</information>")
    assert (ep.tool_calls, ep.invalid_calls) == (1, 1) and ep.turn_rewards == [pytest.approx(-0.05)]


def test_one_poisoned_call_fails_alone() -> None:
    env = ToolEnv([Calculator()], EnvConfig(format="tool_call"))
    eps = [env.reset(RECORD) for _ in range(3)]
    call = '<tool_call>{"name": "calc", "arguments": {"a": %s, "b": 1}}</tool_call>'
    results = env.step_batch(eps, [call % 1, call % -1, call % 2.5])
    assert [r.observation for r in results] == [
        "2", "Error: tool 'calc' failed: ValueError: negative numbers are not supported", "3.5",
    ]
    assert [r.observation_role for r in results] == ["tool"] * 3
    assert [e.invalid_calls for e in eps] == [0, 1, 0]


def test_hanging_tool_times_out_without_waiting_for_it() -> None:
    tool = HangingTool()
    env = ToolEnv([tool], EnvConfig(tool_timeout_s=0.2))
    ep = env.reset(RECORD)
    try:
        [res] = env.step_batch([ep], ["<search>Velmora Labs</search>"])
        assert not tool.finished.is_set()  # step_batch returned while the tool was still hanging
        assert res.observation == "<information>Error: tool 'search' timed out after 0.2 s</information>"
        assert ep.invalid_calls == 1 and not ep.done
    finally:
        tool.release.set()


def test_tool_call_format_unknown_tool_and_bad_arguments() -> None:
    env, index = make_env(format="tool_call")
    eps = [env.reset(RECORD) for _ in range(3)]
    results = env.step_batch(eps, [
        '<tool_call>{"name": "browse", "arguments": {"url": "x"}}</tool_call>',
        '<tool_call>{"name": "search", "arguments": {"query": "x", "k": 2}}</tool_call>',
        '<tool_call>{"name": "search", "arguments": {"query": "Velmora Labs"}}</tool_call>',
    ])
    assert results[0].observation == "Error: unknown tool 'browse'; available: ['search']"
    assert results[1].observation == "Error: 'search' got unexpected argument(s) ['k']; it accepts ['query']"
    assert results[2].observation == "Doc 1 (Velmora Labs): some text"
    assert index.calls == [["Velmora Labs"]]


def test_full_episode_over_a_real_bm25_index(tmp_path) -> None:
    from agent_r1.retrieval import build_index

    corpus = pd.DataFrame({
        "doc_id": ["d0", "d1", "d2"],
        "title": ["Velmora Labs", "Ilsa Brandt", "Tarvel Systems"],
        "text": ["Velmora Labs is a robotics company founded by Ilsa Brandt.",
                 "Ilsa Brandt is an engineer born in Quorvale.", "Tarvel Systems builds water pumps."],
    })
    index = build_index("bm25", corpus, tmp_path / "idx", RetrievalConfig())
    env = ToolEnv([SearchTool(index, 1)], EnvConfig(reward=PAID_CALLS))
    ep = env.reset(RECORD)
    [r1] = env.step_batch([ep], ["<search>Velmora Labs founder</search>"])
    assert "Doc 1 (Velmora Labs): Velmora Labs is a robotics company founded by Ilsa Brandt." in r1.observation
    [r2] = env.step_batch([ep], ["<search>Ilsa Brandt birthplace</search>"])
    assert "born in Quorvale" in r2.observation
    env.step_batch([ep], ["<answer>Quorvale</answer>"])
    assert ep.metrics["support_docs_found"] == 2 and ep.metrics["em"] == 1.0
    assert ep.outcome_reward + sum(ep.final_turn_rewards) == pytest.approx(1.24)


# ------------------------------------------------------------------ fuzz
_PIECES = ["<search>", "</search>", "<answer>", "</answer>", "<tool_call>", "</tool_call>", "<think>",
           '{"name": "search", "arguments": {"query": "', '"}}', '{"name": "calc", "arguments": {"a": 1}}',
           "Velmora Labs", "Quorvale", "{", "}", "\n", " ", "\x00", "🙂", "<", ">"]
turn_text = st.one_of(
    st.text(max_size=200),
    st.lists(st.one_of(st.sampled_from(_PIECES), st.text(max_size=6)), max_size=30).map("".join),
    st.builds(lambda s, n: s * n, st.sampled_from(_PIECES), st.integers(0, 5000)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["tags", "tool_call"]), st.lists(st.lists(turn_text, min_size=3, max_size=3), max_size=5))
def test_step_batch_never_raises_on_adversarial_turns(fmt: str, rounds: list[list[str]]) -> None:
    env, _ = make_env(format=fmt, max_turns=4)
    eps = [env.reset({**RECORD, "id": f"q{i}"}) for i in range(3)]
    for texts in rounds:
        active = [(e, t) for e, t in zip(eps, texts) if not e.done]
        results = env.step_batch([e for e, _ in active], [t for _, t in active])
        for (ep, _), res in zip(active, results):
            assert res.done == ep.done and (res.observation is None) == res.done
            assert len(ep.turn_rewards) == ep.turn <= 4
    for ep in eps:
        if not ep.done:
            env.finish(ep, "max_length")
        assert ep.termination in TERMINATIONS and isinstance(ep, Episode)
        assert len(ep.final_turn_rewards) == ep.turn
        assert 0 <= ep.invalid_calls <= ep.tool_calls
        assert ep.metrics["answered"] == (ep.termination == "answer")
        assert -1.0 - 0.05 * 4 * 3 <= ep.outcome_reward + sum(ep.final_turn_rewards) <= 1.0 + 0.3
