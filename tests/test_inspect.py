"""`agent-r1 chat`'s view of a trajectory: spans with their mask, turn and reward."""

from __future__ import annotations

from pathlib import Path

import torch

from agent_r1.rollout.inspect import render, spans
from agent_r1.rollout.trajectory import TrajectoryBatch


def test_spans_follow_masks_turns_and_rewards(policy_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(policy_dir)
    parts = [("Question: who?", 0, -1), ("<search>x</search>", 1, 0), ("<information>d</information>", 0, 0),
             ("<answer>y</answer>", 1, 1)]
    ids, action, turn = [], [], []
    for text, a, t in parts:
        piece = tok.encode(text, add_special_tokens=False)
        ids += piece
        action += [a] * len(piece)
        turn += [t] * len(piece)
    ids += [0, 0]  # padding
    action += [0, 0]
    turn += [-1, -1]
    n = len(ids)
    rewards = torch.zeros(1, n)
    last_action = max(i for i, a in enumerate(action) if a)
    rewards[0, last_action] = 1.0
    batch = TrajectoryBatch(
        input_ids=torch.tensor([ids]), attention_mask=torch.tensor([[1] * (n - 2) + [0, 0]]),
        action_mask=torch.tensor([action]), turn_index=torch.tensor([turn]), token_rewards=rewards,
        rollout_logprobs=torch.zeros(1, n), group_id=torch.tensor([0]), prompt_length=torch.tensor([4]),
        info=[{"termination": "answer", "answer": "y", "em": 1.0}],
    )
    got = spans(batch, 0, tok)
    assert [(s.kind, s.turn, s.text) for s in got] == [
        ("prompt", -1, "Question: who?"), ("action", 0, "<search>x</search>"),
        ("observation", 0, "<information>d</information>"), ("action", 1, "<answer>y</answer>"),
    ]
    assert [s.reward for s in got] == [0.0, 0.0, 0.0, 1.0]
    text = render(batch, 0, tok)
    assert "--- action (turn 1, action_mask=1" in text and "reward +1.000" in text
    assert text.splitlines()[-1].startswith("=== termination=answer, answer=y, em=1.0")
