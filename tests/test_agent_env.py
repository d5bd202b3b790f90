"""Stateful environments (env.name): one AgentEnv instance per episode, played behind the rollout's
env interface, from params alone (examples/guess_number.py)."""

from __future__ import annotations

import pytest
import torch

from agent_r1.config import ParamsError, parse_params
from agent_r1.env.agent_env import AgentEnvRunner
from agent_r1.env.make import make_env
from agent_r1.rollout import GenerationEngine, GenerationOutput
from examples.guess_number import GuessNumber

GUESS = {"env": {"name": "examples.guess_number:GuessNumber", "options": {"high": 100}, "max_turns": 8}}


def bisect(env: AgentEnvRunner, episodes: list) -> None:
    """Play every episode by bisection, all of them stepping together, reading each one's observations."""
    bounds = {id(ep): [1, 100] for ep in episodes}
    while live := [ep for ep in episodes if not ep.done]:
        guesses = {id(ep): sum(bounds[id(ep)]) // 2 for ep in live}
        results = env.step_batch(live, [f"<guess>{guesses[id(ep)]}</guess>" for ep in live])
        for ep, res in zip(live, results):
            if not res.done:
                lo, hi = bounds[id(ep)]
                bounds[id(ep)] = [guesses[id(ep)] + 1, hi] if "higher" in res.observation else [lo, guesses[id(ep)] - 1]


def test_each_episode_has_its_own_env_and_the_envs_rewards_and_metrics() -> None:
    env = make_env(parse_params(GUESS))
    assert isinstance(env, AgentEnvRunner) and "<guess>" in env.system_prompt
    episodes = [env.reset({"id": f"g{i}", "question": "q", "answers": ["?"]}) for i in range(3)]
    envs = [ep.tools["env"] for ep in episodes]
    assert len({id(e) for e in envs}) == 3 and all(isinstance(e, GuessNumber) for e in envs)
    assert episodes[0].messages[1]["content"].startswith("I am thinking of a whole number from 1 to 100")
    bisect(env, episodes)
    for ep, game in zip(episodes, envs):
        assert ep.termination == "env_done" and ep.tools == {}  # closed
        guesses = ep.metrics["env/guesses"]
        assert ep.metrics["em"] == 1.0 and guesses <= 7 and ep.turn == guesses
        assert ep.final_turn_rewards == [0.0] * (ep.turn - 1) + [pytest.approx(guesses**-0.5)]
    assert len({ep.turn for ep in episodes}) > 1  # different secrets


def test_an_invalid_action_is_the_envs_to_judge_and_max_turns_ends_the_episode() -> None:
    env = make_env(parse_params({"env": {**GUESS["env"], "max_turns": 2}}))
    ep = env.reset({"id": "g0", "question": "q", "answers": ["?"]})
    [res] = env.step_batch([ep], ["I think it is fifty"])
    assert not res.done and "whole number" in res.observation and ep.invalid_calls == 1
    [res] = env.step_batch([ep], ["<guess>0</guess>"])
    assert res.done and ep.termination == "max_turns" and ep.metrics["em"] == 0.0 and ep.tools == {}
    assert ep.final_turn_rewards == [-0.1, 0.0]


def test_env_options_are_validated_by_the_envs_own_model_naming_the_key() -> None:
    with pytest.raises(ParamsError, match=r"env.options.high"):
        parse_params({"env": {**GUESS["env"], "options": {"high": 1}}})
    with pytest.raises(ParamsError, match=r"env.options: only a stateful environment"):
        parse_params({"env": {"options": {"high": 10}}})
    with pytest.raises(ParamsError, match=r"env.name: plugin 'examples.guess_number:Guess' is no environment"):
        parse_params({"env": {"name": "examples.guess_number:Guess"}})


def test_the_rollout_plays_a_stateful_env_and_puts_its_rewards_on_each_turns_last_token(policy_dir) -> None:
    """The scheduler, unchanged, over the runner: a miss then a hit, scripted; the env's turn rewards
    on the turns' last action tokens, its instance closed, its metrics in the trajectory's info."""
    import random

    from test_rollout_loop import ScriptedEngine
    from transformers import AutoTokenizer

    from agent_r1.rollout import run_episodes

    params = parse_params({**GUESS, "rollout": {"n": 1, "continuous": False}})
    secret = random.Random("g7").randint(1, 100)
    miss = secret + 1 if secret < 100 else secret - 1
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    engine = ScriptedEngine(tokenizer, [f"<guess>{miss}</guess>", f"<guess>{secret}</guess>"])
    env = make_env(params)
    batch = run_episodes(engine, env, tokenizer, [{"id": "g7", "question": "q", "answers": ["?"]}], params.rollout)
    [info] = batch.info
    assert info["termination"] == "env_done" and info["em"] == 1.0 and info["turns"] == 2
    text = tokenizer.decode(batch.input_ids[0][batch.attention_mask[0].bool()])
    assert ("lower" if miss > secret else "higher") in text
    rewards, mask = batch.token_rewards[0], batch.action_mask[0]
    last_actions = [int(i) for i in torch.nonzero(mask).flatten() if i + 1 == len(mask) or mask[i + 1] == 0]
    assert len(last_actions) == 2 and rewards[last_actions[1]] == pytest.approx(2**-0.5)
    assert float(rewards.abs().sum()) == pytest.approx(2**-0.5)


class InOrder(GenerationEngine):
    """One episode's replies in order, whatever its context (a rewritten one is no prefix of the last)."""

    def __init__(self, tokenizer, replies: list[str]):  # noqa: ANN001 - a tokenizer
        self.replies = [tokenizer(r, add_special_tokens=False)["input_ids"] for r in replies]
        self.calls: list[tuple[list[int], int, GenerationOutput]] = []

    def generate(self, prompts, max_new_tokens, temperature=1.0, top_p=1.0, stop_strings=(), seed=None):  # noqa: ANN001, ANN201
        [prompt] = prompts
        ids = self.replies[len(self.calls)]
        out = GenerationOutput(list(ids), [-0.1] * len(ids), "stop")
        self.calls.append((list(prompt), len(ids), out))
        return [out]


class SummarisedGuessing(GuessNumber):
    """Guess the number, shown between turns only the task and a one-line summary of the guesses so far."""

    rewrites_context = True

    def reset(self, record: dict) -> str:
        self.task, self.notes = super().reset(record), []
        return self.task

    def step(self, action):  # noqa: ANN001, ANN201 - the base's signature
        t = super().step(action)
        self.notes.append(f"{action.calls[0].arguments['number']}: {t.observation}")
        if len(self.notes) >= 2:  # from the second turn on, the history is a summary
            t.context = [{"role": "user", "content": f"{self.task}\nSo far: {'; '.join(self.notes)}"}]
        return t


def test_an_env_that_rewrites_the_context_is_shown_it_and_its_steps_train_on_it(policy_dir, monkeypatch) -> None:
    """Turn 3 is generated after the env's summary (not the history); the flat record keeps every
    turn; the steps' prompts are the contexts as shown; and such an env trains only as steps."""
    import random
    import sys

    from transformers import AutoTokenizer

    from agent_r1.rollout import run_episodes
    from agent_r1.rollout.steps import steps_from_trajectories

    monkeypatch.setitem(sys.modules, "summarised_guessing", sys.modules[__name__])
    env_params = {"name": "summarised_guessing:SummarisedGuessing", "options": {"high": 100}, "max_turns": 4}
    with pytest.raises(ParamsError, match=r"rewrites the context.*representation: step"):
        parse_params({"env": env_params, "experiments": {}})
    params = parse_params({"env": env_params, "rollout": {"n": 1, "continuous": False},
                           "algorithm": {"representation": "step"}})
    secret = random.Random("g3").randint(1, 100)
    guesses = [1 if secret != 1 else 2, 100 if secret != 100 else 99, secret]
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    engine = InOrder(tokenizer, [f"<guess>{g}</guess>" for g in guesses])
    batch = run_episodes(engine, make_env(params), tokenizer, [{"id": "g3", "question": "q", "answers": ["?"]}],
                         params.rollout)
    assert batch.info[0]["em"] == 1.0 and batch.info[0]["turns"] == 3
    prompts = [tokenizer.decode(p) for p, _, _ in engine.calls]
    flat = tokenizer.decode(batch.input_ids[0][batch.attention_mask[0].bool()])
    acted = "assistant\n<guess>"
    assert "So far" not in prompts[1] and prompts[1].count(acted) == 1  # turn 2: the history as it grew
    assert "So far: " in prompts[2] and acted not in prompts[2]  # turn 3: the summary only
    assert "So far" not in flat and flat.count(acted) == 3  # the flat record: the whole history
    steps = steps_from_trajectories(batch)
    assert [steps.input_ids[k, : int(steps.prompt_length[k])].tolist() for k in range(3)] == [
        p for p, _, _ in engine.calls]
