"""The python tool in the env: each episode its own interpreter, opened at reset, closed at the end."""

from __future__ import annotations

import re

import pytest
from test_sandbox import pytestmark, sandbox_processes  # noqa: F401 - the same machine requirement

from agent_r1.config import parse_params
from agent_r1.env.make import make_env

RECORD = {"id": "q1", "question": "What is 6 * 7?", "answers": ["42"]}


def python_env(**tool_options: object):
    params = parse_params({"env": {"tools": ["python"], "format": "tags", "max_turns": 4,
                                   "tool_options": {"python": {"call_timeout_s": 2, **tool_options}}}})
    return make_env(params)


def test_each_episode_keeps_its_own_variables_and_its_interpreter_ends_with_it() -> None:
    env = python_env()
    a, b = env.reset(RECORD), env.reset({**RECORD, "id": "q2"})
    assert a.tools["python"] is not b.tools["python"]
    env.step_batch([a, b], ["<python>x = 6</python>", "<python>x = 7</python>"])
    results = env.step_batch([a, b], ["<python>print(x * 7)</python>", "<python>x * 6</python>"])
    assert "42" in results[0].observation and "42" in results[1].observation
    assert sandbox_processes()  # both interpreters run between turns
    env.step_batch([a], ["<answer>42</answer>"])
    assert a.done and a.tools == {} and a.metrics["em"] == 1.0
    env.release([b])  # a rollout stopped before b ended
    assert b.tools == {} and sandbox_processes() == []


def test_a_timed_out_call_is_an_observation_and_the_episode_goes_on() -> None:
    env = python_env()
    ep = env.reset(RECORD)
    [res] = env.step_batch([ep], ["<python>while True: pass</python>"])
    assert not res.done and "timed out after 2 s" in res.observation and ep.invalid_calls == 0
    [res] = env.step_batch([ep], ["<python>6 * 7</python>"])
    assert "42" in res.observation
    env.release([ep])


def test_a_call_timeout_the_env_would_cut_first_is_refused_naming_the_key() -> None:
    with pytest.raises(ValueError, match=r"env.tool_options.python.call_timeout_s \(10\) must be less than "
                                         r"env.tool_timeout_s \(10\)"):
        python_env(call_timeout_s=10)


def test_the_code_math_task_is_solved_by_code_through_the_env_and_scored() -> None:
    """examples/math_code.py from params alone: its problems, the python tool, the numeric reward."""
    from agent_r1.data.sources import get_source
    from examples.math_code import collatz_steps, count_primes, problems

    assert count_primes(2, 30) == 10 and collatz_steps(27) == 111  # known values
    params = parse_params({
        "data": {"source": "examples.math_code:CodeMathProblems", "options": {"n_train": 10, "n_test": 5}},
        "env": {"tools": ["python"], "format": "tags", "max_turns": 3,
                "reward": {"scheme": "examples.arithmetic:numeric_reward"}},
        "sft": {"enabled": False},
    })  # fmt: skip
    questions, _ = get_source(params.data.source, params.data.options).generate(params.data)
    assert len(questions) == 15 and questions["type"].nunique() == 5
    assert problems(15, params.data.seed) == problems(15, params.data.seed)  # seeded
    record = next(r for r in questions.to_dict("records") if r["type"] == "primes")
    lo, hi = (int(w.rstrip(",")) for w in record["question"].split() if w.rstrip(",").isdigit())
    env = make_env(params)
    ep = env.reset(record)
    program = (f"def is_prime(k):\n    return k > 1 and all(k % d for d in range(2, int(k ** 0.5) + 1))\n"
               f"sum(map(is_prime, range({lo}, {hi} + 1)))")
    [res] = env.step_batch([ep], [f"<python>{program}</python>"])
    printed = re.search(r"\d+", res.observation).group()  # the number inside <information>
    assert printed == record["answers"][0]
    env.step_batch([ep], [f"<answer>{printed}</answer>"])
    assert ep.done and ep.metrics["answered"] and ep.outcome_reward == 1.0, (res.observation, ep.metrics)


def state_reward(answer, golds, format_valid, cfg, episode):  # noqa: ANN001, ANN201 - a reward plugin's signature
    """Success is a state: the interpreter's variable ``result``, read before the episode's tools close."""
    shown = episode.tools["python"].execute({"code": "print(result)"})
    return float(shown.strip() == golds[0]) + 0.01 * len(episode.messages)


def test_a_reward_that_reads_the_episode_sees_its_interpreter_still_open(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "state_reward_plugin", __import__("sys").modules[__name__])
    params = parse_params({"env": {"tools": ["python"], "format": "tags", "max_turns": 4,
                                   "reward": {"scheme": "state_reward_plugin:state_reward"}}})
    env = make_env(params)
    ep = env.reset(RECORD)
    env.step_batch([ep], ["<python>result = 6 * 7</python>"])
    env.step_batch([ep], ["<answer>done</answer>"])  # the answer string is not what is scored
    assert ep.outcome_reward == pytest.approx(1.0 + 0.01 * len(ep.messages)) and ep.tools == {}
    assert sandbox_processes() == []  # closed after the reward read it
