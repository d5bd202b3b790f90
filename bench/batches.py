"""Synthetic trajectories shaped like the agent's, and what a forward plan computes on them."""

from __future__ import annotations

from typing import Any


def split_sizes(rng: Any, total: int, parts: int, minimum: int = 1) -> list[int]:
    """``total`` as ``parts`` random positive sizes, each >= ``minimum``."""
    free = total - parts * minimum
    cuts = sorted(rng.integers(0, free + 1, size=parts - 1).tolist()) if parts > 1 else []
    edges = [0, *cuts, free]
    return [minimum + edges[i + 1] - edges[i] for i in range(parts)]


def synthetic_sequence(rng: Any, length: int, action_frac: float, vocab: int) -> dict:
    """One trajectory's token-level fields: prompt (~30%), then 2-4 turns of action + observation,
    ending on an action (the answer). Process rewards on each search turn, the outcome on the last token."""
    turns = int(rng.integers(2, 5))
    n_act = max(2 * turns, round(action_frac * length))
    prompt = int(rng.integers(int(0.25 * length), int(0.35 * length) + 1))
    n_obs = max(turns - 1, length - prompt - n_act)
    acts, obs = split_sizes(rng, n_act, turns, 2), split_sizes(rng, n_obs, turns - 1) + [0]
    action, turn_index, rewards = [0] * prompt, [-1] * prompt, [0.0] * prompt
    for k in range(turns):
        action += [1] * acts[k] + [0] * obs[k]
        turn_index += [k] * (acts[k] + obs[k])
        rewards += [0.0] * (acts[k] - 1) + [0.02 if k < turns - 1 else float(rng.choice([1.0, 0.1, -0.9]))]
        rewards += [0.0] * obs[k]
    n = len(action)
    return {
        "input_ids": rng.integers(3, vocab, size=n).tolist(), "action_mask": action, "turn_index": turn_index,
        "token_rewards": rewards, "rollout_logprobs": [0.0] * n, "prompt_length": prompt, "info": {},
    }  # fmt: skip


def synthetic_batch(rows: int, min_len: int, max_len: int, action_frac: float, vocab: int, group_size: int, seed: int):
    """A right-padded :class:`TrajectoryBatch` of :func:`synthetic_sequence` rows of ``min_len``..``max_len``
    tokens, ``action_frac`` of them actions, in groups of ``group_size``."""
    import numpy as np

    from agent_r1.rollout.trajectory import TrajectoryBatch

    rng = np.random.default_rng(seed)
    seqs = []
    for i in range(rows):
        length = int(rng.integers(min_len, max_len + 1))
        seqs.append({**synthetic_sequence(rng, length, action_frac, vocab), "group_id": i // group_size})
    return TrajectoryBatch.from_sequences(seqs, pad_id=0)


def batch_stats(batch: Any) -> dict:
    lengths = batch.attention_mask.sum(-1)
    return {
        "rows": len(batch), "tokens": int(lengths.sum()), "action_tokens": int(batch.action_mask.sum()),
        "scored_tokens": int((lengths - 1).clamp(min=0).sum()), "padded_width": int(batch.input_ids.shape[1]),
        "sum_len_sq": int((lengths.long() ** 2).sum()),
    }  # fmt: skip


def plan_stats(lengths: list[int], groups: list[list[int]], packed: bool = False) -> dict:
    """What the forwards actually run on: each micro-batch padded to its longest row, or packed
    (its rows back to back, attention per row: no padding, each row's own length squared)."""
    if packed:
        computed, len_sq = sum(lengths), sum(n * n for n in lengths)
    else:
        widths = [max(lengths[i] for i in g) for g in groups]
        computed = sum(len(g) * w for g, w in zip(groups, widths))
        len_sq = sum(len(g) * w * w for g, w in zip(groups, widths))
    return {"micro_batches": len(groups), "computed_tokens": computed, "computed_len_sq": len_sq,
            "padding_share": computed / max(sum(lengths), 1) - 1}  # fmt: skip
