"""ToolEnv: the RL environment around the tools (Agent-R1's ToolEnv).

It parses each policy turn (through the configured :mod:`format
<agent_r1.env.formats>`), dispatches the tool calls of a whole rollout step
together (one ``batch_execute`` per tool, e.g. one index search for all
episodes), turns raw results into observations, decides termination and
computes the process and outcome rewards (:mod:`agent_r1.env.rewards`).

Per turn, for each episode:

* malformed turn (``ParsedAction.error``): error observation, one invalid call;
* answer: the episode ends (``"answer"``);
* tool calls: each is validated (unknown tool, bad arguments -> invalid), the
  valid ones run; a tool that raises or outlives ``tool_timeout_s`` gives an
  error result (invalid) instead of an exception or a hang; the observation
  holds one rendered result per call, in order. The exception is a tool whose
  backend failed (:class:`~agent_r1.errors.ToolInfrastructureError`, or an
  overrun of the tool's own ``backend_deadline_s``): that is not the agent's
  fault, so ``step_batch`` raises it and the run stops; the episodes of that
  step are left mid-turn;
* no action (plain text): the episode ends (``"no_action"``): the policy gave
  up, and another turn would just repeat it.

Any tool set works, with or without search (``env.tools``; built by
:func:`~agent_r1.env.make.make_env`). A result is rendered by type (a list of
:class:`~agent_r1.retrieval.base.Hit` as numbered documents, a string as is,
anything else as JSON). A turn's process reward is ``valid_call`` and
``invalid_call`` per call plus what each tool's
:meth:`~agent_r1.env.tools.Tool.process_reward` says its results of the turn
earn (the search tool: ``new_support_doc`` per supporting document found for
the first time); the env knows no tool's results. With
``one_shot`` and no tool that has an example (``Tool.example``), the episode
has no example turns and the system prompt does not mention one (a warning
says so): the documented fallback rather than an error, since ``one_shot`` is
on by default.

The turn that reaches ``max_turns`` ends the episode (``"max_turns"``); its
calls are validated and scored but not run, since no one could read the
result. ``tool_calls`` counts every attempted call, a malformed turn as one;
``invalid_calls`` the subset that failed.

A tool with state per episode (``Tool.per_episode``) is opened for each episode
by ``reset`` and closed by ``finish`` (or ``release``, when a rollout stops
early); each episode's calls run on its own instance, in their order.

Tools run in daemon threads, one per tool per step, so a hung tool costs at
most ``tool_timeout_s`` and cannot block interpreter exit; its late result is
dropped. If a batch raises, its calls are retried one by one, so one poisoned
call fails alone instead of failing every episode of the step.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent_r1.config import EnvConfig
from agent_r1.env.formats import ActionFormat, ParsedAction, ToolCall, get_format
from agent_r1.env.rewards import (
    exact_match,
    f1_score,
    finalize_process_rewards,
    outcome_reward,
    turn_process_reward,
)
from agent_r1.env.episode import Episode, record_list
from agent_r1.env.tools import Tool
from agent_r1.errors import ToolInfrastructureError
from agent_r1.retrieval.base import Hit

log = logging.getLogger(__name__)

TERMINATIONS: tuple[str, ...] = ("answer", "max_turns", "max_length", "no_action")
_ERROR_CHARS = 200  # longest exception text shown to the model


@dataclass
class StepResult:
    observation: str | None  # content of the observation message (None when the episode ended)
    observation_role: str  # chat role of that message
    done: bool
    short_observation: str | None = None  # the same results shortened (env.context shows it for older turns)
    context: list[dict] | None = None  # a stateful env's rewritten conversation, shown next instead of the history


@dataclass
class _Outcome:
    """What running (or checking) one call gave: a raw result, or an error for the model."""

    ok: bool
    value: Any = None  # the raw result when ok and run
    error: str | None = None
    ran: bool = False
    fatal: ToolInfrastructureError | None = None  # the backend failed: re-raised, never scored
    timed_out: bool = False


# ------------------------------------------------------------ rendering
def truncate(text: str, n_chars: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n_chars else text[:n_chars].rstrip() + "..."


def render_hits(hits: list[Hit], doc_chars: int) -> str:
    if not hits:
        return "No results."
    return "\n".join(f"Doc {i} ({h.title}): {truncate(h.text, doc_chars)}" for i, h in enumerate(hits, 1))


def render_result(result: Any, doc_chars: int) -> str:
    """A tool's raw result as observation text: hits as numbered docs, strings as-is, the rest as JSON."""
    if isinstance(result, list) and all(isinstance(h, Hit) for h in result):
        return render_hits(result, doc_chars)
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(result)


def render_short(result: Any, n_chars: int) -> str:
    """A result as an older turn shows it under ``env.context``: hits by title only, the rest cut to ``n_chars``."""
    if isinstance(result, list) and result and all(isinstance(h, Hit) for h in result):
        return "\n".join(f"Doc {i} ({h.title})" for i, h in enumerate(result, 1))
    return truncate(render_result(result, n_chars), n_chars)


# ------------------------------------------------------------- running
def run_with_timeout(fns: list[Callable[[], Any]], timeouts: list[float]) -> list[_Outcome]:
    """Run each function in its own daemon thread; whatever has not returned by its deadline times out."""
    boxes: list[dict[str, Any]] = [{} for _ in fns]

    def target(fn: Callable[[], Any], box: dict[str, Any]) -> None:
        try:
            box["value"] = fn()
        except ToolInfrastructureError as exc:
            box["fatal"] = exc
        except Exception as exc:
            box["error"] = f"{type(exc).__name__}: {exc}"[:_ERROR_CHARS]

    threads = [threading.Thread(target=target, args=(fn, box), daemon=True) for fn, box in zip(fns, boxes)]
    for t in threads:
        t.start()
    start = time.monotonic()
    outcomes = []
    for t, box, timeout_s in zip(threads, boxes, timeouts):
        t.join(max(0.0, start + timeout_s - time.monotonic()))
        if t.is_alive():
            outcomes.append(_Outcome(ok=False, error=f"timed out after {timeout_s:g} s", timed_out=True))
        elif "fatal" in box:
            outcomes.append(_Outcome(ok=False, fatal=box["fatal"]))
        elif "error" in box:
            outcomes.append(_Outcome(ok=False, error=f"failed: {box['error']}"))
        else:
            outcomes.append(_Outcome(ok=True, value=box.get("value"), ran=True))
    return outcomes


class ToolEnv:
    """The environment: ``reset`` a question, ``step_batch`` the policy's turns, ``finish`` an episode."""

    rewrites_context = False  # the history is shown as it grew (or shortened by env.context)

    def __init__(self, tools: list[Tool], cfg: EnvConfig):
        names = [t.name for t in tools]
        if not tools:
            raise ValueError("ToolEnv needs at least one tool")
        if len(set(names)) != len(names):
            raise ValueError(f"tool names must be unique, got {names}")
        self.tools: dict[str, Tool] = {t.name: t for t in tools}
        self.cfg = cfg
        self.format: ActionFormat = get_format(cfg.format, tools)
        self.example_messages: list[dict] = self.format.example_messages(tools) if cfg.one_shot else []
        if cfg.one_shot and not self.example_messages:
            # Documented fallback rather than an error: one_shot is on by default, and a tool set
            # without an example still works (a larger model, or RL from scratch, needs none).
            log.warning("env.one_shot: none of the tools %s has an example (Tool.example); running without one", names)
        self.system_prompt: str = self.format.system_prompt(tools, bool(self.example_messages))

    # ---------------------------------------------------------- episode
    def reset(self, record: dict) -> Episode:
        """A fresh episode: system prompt, the one-shot example turns (if ``one_shot``), the question."""
        question = record.get("question")
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"record {record.get('id')!r} has no question text (got {question!r})")
        if not record_list(record, "answers"):
            raise ValueError(f"record {record.get('id')!r} has no answers")
        messages = [
            {"role": "system", "content": self.system_prompt},
            *(dict(m) for m in self.example_messages),
            {"role": "user", "content": self.format.user_prompt(question)},
        ]
        episode = Episode(record=record, messages=messages)
        episode.tools = {name: tool.open(episode) for name, tool in self.tools.items() if tool.per_episode}
        return episode

    def tool_specs(self) -> list[dict] | None:
        """Function specs for ``apply_chat_template(tools=...)`` in the tool_call format, else None."""
        if not self.format.uses_template_tools:
            return None
        return [t.spec() for t in self.tools.values()]

    def step_batch(self, episodes: list[Episode], actions: list[str]) -> list[StepResult]:
        """Apply one turn's text to each episode; all tool calls of the batch run together."""
        if len(episodes) != len(actions):
            raise ValueError(f"step_batch got {len(episodes)} episodes but {len(actions)} actions")
        for ep in episodes:
            if ep.done:
                raise ValueError(
                    f"episode of record {ep.record.get('id')!r} already ended ({ep.termination}); "
                    "only active episodes may be stepped"
                )
        parsed = [self.format.parse(text) for text in actions]
        for ep, text in zip(episodes, actions):
            ep.messages.append({"role": "assistant", "content": text})
            ep.turn += 1
        outcomes = self._dispatch(episodes, parsed)
        return [self._transition(ep, p, o) for ep, p, o in zip(episodes, parsed, outcomes)]

    def finish(self, episode: Episode, reason: str) -> None:
        """End the episode: termination, outcome reward, finalised process rewards, metrics."""
        if reason not in TERMINATIONS:
            raise ValueError(f"unknown termination {reason!r}; expected one of {list(TERMINATIONS)}")
        if episode.termination is not None:
            raise ValueError(
                f"episode of record {episode.record.get('id')!r} already finished ({episode.termination})"
            )
        episode.done = True
        episode.termination = reason
        answered = reason == "answer" and episode.answer is not None
        golds = record_list(episode.record, "answers")
        try:  # a scheme that reads the episode sees its per-episode tools still open (an interpreter's state)
            episode.outcome_reward = outcome_reward(episode.answer, golds, answered, self.cfg.reward, episode)
        finally:
            self._close_tools(episode)
        episode.final_turn_rewards = finalize_process_rewards(episode.turn_rewards, answered, self.cfg.reward.process)
        answer = episode.answer or ""
        episode.metrics = {
            "em": exact_match(answer, golds) if answered else 0.0,
            "f1": f1_score(answer, golds) if answered else 0.0,
            "answered": answered,
            "format_valid": answered,
            "answer": episode.answer,
            "tool_calls": episode.tool_calls,
            "invalid_calls": episode.invalid_calls,
            "turns": episode.turn,
            "support_docs_found": len(episode.support_titles_found),
            "support_docs_total": len(set(record_list(episode.record, "supporting_titles"))),
            "termination": reason,
            "outcome_reward": episode.outcome_reward,
            "process_reward": float(sum(episode.final_turn_rewards)),
        }

    def release(self, episodes: list[Episode]) -> None:
        """Close the per-episode tools of episodes left unfinished (a rollout that stopped early)."""
        for episode in episodes:
            self._close_tools(episode)

    # --------------------------------------------------------- internals
    def _close_tools(self, episode: Episode) -> None:
        tools, episode.tools = episode.tools, {}
        for name, tool in tools.items():
            try:
                tool.close()
            except Exception as exc:  # one tool failing to clean up must not lose the episode
                log.warning("tool %r of record %r failed to close: %s", name, episode.record.get("id"), exc)

    def _check_call(self, call: ToolCall) -> str | None:
        tool = self.tools.get(call.name)
        if tool is None:
            return f"unknown tool {call.name!r}; available: {sorted(self.tools)}"
        try:
            return tool.validate(call.arguments)
        except Exception as exc:  # a custom tool's validate must not kill the rollout either
            return f"could not validate the call of {call.name!r} ({type(exc).__name__}: {exc})"[:_ERROR_CHARS]

    def _dispatch(self, episodes: list[Episode], parsed: list[ParsedAction]) -> list[list[_Outcome]]:
        """Validate every call, run the valid ones batched per tool (a per-episode tool: per episode, on
        the episode's own instance), and return one outcome per call."""
        outcomes: list[list[_Outcome]] = [[] for _ in parsed]
        pending: dict[tuple[str, int], list[tuple[int, int, dict]]] = {}  # (tool, episode or -1) -> calls
        for i, (ep, p) in enumerate(zip(episodes, parsed)):
            if p.error is not None:
                continue
            last_turn = ep.turn >= self.cfg.max_turns
            for k, call in enumerate(p.calls):
                problem = self._check_call(call)
                outcomes[i].append(_Outcome(ok=problem is None, error=problem))
                if problem is None and not last_turn:
                    owner = i if self.tools[call.name].per_episode else -1
                    pending.setdefault((call.name, owner), []).append((i, k, call.arguments))
        keys = list(pending)
        tools = [episodes[owner].tools[name] if owner >= 0 else self.tools[name] for name, owner in keys]
        batch = run_with_timeout(
            [_bound(tool.batch_execute, [a for _, _, a in pending[key]]) for tool, key in zip(tools, keys)],
            [self._timeout(name) for name, _ in keys],
        )
        for key, tool, result in zip(keys, tools, batch):
            self._raise_infrastructure(tool.name, [result])
            for (i, k, _), outcome in zip(pending[key], self._per_call(tool, pending[key], result)):
                if not outcome.ok:
                    outcome.error = f"tool {tool.name!r} {outcome.error}"
                outcomes[i][k] = outcome
        return outcomes

    def _per_call(self, tool: Tool, calls: list[tuple[int, int, dict]], result: _Outcome) -> list[_Outcome]:
        """Split one tool's batch result into per-call outcomes (retrying singly if the batch raised)."""
        name, n = tool.name, len(calls)
        if result.ok:
            values = result.value
            if isinstance(values, list) and len(values) == n:
                return [_Outcome(ok=True, value=v, ran=True) for v in values]
            got = len(values) if isinstance(values, list) else type(values).__name__
            result = _Outcome(ok=False, error=f"failed: batch_execute returned {got} results for {n} calls")
        elif n > 1 and not result.error.startswith("timed out"):
            log.warning("tool %r batch of %d calls %s; retrying one by one", name, n, result.error)
            single = run_with_timeout([_bound(tool.execute, a) for _, _, a in calls], [self._timeout(name)] * n)
            self._raise_infrastructure(name, single)
            return single
        log.warning("tool %r %s (%d calls)", name, result.error, n)
        return [_Outcome(ok=False, error=result.error) for _ in calls]

    def _timeout(self, name: str) -> float:
        """How long the env waits for a tool: ``tool_timeout_s``, plus the time its backend may spend retrying."""
        return self.cfg.tool_timeout_s + (self.tools[name].backend_deadline_s or 0.0)

    def _raise_infrastructure(self, name: str, outcomes: list[_Outcome]) -> None:
        """Stop the run on a failure of the tool's backend: scoring it would blame the agent."""
        deadline = self.tools[name].backend_deadline_s
        for outcome in outcomes:
            if outcome.fatal is not None:
                raise outcome.fatal
            if outcome.timed_out and deadline is not None:
                raise ToolInfrastructureError(
                    f"tool {name!r} did not return within {self._timeout(name):g} s, although its backend "
                    f"gives up by itself after {deadline:g} s"
                )

    def _transition(self, ep: Episode, parsed: ParsedAction, outcomes: list[_Outcome]) -> StepResult:
        """Book-keeping, process reward, observation and termination of one episode's turn."""
        role = self.format.observation_role
        observation: str | None = None
        short: str | None = None
        reason: str | None = None
        valid = invalid = 0
        tool_reward = 0.0
        if parsed.error is not None:
            invalid = 1
            observation = self.format.format_error(parsed.error)
            short = self.format.format_error(truncate(parsed.error, self.cfg.context.short_chars))
        elif parsed.answer is not None:
            ep.answer = parsed.answer
            reason = "answer"
        elif parsed.calls:
            observation, short, valid, invalid, tool_reward = self._observe_calls(ep, parsed.calls, outcomes)
        else:
            reason = "no_action"
        ep.tool_calls += valid + invalid
        ep.invalid_calls += invalid
        ep.turn_rewards.append(turn_process_reward(valid, tool_reward, invalid, self.cfg.reward.process))
        if reason is None and ep.turn >= self.cfg.max_turns:
            reason = "max_turns"
        if reason is not None:
            self.finish(ep, reason)
            return StepResult(observation=None, observation_role=role, done=True)
        ep.messages.append({"role": role, "content": observation})
        return StepResult(observation=observation, observation_role=role, done=False, short_observation=short)

    def _observe_calls(
        self, ep: Episode, calls: list[ToolCall], outcomes: list[_Outcome]
    ) -> tuple[str, str, int, int, float]:
        """A turn of tool calls: ``(observation, short observation, valid calls, invalid calls, tool reward)``.

        One rendered result (or error) per call, in order; the tool reward is the sum, over the
        tools that ran, of each one's :meth:`~agent_r1.env.tools.Tool.process_reward` for its
        results of the turn (in the order the tools were first called).
        """
        n_short = self.cfg.context.short_chars
        texts, shorts = [], []
        valid = invalid = 0
        ran: dict[str, list[Any]] = {}
        for call, outcome in zip(calls, outcomes):
            if not outcome.ok:
                invalid += 1
                texts.append(f"Error: {outcome.error}")
                shorts.append(truncate(texts[-1], n_short))
                continue
            valid += 1
            if outcome.ran:
                ran.setdefault(call.name, []).append(outcome.value)
                texts.append(render_result(outcome.value, self.cfg.doc_chars))
                shorts.append(render_short(outcome.value, n_short))
        tool_reward = 0.0
        for name, results in ran.items():
            tool = ep.tools.get(name, self.tools[name])
            tool_reward += tool.process_reward(results, ep, self.cfg.reward.process)
        observation, short = self.format.format_observation(texts), self.format.format_observation(shorts)
        return observation, short, valid, invalid, tool_reward


def _bound(fn: Callable[[Any], Any], arg: Any) -> Callable[[], Any]:
    return lambda: fn(arg)
