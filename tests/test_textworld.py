"""The text-world task on real TextWorld games: games byte-stable and disjoint, the env played by
its walkthrough, a random player and the warm start's expert, through the same runner as a policy."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pandas as pd
import pytest

from agent_r1.config import ParamsError, parse_params
from agent_r1.data.prepare import load_questions_and_corpus
from agent_r1.data.textworld_games import FIXED_SERIAL, SERIAL, build_game, clean_feedback
from agent_r1.env.agent_env import AgentEnvRunner
from agent_r1.env.make import make_env, needs_index

SMALL = {"rooms": 2, "objects": 2, "quest_length": 2}
OPTIONS = {"n_train": 4, "n_test": 2, "n_ood": 2, "workers": 1,
           "world": SMALL, "ood_world": {"rooms": 3, "objects": 3, "quest_length": 3}}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[pd.DataFrame, Path]:
    """The prepare stage's data layer on 8 small games: questions and the folder the games went to."""
    folder = tmp_path_factory.mktemp("prepared")
    params = parse_params({"data": {"source": "textworld", "val_questions": 1, "options": OPTIONS}})
    questions, _ = load_questions_and_corpus(params.data, folder / "raw", files_into=folder)
    return questions, folder


def runner(folder: Path, max_turns: int = 6) -> AgentEnvRunner:
    params = parse_params({"env": {"name": "textworld", "options": {"games": str(folder / "games")},
                                   "max_turns": max_turns}})
    env = make_env(params)
    assert isinstance(env, AgentEnvRunner) and not needs_index(params)
    return env


def test_a_game_is_the_same_bytes_whatever_its_folder_and_compile_date(tmp_path: Path) -> None:
    a = build_game(7, SMALL, str(tmp_path / "a"), "g")
    b = build_game(7, SMALL, str(tmp_path / "b"), "g")
    assert a == b and a["walkthrough"]
    for suffix in (".z8", ".json"):
        assert digest(tmp_path / "a" / f"g{suffix}") == digest(tmp_path / "b" / f"g{suffix}")
    assert (tmp_path / "a/g.z8").read_bytes()[SERIAL] == FIXED_SERIAL  # not today's date
    assert not (tmp_path / "a/g.ni").exists()
    assert build_game(8, SMALL, str(tmp_path / "c"), "g")["opening"] != a["opening"]


def test_splits_are_disjoint_games_with_their_files(prepared: tuple[pd.DataFrame, Path]) -> None:
    questions, folder = prepared
    assert questions.groupby(["source", "split"]).size().to_dict() == {
        ("textworld", "test"): 2, ("textworld", "train"): 3, ("textworld", "val"): 1, ("textworld-ood", "test"): 2}
    assert questions["question"].is_unique and questions["id"].is_unique  # no held-out game is a training game
    for game_id in questions["id"]:
        assert (folder / "games" / f"{game_id}.z8").is_file() and (folder / "games" / f"{game_id}.json").is_file()
    ood = questions[questions["source"] == "textworld-ood"]
    assert (ood["type"] == "quest3").all() and (questions[questions["source"] == "textworld"]["type"] == "quest2").all()
    assert all(len(w) >= 2 for w in questions["sub_queries"])


def test_the_walkthrough_wins_every_game_with_return_one(prepared: tuple[pd.DataFrame, Path]) -> None:
    questions, folder = prepared
    env = runner(folder)
    for record in questions.to_dict("records"):
        episode = env.reset(record)
        shown = episode.messages[1]["content"]
        assert shown.startswith(record["question"]) and "\nCommands: " in shown and "$$" not in shown  # no banner
        assert "<act>command</act>" in episode.messages[0]["content"]
        for text in env.expert_plan(record):
            assert not episode.done
            env.step_batch([episode], [text])
        assert episode.termination == "env_done" and episode.metrics["em"] == 1.0 and episode.metrics["f1"] == 1.0
        assert sum(episode.final_turn_rewards) == pytest.approx(1.0) and episode.tools == {}  # the game closed


def test_a_malformed_turn_is_an_error_the_game_never_sees(prepared: tuple[pd.DataFrame, Path]) -> None:
    questions, folder = prepared
    env = runner(folder, max_turns=2)
    episode = env.reset(questions.iloc[0].to_dict())
    [res] = env.step_batch([episode], ["go east"])  # no tag
    assert res.observation.startswith("<information>Error: ") and episode.invalid_calls == 1
    assert episode.tools["env"].moves == 0
    [res] = env.step_batch([episode], ["<act>dance wildly</act>"])  # a command the game refuses
    assert res.done and episode.termination == "max_turns" and episode.metrics["em"] == 0.0
    assert episode.metrics["env/moves"] == 1


def test_the_random_baseline_draws_listed_commands_through_the_same_runner(
    prepared: tuple[pd.DataFrame, Path],
) -> None:
    from agent_r1.evaluation.greedy import play_random

    questions, folder = prepared
    params = parse_params({"env": {"name": "textworld", "options": {"games": str(folder / "games")}, "max_turns": 4}})
    records = questions[questions["split"] == "test"].to_dict("records")
    first, again = play_random(records, params, seed=0), play_random(records, params, seed=0)
    assert first == again and len(first) == len(records)  # seeded
    for row in first:
        assert row["turns"] <= 4 and row["tool_calls"] == row["turns"] and row["invalid_calls"] == 0
        assert row["em"] in (0.0, 1.0) and 0.0 <= row["f1"] <= 1.0 and row["source"].startswith("textworld")
    env = runner(folder)
    episode = env.reset(records[0])
    call = episode.tools["env"].random_call(random.Random(0))
    assert call.arguments["command"] in episode.messages[1]["content"].split("\nCommands: ")[1].split(", ")
    env.release([episode])


def test_the_warm_start_expert_plays_the_walkthrough_token_exactly(
    prepared: tuple[pd.DataFrame, Path], policy_dir: Path
) -> None:
    from transformers import AutoTokenizer

    from agent_r1.training.sft import expert_demonstrations

    questions, folder = prepared
    params = parse_params({"env": {"name": "textworld", "options": {"games": str(folder / "games")}},
                           "rollout": {"max_total_tokens": 1536}})
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    records = questions[questions["split"] == "train"].to_dict("records")
    demos = expert_demonstrations(params, tokenizer, make_env(params), records)
    for i, record in enumerate(records):
        row = demos.input_ids[i][demos.action_mask[i].bool()].tolist()
        assert tokenizer.decode(row) == "".join(f"<act>{c}</act>" for c in record["sub_queries"])
        assert demos.info[i]["em"] == 1.0 and demos.info[i]["turns"] == len(record["sub_queries"])


def test_feedback_loses_the_prompt_and_status_line() -> None:
    raw = "\nYou pick up the key.\n\n\n\n>                                  -= Attic =-0/3"
    assert clean_feedback(raw) == "You pick up the key."


def test_textworld_options_are_checked_naming_the_key() -> None:
    with pytest.raises(ParamsError, match=r"data.options"):
        parse_params({"data": {"source": "textworld", "options": {"world": {"rooms": 0}}}})
    with pytest.raises(ParamsError, match=r"quest_length must exceed"):
        parse_params({"data": {"source": "textworld", "options": {"ood_world": SMALL, "world": SMALL}}})
    with pytest.raises(ParamsError, match=r"env.options.list_commands"):
        parse_params({"env": {"name": "textworld", "options": {"list_commands": "sometimes"}}})


def test_a_missing_game_is_an_error_naming_the_option(tmp_path: Path) -> None:
    env = runner(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"env.options.games: no game .*nope\.z8"):
        env.reset({"id": "nope", "question": "q", "answers": ["won"]})
