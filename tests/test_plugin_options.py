"""Each extension point's own settings, from params.yaml alone: ``env.tool_options``, ``env.reward.options``,
``algorithm.options`` (and ``data.options``, tests/test_data_sources.py), validated by the plugin's ``Options``
before any work; and the process reward a tool claims for its own results.

The tool is the example task's calculator (``examples/arithmetic.py``), the reward the shipped
``plugins/rewards.py``; estimator plugins are real modules written to a temporary folder on ``sys.path``
(as the project root is when a stage runs).
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from agent_r1.config import ParamsError, load_params, parse_params

ROOT = Path(__file__).resolve().parents[1]
CALCULATOR, EM_F1 = "examples.arithmetic:Calculator", "plugins.rewards:em_f1_reward"
RECORD = {"id": "q", "question": "Which city?", "answers": ["New York"], "supporting_titles": ["New York"]}


def _params_file(folder: Path, raw: dict[str, Any]) -> Path:
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _env_params(digits: int | None = None, call_reward: float | None = None, weight: float | None = None) -> dict:
    """params.yaml's env group: the calculator and the EM/F1 reward, with the options given (others: defaults)."""
    tool = {k: v for k, v in {"digits": digits, "call_reward": call_reward}.items() if v is not None}
    reward: dict[str, Any] = {"scheme": EM_F1} | ({"options": {"weight": weight}} if weight is not None else {})
    return {"env": {"tools": [CALCULATOR], "tool_options": {"calculate": tool} if tool else {}, "reward": reward}}


def _play(params_path: Path, turns: list[str]) -> Any:
    """One episode of RECORD in the env that params file configures (make_env: what every flow builds)."""
    from agent_r1.env import make_env

    env = make_env(load_params(params_path))
    ep = env.reset(RECORD)
    for turn in turns:
        env.step_batch([ep], [turn])
    return ep


# ------------------------------------------------------------- from params.yaml alone
@pytest.mark.parametrize("digits, shown", [(None, "0.666667"), (2, "0.67"), (0, "1")])
def test_a_tool_option_in_params_yaml_changes_what_the_tool_returns(tmp_path: Path, digits: int | None, shown: str) -> None:
    ep = _play(_params_file(tmp_path, _env_params(digits=digits)), ["<calculate>2 / 3</calculate>"])
    assert ep.messages[-1]["content"] == f"<information>{shown}</information>"


def test_a_tool_claims_its_own_process_reward_from_its_option(tmp_path: Path) -> None:
    """call_reward is the calculator's process reward per calculation: added to the turn's, capped with it."""
    paid = _play(_params_file(tmp_path, _env_params(call_reward=0.04)),
                 ["<calculate>2 * 3</calculate>", "<calculate>1 + 1</calculate>", "<answer>New York</answer>"])
    assert paid.turn_rewards == [0.04, 0.04, 0.0]
    assert paid.final_turn_rewards == pytest.approx([0.04, 0.04, 0.0])
    capped = _play(_params_file(tmp_path, _env_params(call_reward=0.08)),
                   ["<calculate>2 * 3</calculate>", "<calculate>1 + 1</calculate>", "<answer>New York</answer>"])
    assert capped.final_turn_rewards == pytest.approx([0.05, 0.05, 0.0])  # env.reward.process.cap 0.1, scaled
    free = _play(_params_file(tmp_path, _env_params()), ["<calculate>2 * 3</calculate>", "<answer>New York</answer>"])
    assert free.turn_rewards == [0.0, 0.0]  # default call_reward 0: the tool claims nothing


@pytest.mark.parametrize("weight, expected", [(None, 0.4), (1.0, 0.0), (0.0, 0.8)])
def test_a_reward_option_in_params_yaml_changes_the_outcome_reward(tmp_path: Path, weight: float | None, expected: float) -> None:
    """weight * EM + (1 - weight) * F1: 'New York City' against 'New York' has EM 0 and F1 0.8."""
    ep = _play(_params_file(tmp_path, _env_params(weight=weight)), ["<answer>New York City</answer>"])
    assert ep.outcome_reward == pytest.approx(expected)


def test_the_search_tool_prices_its_supporting_documents_itself() -> None:
    """new_support_doc per supporting title first surfaced in the episode; the episode's state notes them."""
    from agent_r1.config import EnvConfig, ProcessRewardConfig
    from agent_r1.env import SearchTool, ToolEnv
    from agent_r1.retrieval.base import Hit

    class NoIndex:
        def search(self, queries: list[str], k: int) -> list[list[Hit]]:
            raise AssertionError("not searched here")

    tool, cfg = SearchTool(NoIndex(), 2), ProcessRewardConfig(new_support_doc=0.25)  # type: ignore[arg-type]
    ep = ToolEnv([tool], EnvConfig()).reset({**RECORD, "supporting_titles": ["A", "B"]})
    hits = [[Hit("a1", "A", "text", 1.0), Hit("x", "X", "text", 0.5)], [Hit("a2", "A", "more", 1.0)]]
    assert tool.process_reward(hits, ep, cfg) == 0.25  # A once, though two calls surfaced it
    assert tool.process_reward([[Hit("b", "B", "text", 1.0), Hit("a1", "A", "text", 1.0)]], ep, cfg) == 0.25
    assert ep.support_titles_found == {"A", "B"} and ep.seen_doc_ids == {"a1", "x", "a2", "b"}


def test_hits_from_another_tool_earn_no_support_reward_unless_it_claims_one(tmp_path: Path) -> None:
    """The env knows no tool's results: a plugin returning Hit lists is rendered as documents, and rewarded
    only by its own process_reward."""
    from agent_r1.config import EnvConfig
    from agent_r1.env import Tool, ToolEnv
    from agent_r1.retrieval.base import Hit

    class Lookup(Tool):
        name = "lookup"
        description = "Look a title up."
        parameters = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}

        def execute(self, args: dict) -> list[Hit]:
            return [Hit(f"doc:{args['title']}", args["title"], "text", 1.0)]

    env = ToolEnv([Lookup()], EnvConfig())
    [result] = env.step_batch([ep := env.reset(RECORD)], ["<lookup>New York</lookup>"])
    assert "Doc 1 (New York)" in (result.observation or "")
    assert ep.turn_rewards == [0.0] and ep.support_titles_found == set()


# --------------------------------------------------------- bad options, named first
@pytest.mark.parametrize(
    "env, message",
    [
        (_env_params(digits=-1)["env"], "env.tool_options.calculate.digits: must be >= 0, got -1"),
        ({**_env_params()["env"], "tool_options": {"calculate": {"digits": "two"}}},
         "env.tool_options.calculate.digits: Input should be a valid integer"),
        ({**_env_params()["env"], "tool_options": {"calculate": {"decimals": 2}}},
         "env.tool_options.calculate.decimals: unknown key"),
        ({**_env_params()["env"], "tool_options": {"calculator": {"digits": 2}}},
         "env.tool_options.calculator: no tool of env.tools is called 'calculator'; they are ['calculate']"),
        ({"tool_options": {"search": {"top_k": 2}}}, "env.tool_options.search: tool 'search' takes no options"),
        (_env_params(weight=1.5)["env"], "env.reward.options.weight: must be <= 1.0, got 1.5"),
        ({"reward": {"scheme": "paper", "options": {"weight": 0.5}}},
         "env.reward.options: reward scheme 'paper' takes no options"),
    ],
)
def test_a_bad_option_fails_the_params_check_naming_its_key(env: dict, message: str) -> None:
    with pytest.raises(ParamsError) as err:
        parse_params({"env": env})
    assert message in str(err.value)
    with pytest.raises(ValueError, match=f"experiments.x.overrides.{message.split(':')[0]}"):
        parse_params({"experiments": {"x": {"overrides": {"env": env}}}})


def test_params_check_names_a_bad_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from agent_r1.cli import main

    path = _params_file(tmp_path, _env_params(digits=99))
    assert main(["params", "check", str(path)]) == 2
    assert "env.tool_options.calculate.digits: must be <= 12, got 99" in capsys.readouterr().err
    # The tool lives in examples/ and the reward in plugins/: plugins.code is the folder holding both.
    good = {**_env_params(digits=2, weight=0.25), "plugins": {"code": "."}}
    assert main(["params", "check", str(_params_file(tmp_path, good))]) == 0


def test_a_stage_refuses_a_bad_option_before_any_work(tmp_path: Path) -> None:
    """The train stage exits 2 naming the key, before a model or the data is read (neither exists here)."""
    for folder in ("examples", "plugins"):  # the tool's and the reward's
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    _params_file(tmp_path, {**_env_params(), "algorithm": {"options": {"clip": 0.1}}})
    env = {"PYTHONPATH": str(ROOT), "PATH": os.environ["PATH"], "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "agent_r1.stages.train", "--experiment", "grpo"],
                          cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "algorithm.options: advantage estimator 'grpo' takes no options" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["examples", "params.yaml", "plugins"]  # nothing written


# ------------------------------------------------------------------ estimator options
ESTIMATOR = '''
import torch
from pydantic import Field

from agent_r1.config import PluginOptions


class ScaleOptions(PluginOptions):
    scale: float = Field(1.0, gt=0.0)


def scaled(token_rewards, action_mask, options):
    """Each action token's reward times ``scale``: enough to see the option arrive."""
    adv = token_rewards.float() * options.scale * (action_mask > 0)
    return adv, adv


scaled.Options = ScaleOptions


def no_options_argument(token_rewards, action_mask):
    return token_rewards, token_rewards


no_options_argument.Options = ScaleOptions


def requires_options(token_rewards, action_mask, options):
    return token_rewards, token_rewards


def reward_without_options_argument(answer, golds, format_valid, cfg):
    return 0.0


reward_without_options_argument.Options = ScaleOptions
'''

_names = itertools.count()


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh plugin module's name (a new name each test: the registries cache what they import)."""
    name = f"estimator_plugin_{next(_names)}_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(ESTIMATOR)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_estimator_options_reach_a_plugin_estimator_flat_and_per_step(plugin: str) -> None:
    from agent_r1.algorithms import compute_advantages
    from agent_r1.algorithms.step_advantages import compute_step_advantages

    params = parse_params({"algorithm": {"name": f"{plugin}:scaled", "options": {"scale": 3.0}}})
    r = torch.tensor([[0.0, 1.0, 0.0, 2.0]])
    m = torch.tensor([[0, 1, 0, 1]])
    flat, _ = compute_advantages(params.algorithm.name, token_rewards=r, action_mask=m, group_id=None,
                                 options=params.algorithm.options)
    assert flat.tolist() == [[0.0, 3.0, 0.0, 6.0]]
    step, _ = compute_step_advantages(params.algorithm.name, step_rewards=torch.tensor([[1.0, 2.0]]),
                                      step_mask=torch.tensor([[1, 1]]), group_id=None, options={"scale": 0.5})
    assert step.tolist() == [[0.5, 1.0]]
    default, _ = compute_advantages(params.algorithm.name, token_rewards=r, action_mask=m, group_id=None)
    assert default.tolist() == [[0.0, 1.0, 0.0, 2.0]]  # its Options' default scale
    with pytest.raises(ValueError, match="advantage estimator 'grpo' takes no options"):
        compute_advantages("grpo", token_rewards=r, action_mask=m, group_id=torch.tensor([0]), options={"scale": 2})


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"name": "{p}:scaled", "options": {"scale": 0}}, "algorithm.options.scale: must be > 0.0, got 0"),
        ({"name": "{p}:scaled", "options": {"scale": float("inf")}}, "algorithm.options.scale: Input should be a finite number"),
        ({"name": "{p}:scaled", "options": {"scael": 2}}, "algorithm.options.scael: unknown key"),
        ({"name": "grpo", "options": {"scale": 2}}, "algorithm.options: advantage estimator 'grpo' takes no options"),
        ({"name": "{p}:no_options_argument"}, "algorithm.name: plugin '{p}:no_options_argument' is no advantage "
                                              "estimator: declares Options but takes no argument options"),
        ({"name": "{p}:requires_options"}, "algorithm.name: plugin '{p}:requires_options' is no advantage estimator: "
                                           "requires options but declares no Options"),
    ],
)
def test_a_bad_estimator_option_or_options_interface_is_named(plugin: str, raw: dict, message: str) -> None:
    raw = {k: (v.format(p=plugin) if isinstance(v, str) else v) for k, v in raw.items()}
    with pytest.raises(ParamsError) as err:
        parse_params({"algorithm": raw})
    assert message.format(p=plugin) in str(err.value)


def test_options_must_forbid_unknown_keys_and_a_scheme_must_take_them(plugin: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    from pydantic import BaseModel

    module = importlib.import_module(plugin)

    class Loose(BaseModel):
        scale: float = 1.0

    monkeypatch.setattr(module.scaled, "Options", Loose)
    with pytest.raises(ParamsError, match="its Options must be a pydantic model that forbids unknown keys"):
        parse_params({"algorithm": {"name": f"{plugin}:scaled"}})
    with pytest.raises(ParamsError, match="is no reward scheme: declares Options but takes no argument options"):
        parse_params({"env": {"reward": {"scheme": f"{plugin}:reward_without_options_argument"}}})
