"""Stateful environments (env.name): one AgentEnv instance per episode, played behind the rollout's
env interface, from params alone (examples/guess_number.py)."""

from __future__ import annotations

import pytest
import torch

from agent_r1.config import ParamsError, parse_params
from agent_r1.env.agent_env import AgentEnvRunner
from agent_r1.env.make import make_env
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
