"""The agent's environment: tools, action formats, rewards, ToolEnv (Agent-R1's Tool / ToolEnv split),
stateful environments (AgentEnv, one instance per episode) and make_env."""

from agent_r1.env.agent_env import AgentEnv, AgentEnvRunner, Transition
from agent_r1.env.env import TERMINATIONS, Episode, StepResult, ToolEnv, render_result
from agent_r1.env.formats import (
    MAX_CALLS_PER_TURN,
    ActionFormat,
    ParsedAction,
    TagFormat,
    ToolCall,
    ToolCallFormat,
    get_format,
)
from agent_r1.env.make import make_env
from agent_r1.env.rewards import (
    exact_match,
    f1_score,
    finalize_process_rewards,
    outcome_reward,
)
from agent_r1.env.tools import SearchTool, Tool, ToolExample

# What the rollout plays: the tool env of the QA task, or the runner of a stateful env (the same interface).
RolloutEnv = ToolEnv | AgentEnvRunner

__all__ = [
    "MAX_CALLS_PER_TURN",
    "TERMINATIONS",
    "ActionFormat",
    "AgentEnv",
    "AgentEnvRunner",
    "Episode",
    "ParsedAction",
    "RolloutEnv",
    "SearchTool",
    "StepResult",
    "TagFormat",
    "Tool",
    "ToolCall",
    "ToolCallFormat",
    "ToolEnv",
    "ToolExample",
    "Transition",
    "exact_match",
    "f1_score",
    "finalize_process_rewards",
    "get_format",
    "make_env",
    "outcome_reward",
    "render_result",
]
