"""Show a trajectory the way the trainer sees it: spans of tokens with their
mask, turn and reward, then (with a managed ``env.context``) the context the
policy was shown at each turn. ``agent-r1 chat`` prints this for one episode."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent_r1.rollout.trajectory import TrajectoryBatch


@dataclass
class Span:
    kind: str  # "prompt" | "action" | "observation"
    turn: int  # -1 for the prompt
    start: int  # token positions [start, end)
    end: int
    text: str
    reward: float  # sum of token_rewards inside the span

    @property
    def n_tokens(self) -> int:
        return self.end - self.start


def spans(batch: TrajectoryBatch, row: int, tokenizer: Any) -> list[Span]:
    """Split trajectory ``row`` into maximal runs of equal (action_mask, turn_index)."""
    n = int(batch.attention_mask[row].sum())
    ids = batch.input_ids[row, :n].tolist()
    action = batch.action_mask[row, :n].tolist()
    turn = batch.turn_index[row, :n].tolist()
    rewards = batch.token_rewards[row, :n].tolist()
    out: list[Span] = []
    start = 0
    for t in range(1, n + 1):
        if t == n or action[t] != action[start] or turn[t] != turn[start]:
            kind = "action" if action[start] else ("prompt" if turn[start] < 0 else "observation")
            text = tokenizer.decode(ids[start:t], skip_special_tokens=False)
            out.append(Span(kind, turn[start], start, t, text, float(sum(rewards[start:t]))))
            start = t
    return out


def render(batch: TrajectoryBatch, row: int, tokenizer: Any) -> str:
    """Plain-text rendering: one block per span, headed by kind, mask, turn, tokens and reward."""
    lines = []
    for s in spans(batch, row, tokenizer):
        mask = 1 if s.kind == "action" else 0
        head = f"--- {s.kind} (turn {s.turn}, action_mask={mask}, tokens {s.start}-{s.end - 1}"
        head += f", reward {s.reward:+.3f})" if s.reward else ")"
        lines += [head, s.text.rstrip("\n")]
    lines += _managed_contexts(batch, row, tokenizer)
    info = batch.info[row]
    lines.append(
        "=== " + ", ".join(f"{k}={info[k]}" for k in
                           ("termination", "answer", "em", "f1", "turns", "tool_calls", "invalid_calls",
                            "outcome_reward", "process_reward") if k in info)
    )
    return "\n".join(lines)


def _managed_contexts(batch: TrajectoryBatch, row: int, tokenizer: Any) -> list[str]:
    """With a managed context (``env.context``): what the policy was shown at each later turn, after its prompt."""
    contexts = batch.contexts[row] if batch.contexts else []
    p = int(batch.prompt_length[row])
    lines = []
    for k, ids in enumerate(contexts[1:], start=1):
        lines += [f"--- context shown at turn {k} ({len(ids)} tokens; the prompt, then:)",
                  tokenizer.decode(ids[p:], skip_special_tokens=False).rstrip("\n")]
    return lines
