"""How the update cuts samples into passes: mini-batches (one optimizer step each) of
token-budget micro-batches (one forward/backward each).

The token budget, not the number of rows, bounds a forward's activation
memory, so the RL batch size never sets the peak memory. With several ranks
every rank must run as many forward/backward passes per optimizer step (ZeRO's
reductions and ZeRO-3's weight gathers are collectives):
:func:`equalize_micro_batches` pads a rank's list with empty placeholder groups.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import torch

from agent_r1.training.packing import distinct_tokens, shared_micro_batches


def micro_batches(lengths: list[int], token_budget: int, packed: bool = False) -> list[list[int]]:
    """Group row indices so that each group's computed tokens fit ``token_budget``.

    Padded (``packed=False``): ``max length in group × group size <= budget``;
    rows are sorted by length (longest first, ties by index) so that rows of
    similar length share a micro-batch and little padding is computed.
    Packed: ``sum of lengths <= budget``, first-fit over the same order.
    A row longer than the budget gets a micro-batch of its own. Deterministic.
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    if packed:
        room: list[int] = []
        for i in order:
            fit = next((g for g, r in enumerate(room) if lengths[i] <= r), None)
            if fit is None:
                groups.append([i])
                room.append(token_budget - lengths[i])
            else:
                groups[fit].append(i)
                room[fit] -= lengths[i]
        return groups
    for i in order:
        # rows arrive longest first, so a group's max length is its first row's
        if groups and lengths[groups[-1][0]] * (len(groups[-1]) + 1) <= token_budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def computed_positions(lengths: list[int], groups: list[list[int]], packed: bool = False) -> int:
    """Positions the forwards compute over ``groups``: padded to each group's longest row, or packed (no padding)."""
    if packed:
        return sum(lengths[i] for g in groups for i in g)
    return sum(len(g) * max(lengths[i] for i in g) for g in groups if g)


def padding_share(lengths: list[int], groups: list[list[int]], packed: bool) -> float:
    """Padded positions computed / real tokens, over the real (non-placeholder) micro-batches."""
    groups = [g for g in groups if g]
    real = sum(lengths[i] for g in groups for i in g)
    return (computed_positions(lengths, groups, packed) - real) / max(real, 1)


def shared_token_share(lengths: list[int], groups: list[list[int]], tokens: list[list[int]] | None) -> float:
    """The share of the real tokens of ``groups`` that prefix sharing did not compute (0 without ``tokens``)."""
    groups = [g for g in groups if g]
    real = sum(lengths[i] for g in groups for i in g)
    if tokens is None or not real:
        return 0.0
    return 1 - distinct_tokens(tokens, groups) / real


def max_over_ranks(n: int) -> int:
    """The largest ``n`` over all ranks (``n`` itself without a process group)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return n
    if torch.distributed.get_world_size() == 1:
        return n
    on_gpu = torch.distributed.get_backend() == "nccl"  # nccl reduces only device tensors
    t = torch.tensor([n], dtype=torch.long, device=torch.cuda.current_device() if on_gpu else "cpu")
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return int(t.item())


def equalize_micro_batches(groups: list[list[int]]) -> list[list[int]]:
    """Pad this rank's micro-batch list with empty groups to the largest count over ranks.

    Why: with several ranks, ZeRO-2 reduces gradients in every ``backward`` and
    ZeRO-3 gathers weights in every forward; these are collectives, so every
    rank must run the same number of forward/backward passes per optimizer
    step, or the job deadlocks. Run an empty group as a placeholder: any real
    row (e.g. ``select_rows(batch, rows or [0])``) with its loss multiplied by
    0, which adds exactly nothing to the gradient. Collective: all ranks call it.
    """
    return groups + [[] for _ in range(max_over_ranks(len(groups)) - len(groups))]


def select_rows(tensors: dict[str, torch.Tensor], rows: list[int], mask_key: str = "attention_mask") -> dict[str, torch.Tensor]:
    """Rows ``rows`` of every ``[B, ...]`` tensor; those shaped ``[B, T, ...]`` (T = the
    mask's width) are cut to the longest selected row, to skip computing on padding.

    Assumes right padding (``tensors[mask_key]`` is 1 then 0 in each row).
    """
    index = torch.as_tensor(rows, dtype=torch.long, device=tensors[mask_key].device)
    width = int(tensors[mask_key].index_select(0, index).sum(-1).max())
    full_width = tensors[mask_key].shape[1]
    out = {}
    for key, value in tensors.items():
        value = value.index_select(0, index.to(value.device))
        out[key] = value[:, :width] if value.ndim >= 2 and value.shape[1] == full_width else value
    return out


def minibatches(
    lengths: list[int], *, epochs: int, rows: int, token_budget: int, seed: int, packed: bool = False,
    live: list[int] | None = None, tokens: list[list[int]] | None = None,
) -> Iterator[tuple[list[int], list[list[int]]]]:
    """``epochs`` shuffled passes over the samples: (a mini-batch's rows, its token-budget micro-batches).

    ``rows`` samples make a mini-batch (one optimizer step). ``packed``:
    micro-batches whose rows' total length fits the budget (they run as one
    packed row); else whose padded size does. ``live`` (default: every
    sample): only these are put in micro-batches, the mini-batches are cut as
    if all were (the same optimizer steps, the same normalisers); a mini-batch
    without one gets a placeholder pass (``[]``) so its optimizer step still
    runs. ``tokens`` (packed only): the samples' tokens; micro-batches are then
    cut in prefix order on the tokens a shared layout computes
    (:func:`~agent_r1.training.packing.shared_micro_batches`). Micro-batch
    lists are padded to the same length on every rank
    (:func:`equalize_micro_batches`).
    """
    order = list(range(len(lengths)))
    forwarded = set(order if live is None else live)
    rng = random.Random(seed)
    for _ in range(epochs):
        rng.shuffle(order)
        for start in range(0, len(order), rows):
            chosen = order[start : start + rows]
            kept = [i for i in chosen if i in forwarded]
            if tokens is not None and packed:
                local = shared_micro_batches([tokens[i] for i in kept], token_budget)
            else:
                local = micro_batches([lengths[i] for i in kept], token_budget, packed)
            local = local or [[]]
            yield chosen, [[kept[i] for i in group] for group in equalize_micro_batches(local)]


def global_denominator(local_count: float, world: int) -> float:
    """Per-rank denominator that makes DeepSpeed's rank-average of gradients the global token mean:
    sum over ranks of (local sum / (global count / world)) / world = global sum / global count."""
    if world > 1:
        import torch.distributed as dist

        t = torch.tensor([local_count], dtype=torch.float64)
        dist.all_reduce(t)
        local_count = float(t.item()) / world
    return max(local_count, 1.0)
