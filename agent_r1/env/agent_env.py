"""Stateful environments: one :class:`AgentEnv` instance per episode (``env.name``).

The QA task's :class:`~agent_r1.env.env.ToolEnv` keeps an episode's state in its
messages; a game, a simulated shell or a web page keeps state of its own, and
says itself when the episode is won. Such an environment subclasses
:class:`AgentEnv`, as Agent-R1's v0.1.0 ``AgentEnv`` and TRL's
``environment_factory`` do: one instance per episode, ``reset`` from the
question record, ``step`` from the parsed action to a :class:`Transition`
(the next observation, the turn's reward, done, info), ``close`` at the end.
It declares the tools the agent may call (``tools``: their names, descriptions
and argument schemas build the action format's prompt, tags and stop strings;
the env answers the calls itself) and its own settings (``Options``, read from
``env.options``).

:class:`AgentEnvRunner` plays such envs for the rollout: it offers the scheduler
what :class:`~agent_r1.env.env.ToolEnv` does (``reset``, ``step_batch``,
``finish``, ``release``), so training, evaluation and the step-level
representation work unchanged. Rewards are the env's: each turn's
``Transition.reward`` lands on that turn's last action token (the return of a
won game is the sum of its turns' rewards); the episode's metrics are the last
``info`` (``success`` -> ``em``, ``score`` -> ``f1``, every other number kept).
"""

from __future__ import annotations

import logging
import random
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from agent_r1.env.env import StepResult
from agent_r1.env.episode import Episode
from agent_r1.env.formats import ActionFormat, ParsedAction, ToolCall, get_format
from agent_r1.env.tools import Tool

if TYPE_CHECKING:
    from agent_r1.config import EnvConfig

log = logging.getLogger(__name__)

TERMINATIONS: tuple[str, ...] = ("env_done", "max_turns", "max_length")


@dataclass
class Transition:
    """What one turn did: the next observation (a message of the format's observation role),
    the turn's reward, whether the episode is over, and what to report about it."""

    observation: str = ""
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)  # success (bool), score (0..1), anything numeric
    # an env with rewrites_context: the messages after the system prompt that the agent is shown
    # next (the task, a summary of the turns so far, ...), instead of the history plus observation
    context: list[dict[str, str]] | None = None


class AgentEnv(ABC):
    """One episode of a stateful environment. Subclasses set ``tools`` (instances, for their specs)
    and implement :meth:`reset` and :meth:`step`; ``Options`` for settings of their own."""

    tools: ClassVar[tuple[Tool, ...]] = ()
    Options: ClassVar[Any] = None
    # the system prompt's first line, before the tools (None: the format's, which asks to answer a question)
    instructions: ClassVar[str | None] = None
    # True: step may return Transition.context, the conversation shown next (summarised, rewritten);
    # each turn's shown context is recorded and trains with algorithm.representation: step
    rewrites_context: ClassVar[bool] = False
    options: Any = None  # env.options validated by Options (None for an env without Options)

    @abstractmethod
    def reset(self, record: dict) -> str:
        """Start the episode of ``record`` (a row of the prepared data); the task as the first user message."""

    @abstractmethod
    def step(self, action: ParsedAction) -> Transition:
        """Play one turn: ``action`` is the parsed assistant text (calls, an answer, an error, or nothing)."""

    def close(self) -> None:
        """Release what the episode holds (a game process, a file); called once, however it ended."""

    @classmethod
    def expert_plan(cls, record: dict, fmt: ActionFormat) -> list[str]:
        """The warm start's demonstration of ``record``: each turn's text as ``fmt`` writes it
        (a game's walkthrough). An env without one trains with ``sft.enabled: false``."""
        raise NotImplementedError(
            f"{cls.__qualname__} has no expert_plan, so there is no warm start to play: set sft.enabled: false"
        )

    def random_call(self, rng: random.Random) -> ToolCall | None:
        """A call drawn uniformly from the actions legal now (the random baseline); None: the env
        does not know its legal actions, and has no random baseline."""
        return None


class AgentEnvRunner:
    """Plays one :class:`AgentEnv` instance per episode behind the interface the rollout uses."""

    def __init__(self, env_class: type[AgentEnv], cfg: EnvConfig, options: Any = None):
        if not env_class.tools:
            raise ValueError(f"env.name: {env_class.__qualname__} declares no tools: the agent could not act")
        self.env_class, self.cfg, self.options = env_class, cfg, options
        self.tools: dict[str, Tool] = {t.name: t for t in env_class.tools}
        self.format: ActionFormat = get_format(cfg.format, list(env_class.tools))
        self.system_prompt = self.format.system_prompt(list(env_class.tools), False, env_class.instructions)
        self.rewrites_context = env_class.rewrites_context

    def reset(self, record: dict) -> Episode:
        env = self.env_class()
        env.options = self.options
        try:
            task = env.reset(record)
        except Exception:
            env.close()
            raise
        messages = [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": task}]
        episode = Episode(record=record, messages=messages)
        episode.tools = {"env": env}
        return episode

    def expert_plan(self, record: dict) -> list[str]:
        return self.env_class.expert_plan(record, self.format)

    def tool_specs(self) -> list[dict] | None:
        return [t.spec() for t in self.tools.values()] if self.format.uses_template_tools else None

    def step_batch(self, episodes: list[Episode], actions: list[str]) -> list[StepResult]:
        """One turn of each episode; the envs step in threads (a game waits on its own process)."""
        parsed = [self.format.parse(text) for text in actions]
        for ep, text in zip(episodes, actions):
            ep.messages.append({"role": "assistant", "content": text})
            ep.turn += 1
        with ThreadPoolExecutor(max_workers=min(8, len(episodes)) or 1) as pool:
            transitions = list(pool.map(lambda ep, p: ep.tools["env"].step(p), episodes, parsed))
        return [self._apply(ep, p, t) for ep, p, t in zip(episodes, parsed, transitions)]

    def _apply(self, ep: Episode, parsed: ParsedAction, t: Transition) -> StepResult:
        role = self.format.observation_role
        ep.tool_calls += len(parsed.calls) + (parsed.error is not None)
        ep.invalid_calls += (parsed.error is not None) + int(bool(t.info.get("invalid")))
        ep.turn_rewards.append(float(t.reward))
        ep.metrics = dict(t.info)
        if t.done or ep.turn >= self.cfg.max_turns:
            self.finish(ep, "env_done" if t.done else "max_turns")
            return StepResult(observation=None, observation_role=role, done=True)
        observation = self.format.format_observation([t.observation])
        ep.messages.append({"role": role, "content": observation})  # the history: the flat record keeps it all
        context = None
        if t.context is not None:
            if not self.rewrites_context:
                raise ValueError(f"{self.env_class.__qualname__} returned a context but does not set rewrites_context")
            context = [{"role": "system", "content": self.system_prompt}, *t.context]
        return StepResult(observation=observation, observation_role=role, done=False, short_observation=observation,
                          context=context)

    def finish(self, episode: Episode, reason: str) -> None:
        """End the episode: its rewards are the env's own turn rewards; close its env."""
        if reason not in TERMINATIONS:
            raise ValueError(f"unknown termination {reason!r}; expected one of {list(TERMINATIONS)}")
        info = episode.metrics
        episode.done, episode.termination = True, reason
        episode.final_turn_rewards = list(episode.turn_rewards)
        episode.outcome_reward = 0.0  # the env's rewards are per turn, the last one included
        success = float(bool(info.get("success", False)))
        numbers = {k: float(v) for k, v in info.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        episode.metrics = {
            **{f"env/{k}": v for k, v in numbers.items()},
            "em": success,
            "f1": float(info.get("score", success)),
            "answered": reason == "env_done",
            "format_valid": reason == "env_done",
            "answer": None,
            "tool_calls": episode.tool_calls,
            "invalid_calls": episode.invalid_calls,
            "turns": episode.turn,
            "termination": reason,
            "outcome_reward": 0.0,
            "process_reward": float(sum(episode.final_turn_rewards)),
        }
        self.release([episode])

    def release(self, episodes: list[Episode]) -> None:
        for episode in episodes:
            env = episode.tools.pop("env", None)
            if env is not None:
                try:
                    env.close()
                except Exception as exc:  # one env failing to clean up must not lose the rollout
                    log.warning("env of record %r failed to close: %s", episode.record.get("id"), exc)
