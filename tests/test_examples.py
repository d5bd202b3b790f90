"""The example task of ``examples/arithmetic.py``: a tool, a reward and a data source defined
outside ``agent_r1/`` and used by the pipeline through params alone."""

from __future__ import annotations

import pytest

from agent_r1.config import DataConfig, ParamsError, RewardConfig, parse_params
from agent_r1.data.sources import get_source
from examples.arithmetic import (
    Calculator,
    evaluate_expression,
    format_number,
    numeric_reward,
    problems,
)

EXAMPLE_PARAMS = {
    "data": {"source": "examples.arithmetic:ArithmeticProblems", "options": {"n_train": 40, "n_test": 12}, "val_questions": 4},
    "env": {"tools": ["examples.arithmetic:Calculator"], "reward": {"scheme": "examples.arithmetic:numeric_reward"}},
    "sft": {"enabled": False},
}


@pytest.mark.parametrize(
    ("expression", "value"),
    [("37*24-158", 730.0), ("(12 + 30) * 4", 168.0), ("-3 + 10 / 4", -0.5), ("2*(3+(4-1))", 12.0)],
)
def test_calculator_evaluates_arithmetic(expression: str, value: float) -> None:
    assert evaluate_expression(expression) == value
    assert Calculator().validate({"expression": expression}) is None
    assert Calculator().execute({"expression": expression}) == format_number(value)


@pytest.mark.parametrize(
    ("value", "digits", "text"),
    [(730.0, 2, "730"), (2 / 3, 6, "0.666667"), (2 / 3, 2, "0.67"), (0.5, 3, "0.5"), (9.6, 0, "10")],
)
def test_format_number_rounds_to_digits_and_drops_trailing_zeros(value: float, digits: int, text: str) -> None:
    assert format_number(value, digits) == text


@pytest.mark.parametrize(
    ("expression", "why"),
    [("__import__('os').system('true')", "only numbers"), ("2 ** 10", "only numbers"), ("x + 1", "only numbers"),
     ("1/0", "division by zero"), ("3 +", "not an arithmetic expression"), ("True + 1", "only numbers")],
)
def test_calculator_rejects_what_is_not_arithmetic(expression: str, why: str) -> None:
    assert why in Calculator().validate({"expression": expression})


def test_numeric_reward_compares_numbers_not_strings() -> None:
    cfg = RewardConfig()
    assert numeric_reward("730", ["730"], True, cfg) == 1.0
    assert numeric_reward("730 pens", ["730"], True, cfg) == 1.0
    assert numeric_reward("$1,250.0", ["1250"], True, cfg) == 1.0
    assert numeric_reward("731", ["730"], True, cfg) == 0.0
    assert numeric_reward("many", ["730"], True, cfg) == 0.0
    assert numeric_reward(None, ["730"], False, cfg) == pytest.approx(cfg.format_score - 1.0)


def test_problems_are_seeded_distinct_and_answered_by_their_expression() -> None:
    first, again, other = problems(60, seed=1), problems(60, seed=1), problems(60, seed=2)
    assert first == again and first != other
    assert len({r["question"] for r in first}) == 60
    for record in first:
        assert record["answers"] == [format_number(evaluate_expression(record["sub_queries"][0]))]
        assert float(record["answers"][0]).is_integer() and float(record["answers"][0]) > 0


def test_data_source_splits_by_options() -> None:
    data = DataConfig.model_validate(EXAMPLE_PARAMS["data"])
    questions, corpus = get_source(data.source, data.options).generate(data)
    assert questions["split"].value_counts().to_dict() == {"train": 40, "test": 12}
    assert set(questions["source"]) == {"arithmetic"} and len(corpus) > 0
    defaults = get_source(data.source).options  # its Options' defaults
    assert (defaults.n_train, defaults.n_test) == (400, 100)
    with pytest.raises(ParamsError, match=r"data.options.n_test: must be >= 1, got 0"):
        parse_params({**EXAMPLE_PARAMS, "data": {**EXAMPLE_PARAMS["data"], "options": {"n_train": 40, "n_test": 0}}})


def test_params_name_the_example_as_plugins() -> None:
    params = parse_params(EXAMPLE_PARAMS)
    assert params.env.tools == ["examples.arithmetic:Calculator"]
    assert params.data.source == "examples.arithmetic:ArithmeticProblems"


@pytest.mark.parametrize("fmt", ["tags", "tool_call"])
def test_an_episode_with_the_calculator_is_scored_by_the_numeric_reward(fmt: str) -> None:
    from agent_r1.env import ToolCall, make_env

    params = parse_params({**EXAMPLE_PARAMS, "env": {**EXAMPLE_PARAMS["env"], "format": fmt}})
    env = make_env(params)  # the index stage still builds one, but this tool set needs none
    assert list(env.tools) == ["calculate"] and "23*18-9" in "".join(m["content"] for m in env.example_messages)
    record = problems(1, seed=0)[0] | {"split": "test"}
    episodes = [env.reset(record) for _ in range(2)]
    call = env.format.render_call(ToolCall("calculate", {"expression": record["sub_queries"][0]}))
    [result, _] = env.step_batch(episodes, [call, env.format.render_call(ToolCall("calculate", {"expression": "2 **"}))])
    assert record["answers"][0] in result.observation and episodes[1].invalid_calls == 1
    env.step_batch(episodes, [env.format.render_answer(record["answers"][0]), env.format.render_answer("0")])
    assert [e.outcome_reward for e in episodes] == [1.0, 0.0]


def test_a_plugin_outside_plugins_code_is_named_before_a_stage_starts() -> None:
    """DVC re-runs a stage when its deps change, and ``plugins.code`` is the stages' dep on the
    user's code: a plugin elsewhere would leave its results stale after an edit."""
    from agent_r1.config import plugin_problems, plugin_refs

    raw = {**EXAMPLE_PARAMS, "experiments": {"mine": {"overrides": {"env": {"one_shot": False},
                                                                      "algorithm": {"name": "examples.estimators:x"}}}}}
    with pytest.raises(ValueError, match="experiments.mine.overrides.algorithm.name: plugin 'examples.estimators:x'"):
        parse_params(raw)  # the overrides' plugins are checked like the rest
    params = parse_params(EXAMPLE_PARAMS)
    assert plugin_refs(params) == {
        "data.source.0": "examples.arithmetic:ArithmeticProblems", "env.tools.0": "examples.arithmetic:Calculator",
        "env.reward.scheme": "examples.arithmetic:numeric_reward",
    }
    problems = plugin_problems(params)
    assert [p.split(":")[0] for p in problems] == ["data.source.0", "env.tools.0", "env.reward.scheme"]
    assert "outside plugins.code ('plugins')" in problems[0]
    assert plugin_problems(parse_params({**EXAMPLE_PARAMS, "plugins": {"code": "examples"}})) == []


def test_params_check_names_a_plugin_outside_plugins_code(tmp_path, capsys) -> None:
    import yaml

    from agent_r1.cli import main

    (file := tmp_path / "params.yaml").write_text(yaml.safe_dump(EXAMPLE_PARAMS))
    assert main(["params", "check", str(file)]) == 2
    assert "env.tools.0: plugin 'examples.arithmetic:Calculator' lives in" in capsys.readouterr().err
    file.write_text(yaml.safe_dump({**EXAMPLE_PARAMS, "plugins": {"code": "examples"}}))
    assert main(["params", "check", str(file)]) == 0


def test_the_prepare_stage_writes_files_its_readers_accept(tmp_path) -> None:
    """No problem has supporting titles: the all-empty list column must still be written as list<string>."""
    from agent_r1.data.schema import read_corpus, read_questions
    from agent_r1.stages.prepare import prepare

    prepare(parse_params(EXAMPLE_PARAMS), raw=tmp_path / "raw", out=tmp_path / "prepared", metrics=tmp_path / "data.json")
    test = read_questions(tmp_path / "prepared/test.parquet")
    assert len(test) == 12 and test["supporting_titles"].map(len).sum() == 0
    assert len(read_corpus(tmp_path / "prepared/corpus.parquet")) > 0
