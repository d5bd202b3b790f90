"""The one place an environment is built from the params: training, warm start, evaluation, ``chat``, benches."""

from __future__ import annotations

from pathlib import Path

from agent_r1.config import Params
from agent_r1.env.agent_env import AgentEnvRunner
from agent_r1.env.env import ToolEnv
from agent_r1.env.tools import IndexSource, Tool
from agent_r1.registry import ENVS, TOOLS
from agent_r1.retrieval import load_index
from agent_r1.retrieval.base import SearchIndex


def make_env(
    params: Params, index_path: str | Path | None = None, *, index: SearchIndex | None = None
) -> ToolEnv | AgentEnvRunner:
    """The environment of ``params.env``: with ``env.name``, its stateful env (one instance per
    episode, ``env.options`` its settings); else the :class:`ToolEnv` of ``env.tools`` (each built
    by its ``Tool.from_params``, with its own ``env.tool_options``).

    ``index_path`` is where the retrieval index lives (folder or server URL);
    ``index`` an index the caller has already loaded. The index is loaded at most
    once, and only if a tool needs it (``Tool.needs_index``): a tool set without
    search needs neither.
    """
    if params.env.name is not None:
        return AgentEnvRunner(ENVS.load(params.env.name), params.env, ENVS.options(params.env.name, params.env.options))
    classes: list[type[Tool]] = [TOOLS.load(name) for name in params.env.tools]
    source: IndexSource = index if index is not None else index_path
    if source is not None and not isinstance(source, SearchIndex) and any(c.needs_index for c in classes):
        source = load_index(source)
    # unique tool names: checked by the params check (EnvConfig.tools) and again by ToolEnv
    return ToolEnv([_build(params, i, cls, source) for i, cls in enumerate(classes)], params.env)


def needs_index(params: Params) -> bool:
    """Whether the env of ``params`` searches an index: a stateful env brings its own world, and
    a tool set without search needs none."""
    return params.env.name is None and any(TOOLS.load(name).needs_index for name in params.env.tools)


def _build(params: Params, i: int, cls: type[Tool], source: IndexSource) -> Tool:
    """Tool ``i`` of ``env.tools``, given its options (``env.tool_options.<its name>`` validated by
    its ``Options``); a plugin whose ``from_params`` returns something else is named."""
    ref, name = params.env.tools[i], params.env.tool_names[i]
    tool = cls.from_params(params, source, TOOLS.options(ref, params.env.tool_options.get(name, {})))
    if not isinstance(tool, Tool):
        raise TypeError(f"env.tools.{i}: {cls.__qualname__}.from_params returned {type(tool).__name__}, not a Tool")
    return tool
