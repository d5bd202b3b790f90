"""One episode's state: what :class:`~agent_r1.env.env.ToolEnv` keeps per trajectory, and what a tool's
:meth:`~agent_r1.env.tools.Tool.process_reward` reads (the question record) and may note (what it found).

Its own module so that the tools and the env both read it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Episode:
    """One trajectory's environment state."""

    record: dict  # normalised question record (id, question, answers, supporting_titles, ...)
    messages: list[dict]  # chat history: system, user, then assistant / observation messages
    turn: int = 0  # assistant turns taken
    done: bool = False
    answer: str | None = None
    tool_calls: int = 0
    invalid_calls: int = 0
    seen_doc_ids: set[str] = field(default_factory=set)  # docs a tool surfaced (the search tool notes them)
    support_titles_found: set[str] = field(default_factory=set)  # of the record's supporting_titles
    turn_rewards: list[float] = field(default_factory=list)  # raw process reward per assistant turn
    termination: str | None = None  # one of agent_r1.env.env.TERMINATIONS
    outcome_reward: float | None = None
    final_turn_rewards: list[float] | None = None  # after finalize_process_rewards
    metrics: dict = field(default_factory=dict)
    tools: dict = field(default_factory=dict)  # name -> this episode's instance of each per-episode tool


def record_list(record: dict, key: str) -> list[str]:
    """A list column of a question record as ``list[str]`` (parquet rows give numpy arrays)."""
    value = record.get(key)
    return [] if value is None else [str(v) for v in value]
