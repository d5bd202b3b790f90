"""A user's own tool and reward, named in params as ``package.module:Name``, end to end in the ToolEnv.

The plugin module is real user code written to a temporary folder on ``sys.path``
(as the project root is when a stage runs); nothing in ``agent_r1`` is edited.
"""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

import pandas as pd
import pytest

from agent_r1.config import ParamsError, RetrievalConfig, parse_params

PLUGIN = '''
from agent_r1.env.tools import Tool, ToolExample

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


class Calculator(Tool):
    name = "calc"
    description = "Compute 'a op b' for integers a, b and op one of + - *."
    parameters = {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}
    example = ToolExample("What is 6 times 7?", (({"expression": "6 * 7"}, "42"),), "42")

    def execute(self, args):
        a, op, b = args["expression"].split()
        return _OPS[op](int(a), int(b))


class AnotherSearch(Calculator):
    name = "search"


class NotATool:
    name = "thing"


def my_reward(answer, golds, format_valid, cfg):
    """7 for the right number, -1 otherwise: a value no built-in scheme gives."""
    if not format_valid or answer is None:
        return -1.0
    return 7.0 if answer.strip() == golds[0] else -1.0


def two_args(answer, golds):
    return 0.0
'''

_names = itertools.count()


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The name of a fresh plugin module (a new name each test: modules and registries cache imports)."""
    name = f"user_plugin_{next(_names)}_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _index(tmp_path: Path) -> Path:
    from agent_r1.retrieval import build_index

    corpus = pd.DataFrame({"doc_id": ["d1", "d2"], "title": ["Velmora Labs", "Ilsa Brandt"],
                           "text": ["Velmora Labs was founded by Ilsa Brandt.", "Ilsa Brandt was born in Quorvale."]})
    build_index("bm25", corpus, tmp_path / "bm25", RetrievalConfig())
    return tmp_path / "bm25"


RECORD = {"id": "a1", "question": "What is 2 plus 3?", "answers": ["5"], "supporting_titles": []}


@pytest.mark.parametrize("fmt", ["tags", "tool_call"])
def test_plugin_tool_and_reward_run_in_the_env(plugin: str, tmp_path: Path, fmt: str) -> None:
    from agent_r1.env import ToolCall, make_env

    params = parse_params({"env": {"format": fmt, "tools": ["search", f"{plugin}:Calculator"],
                                   "reward": {"scheme": f"{plugin}:my_reward"}}})
    env = make_env(params, _index(tmp_path))
    assert sorted(env.tools) == ["calc", "search"]
    if fmt == "tags":  # the tag's argument comes from the tool's schema
        assert "<calc>expression</calc>" in env.system_prompt and "</calc>" in env.format.stop_strings
    else:
        assert [s["function"]["name"] for s in env.tool_specs()] == ["search", "calc"]
    eps = [env.reset(RECORD) for _ in range(3)]
    calc = env.format.render_call(ToolCall("calc", {"expression": "2 + 3"}))
    search = env.format.render_call(ToolCall("search", {"query": "Ilsa Brandt"}))
    results = env.step_batch(eps, [calc, search, calc.replace("2 + 3", "2 ^ 3")])
    assert results[0].observation == env.format.format_observation(["5"])
    assert "Doc 1 (Ilsa Brandt)" in results[1].observation  # search still works beside the plugin
    assert "tool 'calc' failed: KeyError" in results[2].observation and eps[2].invalid_calls == 1
    env.step_batch(eps, [env.format.render_answer("5"), env.format.render_answer("6"), "gave up"])
    assert [e.outcome_reward for e in eps] == [7.0, -1.0, -1.0]  # the plugin reward scored them
    assert [e.termination for e in eps] == ["answer", "answer", "no_action"]
    assert eps[0].metrics["em"] == 1.0 and eps[0].metrics["support_docs_found"] == 0


def test_tool_set_without_search_needs_no_index_and_shows_its_own_example(plugin: str) -> None:
    from agent_r1.env import make_env

    params = parse_params({"env": {"tools": [f"{plugin}:Calculator"], "reward": {"process": {"new_support_doc": 0.5}}}})
    env = make_env(params)  # no index anywhere
    assert [m["content"] for m in env.example_messages] == [
        "Question: What is 6 times 7?", "<calc>6 * 7</calc>", "<information>42</information>", "<answer>42</answer>"]
    assert "Follow the example." in env.system_prompt
    record = {**RECORD, "supporting_titles": ["6"]}
    [res] = env.step_batch([ep := env.reset(record)], ["<calc>2 * 3</calc>"])
    assert res.observation == "<information>6</information>"
    assert ep.turn_rewards == [params.env.reward.process.valid_call]  # a calculator result is no support doc


def test_one_shot_without_any_example_falls_back_to_none(caplog: pytest.LogCaptureFixture) -> None:
    from agent_r1.config import EnvConfig
    from agent_r1.env import Tool, ToolEnv

    class Echo(Tool):
        name = "echo"
        description = "Repeat the text."
        parameters = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}

        def execute(self, args: dict) -> str:
            return args["text"]

    with caplog.at_level(logging.WARNING):
        env = ToolEnv([Echo()], EnvConfig(one_shot=True))
    assert env.example_messages == [] and "example" not in env.system_prompt
    assert "none of the tools ['echo'] has an example" in caplog.text


def test_search_index_given_loaded_or_not_at_all(tmp_path: Path) -> None:
    from agent_r1.env import make_env
    from agent_r1.retrieval import load_index

    loaded = load_index(_index(tmp_path))
    assert make_env(parse_params({}), index=loaded).tools["search"].index is loaded  # evaluation's: not loaded twice
    with pytest.raises(ValueError, match="env.tools: tool 'search' needs a retrieval index, and none was given"):
        make_env(parse_params({}))


def test_builtin_tools_are_called_by_their_registered_name() -> None:
    """The params check takes a built-in's tool name to be its registered name (see EnvConfig.tools)."""
    from agent_r1.registry import TOOLS

    assert all(TOOLS.load(name).name == name for name in TOOLS.names())


@pytest.mark.parametrize(
    "env, message",
    [
        ({"tools": ["search", "no_such_module_xyz:Calculator"]},
         "env.tools.1: plugin 'no_such_module_xyz:Calculator' could not be imported: ModuleNotFoundError"),
        ({"tools": ["search", "{p}:Missing"]}, "env.tools.1: plugin '{p}:Missing' could not be imported: "
                                               "ImportError: module '{p}' has no attribute 'Missing'"),
        ({"tools": ["{p}:NotATool"]}, "env.tools.0: plugin '{p}:NotATool' is no tool: must be a subclass of "
                                      "agent_r1.env.tools.Tool"),
        ({"tools": ["search", "{p}:AnotherSearch"]}, "env.tools: each tool name may appear once; repeated: ['search']"),
        ({"reward": {"scheme": "no_such_module_xyz:fn"}},
         "env.reward.scheme: plugin 'no_such_module_xyz:fn' could not be imported: ModuleNotFoundError"),
        ({"reward": {"scheme": "{p}:nothing"}}, "env.reward.scheme: plugin '{p}:nothing' could not be imported"),
        ({"reward": {"scheme": "{p}:two_args"}},
         "env.reward.scheme: plugin '{p}:two_args' is no reward scheme: must take the arguments answer, golds, "
         "format_valid, cfg; missing format_valid, cfg"),
        ({"reward": {"scheme": "{p}:Calculator"}}, "env.reward.scheme: plugin '{p}:Calculator' is no reward scheme: "
                                                   "must be a function"),
        ({"format": "{p}:Calculator"}, "env.format: plugin '{p}:Calculator' is no action format: must be a subclass"),
    ],
)
def test_bad_plugins_fail_the_params_check_naming_the_key(plugin: str, env: dict, message: str) -> None:
    env = {k: ([x.format(p=plugin) for x in v] if isinstance(v, list) else v) for k, v in env.items()}
    if "reward" in env:
        env["reward"] = {"scheme": env["reward"]["scheme"].format(p=plugin)}
    if "format" in env:
        env["format"] = env["format"].format(p=plugin)
    with pytest.raises(ParamsError) as err:
        parse_params({"env": env})
    assert message.format(p=plugin) in str(err.value)


def test_repeated_tool_is_an_error() -> None:
    with pytest.raises(ParamsError, match="env.tools: each tool name may appear once; repeated: \\['search'\\]"):
        parse_params({"env": {"tools": ["search", "search"]}})
    with pytest.raises(ParamsError, match="env.tools: List should have at least 1 item"):
        parse_params({"env": {"tools": []}})


@pytest.mark.slow  # ~5 s: builds a tiny model and runs a real episode
def test_chat_runs_a_plugin_tool_set_without_an_index(
    plugin: str, tmp_path: Path, policy_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`agent-r1 chat` builds its env with make_env: the plugin tools and reward, and no index to load."""
    import torch
    import yaml
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from agent_r1.cli import main

    tok = AutoTokenizer.from_pretrained(policy_dir)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "policy")
    tok.save_pretrained(tmp_path / "policy")
    params = {"env": {"tools": [f"{plugin}:Calculator"], "max_turns": 2, "reward": {"scheme": f"{plugin}:my_reward"}},
              "rollout": {"max_new_tokens": 8, "max_total_tokens": 512, "dtype": "float32"}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    rc = main(["chat", "What is 2 plus 3?", "--answer", "5", "--model", str(tmp_path / "policy"),
               "--params", str(tmp_path / "params.yaml"), "--index", str(tmp_path / "no_index_here")])
    out = capsys.readouterr().out
    assert rc == 0 and "<calc>expression</calc>" in out and "<calc>6 * 7</calc>" in out
    assert "outcome_reward=-1.0" in out  # the plugin's reward (paper would give -0.9 or an F1)
