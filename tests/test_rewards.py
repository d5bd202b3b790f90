"""Answer scoring and reward formulas on hand-worked examples, and the reward-hacking property tests."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_r1.config import EnvConfig, ProcessRewardConfig, RewardConfig
from agent_r1.data.answers import normalize_answer
from agent_r1.env import SearchTool, ToolEnv
from agent_r1.env.rewards import (
    answer_score,
    exact_match,
    f1_score,
    finalize_process_rewards,
    outcome_reward,
    turn_process_reward,
)
from agent_r1.retrieval.base import Hit


def test_normalize_answer() -> None:
    assert normalize_answer("  The Cat's  HAT! ") == "cats hat"
    assert normalize_answer("an apple, a pear") == "apple pear"
    assert normalize_answer("Theatre") == "theatre"  # articles only as whole words
    assert normalize_answer("...") == ""


def test_exact_match_and_f1() -> None:
    assert exact_match("the Paris", ["Lyon", "paris"]) == 1.0
    assert exact_match("Paris, France", ["Paris"]) == 0.0
    assert f1_score("New York City", ["new york"]) == pytest.approx(0.8)  # P = 2/3, R = 1
    assert f1_score("York City", ["New York", "York City"]) == 1.0  # max over aliases
    assert f1_score("Boston", ["New York"]) == 0.0
    assert f1_score("the", ["a"]) == 1.0  # both normalise to empty
    assert f1_score("the", ["Paris"]) == 0.0
    assert f1_score("Paris", []) == 0.0
    assert answer_score(None, ["Paris"], "f1") == 0.0
    with pytest.raises(ValueError, match="unknown answer metric 'acc'"):
        answer_score("x", ["x"], "acc")


@pytest.mark.parametrize(
    "scheme, metric, answer, valid, expected",
    [
        ("paper", "f1", "Paris", True, 1.0),
        ("paper", "f1", "New York City", True, 0.8),
        ("paper", "em", "New York City", True, 0.0),
        ("paper", "f1", "Lyon", True, 0.0),  # valid but wrong: zero, not negative
        ("paper", "f1", None, False, -0.9),  # never answered: format_score - 1
        ("answer_only", "f1", None, False, 0.0),
        ("answer_only", "f1", "Paris", True, 1.0),
        ("answer_plus_format", "f1", "Paris", True, 1.1),
        ("answer_plus_format", "f1", "Lyon", True, 0.1),
        ("answer_plus_format", "f1", None, False, 0.0),
    ],
)
def test_outcome_reward(scheme: str, metric: str, answer: str | None, valid: bool, expected: float) -> None:
    golds = ["New York", "Paris"] if answer == "New York City" else ["Paris"]
    cfg = RewardConfig(scheme=scheme, answer_metric=metric, format_score=0.1)
    assert outcome_reward(answer, golds, valid, cfg) == pytest.approx(expected)


# Process rewards that pay for calls too (params.yaml's valid_call is 0): every term of the sum is exercised.
PAID_CALLS = ProcessRewardConfig(valid_call=0.02, new_support_doc=0.1, invalid_call=-0.05, cap=0.3)


def test_turn_process_reward() -> None:
    cfg = PAID_CALLS  # valid 0.02, invalid -0.05; the tools' own reward (a search's support docs) comes summed
    assert turn_process_reward(1, 0.1, 0, cfg) == pytest.approx(0.12)
    assert turn_process_reward(2, 0.0, 1, cfg) == pytest.approx(-0.01)
    assert turn_process_reward(0, 0.0, 0, cfg) == 0.0
    assert turn_process_reward(3, 0.3, 3, ProcessRewardConfig(enabled=False)) == 0.0


def test_finalize_process_rewards() -> None:
    cfg = PAID_CALLS  # cap 0.3, only_if_answered
    assert finalize_process_rewards([0.12, 0.12, 0.12, 0.0], True, cfg) == pytest.approx([0.1, 0.1, 0.1, 0.0])
    assert finalize_process_rewards([0.2, -0.05, 0.2], True, cfg) == pytest.approx([0.15, -0.05, 0.15])
    assert finalize_process_rewards([0.12, 0.02], True, cfg) == pytest.approx([0.12, 0.02])  # under the cap
    assert finalize_process_rewards([0.12, -0.05, 0.02], False, cfg) == pytest.approx([0.0, -0.05, 0.0])
    loose = ProcessRewardConfig(only_if_answered=False, cap=1.0)
    assert finalize_process_rewards([0.12, -0.05], False, loose) == pytest.approx([0.12, -0.05])
    assert finalize_process_rewards([0.5, 0.5], True, ProcessRewardConfig(cap=0.0)) == [0.0, 0.0]
    assert finalize_process_rewards([0.1, -0.1], True, ProcessRewardConfig(enabled=False)) == [0.0, 0.0]
    assert finalize_process_rewards([], False, cfg) == []


# ------------------------------------------------- property: no reward hacking
GOLD, SUPPORT = "Quorvale", ["Velmora Labs", "Ilsa Brandt"]
RECORD = {"id": "q0", "question": "Where was the founder of Velmora Labs born?", "answers": [GOLD],
          "supporting_titles": SUPPORT}


class TitleIndex:
    """Every query returns one document titled by the query: searching a supporting title surfaces it."""

    def search(self, queries: list[str], top_k: int) -> list[list[Hit]]:
        return [[Hit(f"doc:{q}", q, f"text about {q}", 1.0)] for q in queries]


# Non-answer turns a policy can take, from the cheapest to the most process-reward hungry.
SEARCH_TURNS = [
    "<search>Velmora Labs</search>",  # surfaces a supporting doc
    "<search>Ilsa Brandt</search>",
    "<search>Tarvel Systems</search>",  # valid, no support
    "<search>Velmora Labs</search><search>Ilsa Brandt</search><search>Quorvale</search>",  # 3 calls at once
    "<search>Velmora",  # malformed: unclosed
    "<search> </search><search>x</search>",  # one invalid (empty) and one valid call
    "<answer>a</answer><answer>b</answer>",  # malformed: two answers
    "<search>a</search>" * 4,  # malformed: too many calls
]
search_turn = st.sampled_from(SEARCH_TURNS)


def play(env: ToolEnv, turns: list[str], truncate: bool = False) -> float:
    """Run one episode through the env; return outcome + sum of finalised process rewards."""
    ep = env.reset(RECORD)
    for text in turns:
        if ep.done:
            break
        env.step_batch([ep], [text])
    if not ep.done:
        assert truncate, "an episode must end by answer, no action or max_turns"
        env.finish(ep, "max_length")
    return ep.outcome_reward + sum(ep.final_turn_rewards)


def never_answering(max_turns: int) -> st.SearchStrategy[tuple[list[str], bool]]:
    """Turns of an episode that never answers: it searches, then stops, runs out of turns or is truncated."""
    ending = st.sampled_from(["I do not know.", "", None])  # None: keeps searching (max_turns or truncation)

    def build(searches: list[str], end: str | None, truncate: bool) -> tuple[list[str], bool]:
        if end is not None:
            return [*searches, end], truncate
        return (searches if truncate else [*searches, *["<search>Tarvel Systems</search>"] * max_turns]), truncate

    return st.builds(build, st.lists(search_turn, max_size=max_turns), ending, st.booleans())


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_never_answering_never_beats_answering_correctly(data: st.DataObject) -> None:
    """REQUIRED (reward hacking): under the default config no amount of searching pays more."""
    cfg = EnvConfig()
    env = ToolEnv([SearchTool(TitleIndex(), 3)], cfg)
    never_turns, truncate = data.draw(never_answering(cfg.max_turns))
    prefix = data.draw(st.lists(search_turn, max_size=cfg.max_turns - 1))
    answer = data.draw(st.sampled_from([GOLD, "quorvale", f"The {GOLD}."]))
    never = play(env, never_turns, truncate=truncate)
    correct = play(env, [*prefix, f"<answer>{answer}</answer>"])
    assert never < correct, (never_turns, prefix)


@settings(max_examples=150, deadline=None)
@given(st.lists(search_turn, max_size=EnvConfig().max_turns - 1), st.sampled_from(["", "I give up.", None]),
       st.booleans())
def test_never_answering_never_beats_answering_wrong_with_the_same_searches(
    prefix: list[str], ending: str | None, truncate: bool
) -> None:
    """Also holds: with the same search turns, a wrong answer still beats no answer."""
    env = ToolEnv([SearchTool(TitleIndex(), 3)], EnvConfig())
    tail = [ending] if ending is not None else ["<search>Velmora Labs</search>"] * EnvConfig().max_turns
    never = play(env, [*prefix, *tail], truncate=truncate)
    wrong = play(env, [*prefix, "<answer>Lyon</answer>"])
    assert never < wrong


def test_reward_totals_on_worked_episodes() -> None:
    env = ToolEnv([SearchTool(TitleIndex(), 3)], EnvConfig(reward=RewardConfig(process=PAID_CALLS)))
    # two support-surfacing searches (+0.12 each), correct answer: 1 + 0.24
    assert play(env, ["<search>Velmora Labs</search>", "<search>Ilsa Brandt</search>", f"<answer>{GOLD}</answer>"]) \
        == pytest.approx(1.24)
    # three calls at once: 3 * 0.02 + 2 * 0.1 = 0.26, then a repeated search (+0.02 only): 0.28 <= cap
    assert play(env, [SEARCH_TURNS[3], "<search>Velmora Labs</search>", "<answer>Lyon</answer>"]) \
        == pytest.approx(0.28)
    # searches forever: positives zeroed, the malformed turn still costs
    assert play(env, ["<search>Velmora Labs</search>", "<search>Velmora", "<search>Ilsa Brandt</search>",
                      "<search>Quorvale</search>"]) == pytest.approx(-0.9 - 0.05)


def test_the_property_detects_a_hackable_config() -> None:
    """The check above has teeth: an uncapped-style, always-paid process reward (the kind a probe saw hacked) fails it."""
    hackable = EnvConfig(
        reward=RewardConfig(
            scheme="answer_only",
            answer_metric="em",
            process=ProcessRewardConfig(new_support_doc=0.5, cap=1.0, only_if_answered=False),
        )
    )
    env = ToolEnv([SearchTool(TitleIndex(), 3)], hackable)
    never = play(env, [SEARCH_TURNS[3], "I do not know."])
    correct = play(env, ["<search>Velmora", f"<answer>{GOLD}</answer>"])
    assert never == pytest.approx(1.0) and correct == pytest.approx(0.95)
    assert not never < correct
