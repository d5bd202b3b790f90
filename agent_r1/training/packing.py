"""How a micro-batch's rows are laid out in one packed row, with or without their shared prefixes.

Plain packing puts the rows' real tokens back to back, each row attending only
to itself. Prefix sharing (in the spirit of Prefix Grouper, arXiv 2506.05433)
goes further: the rows become a tree of token spans (a compressed trie), each
span computed once; a span's tokens attend to the spans on its path from the
root, then causally to themselves. Every row sees exactly the tokens, positions
and attention it would see alone, so its log-probs and their gradients equal
the unshared computation's up to float rounding: the shared tokens' forward and
backward simply run once, their gradients summed over the rows that share them.

In this repo's trajectories the system prompt is shared by every sample of an
iteration, the question by a group's samples, and step k's context is the
prefix of step k+1's sample (the step-level representation).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class PackedLayout:
    """Spans ("nodes") laid out back to back in one packed row, each under a parent (-1: a root).

    ``rows[r]``: row r's nodes from its root to its last one; its tokens are
    those nodes' tokens in that order (its first ``lengths[r]`` of them).
    """

    sizes: list[int]
    parents: list[int]
    rows: list[list[int]]
    starts: list[int] = field(init=False)
    depths: list[int] = field(init=False)  # tokens before a node on its path (its first position id)
    masks: dict[int, torch.Tensor] = field(init=False, default_factory=dict)  # by node, built on first use

    def __post_init__(self) -> None:
        self.starts, self.depths = [], []
        for n, size in enumerate(self.sizes):
            if size < 1 or not -1 <= self.parents[n] < n:
                raise ValueError(f"node {n}: size {size}, parent {self.parents[n]} (parents come first)")
            self.starts.append(self.starts[-1] + self.sizes[n - 1] if n else 0)
            p = self.parents[n]
            self.depths.append(0 if p < 0 else self.depths[p] + self.sizes[p])

    @property
    def total(self) -> int:
        return sum(self.sizes)

    def path(self, node: int) -> list[int]:
        """The node's ancestors from the root, then itself."""
        out = [node]
        while self.parents[out[-1]] >= 0:
            out.append(self.parents[out[-1]])
        return out[::-1]

    def shared(self) -> bool:
        return any(p >= 0 for p in self.parents)

    def position_ids(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """``[1, total]``: each token's position in its own row (the depth of its node, then on)."""
        return torch.cat([torch.arange(d, d + s, device=device) for d, s in zip(self.depths, self.sizes)])[None]

    def predictors(self) -> torch.Tensor:
        """``[total]``: the packed index of the hidden state that predicts each token (-1: a row's first token)."""
        out = torch.arange(-1, self.total - 1)
        for n, p in enumerate(self.parents):
            out[self.starts[n]] = self.starts[p] + self.sizes[p] - 1 if p >= 0 else -1
        return out

    def row_index(self, lengths: list[int]) -> list[torch.Tensor]:
        """Per row, the packed index of each of its ``lengths[r]`` tokens."""
        out = []
        for nodes, n in zip(self.rows, lengths):
            idx = torch.cat([torch.arange(self.starts[k], self.starts[k] + self.sizes[k]) for k in nodes])
            if idx.numel() < n:
                raise ValueError(f"a row of {n} tokens laid out on {idx.numel()}")
            out.append(idx[:n])
        return out

    def attention_mask(self, node: int, device: torch.device | str) -> torch.Tensor | None:
        """``[1, 1, size, context]`` bool (True: attend) for a node's queries over its path's keys;
        None for a root (plain causal)."""
        if self.parents[node] < 0:
            return None
        if node not in self.masks:
            size, before = self.sizes[node], self.depths[node]
            mask = torch.ones(size, before + size, dtype=torch.bool)
            mask[:, before:] = torch.ones(size, size, dtype=torch.bool).tril()
            self.masks[node] = mask[None, None].to(device)
        return self.masks[node]


def plain_layout(lengths: list[int]) -> PackedLayout:
    """Rows back to back, nothing shared."""
    return PackedLayout(list(lengths), [-1] * len(lengths), [[r] for r in range(len(lengths))])


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def shared_layout(tokens: list[list[int]]) -> PackedLayout:
    """The rows' compressed trie: every prefix shared by two or more rows is one node."""
    sizes: list[int] = []
    parents: list[int] = []
    rows: list[list[int]] = [[] for _ in tokens]

    def add(members: list[int], start: int, parent: int, path: list[int]) -> None:
        # members: sorted by their tokens, identical up to ``start``, all with the same token there
        if len(members) > 1:
            common = min(common_prefix(tokens[a][start:], tokens[b][start:]) for a, b in zip(members, members[1:]))
        else:
            common = len(tokens[members[0]]) - start
        sizes.append(common)
        parents.append(parent)
        node, start = len(sizes) - 1, start + common
        for r in members:
            if len(tokens[r]) == start:
                rows[r] = path + [node]
        for group in _runs([r for r in members if len(tokens[r]) > start], lambda r: tokens[r][start]):
            add(group, start, node, path + [node])

    order = sorted(range(len(tokens)), key=lambda r: tokens[r])
    for group in _runs([r for r in order if tokens[r]], lambda r: tokens[r][0]):
        add(group, 0, -1, [])
    return PackedLayout(sizes, parents, rows)


def _runs(items: list[int], key) -> list[list[int]]:
    """Consecutive items with the same key."""
    out: list[list[int]] = []
    for i in items:
        if out and key(out[-1][-1]) == key(i):
            out[-1].append(i)
        else:
            out.append([i])
    return out


def shared_micro_batches(tokens: list[list[int]], token_budget: int) -> list[list[int]]:
    """Rows in trie order (sorted by their tokens), cut so that each micro-batch's *distinct* tokens
    (what a shared layout computes) fit ``token_budget``; a longer row gets a micro-batch of its own."""
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    groups: list[list[int]] = []
    used = 0
    for r in sorted(range(len(tokens)), key=lambda r: tokens[r]):
        new = len(tokens[r]) - (common_prefix(tokens[groups[-1][-1]], tokens[r]) if groups else 0)
        if groups and used + new <= token_budget:
            groups[-1].append(r)
            used += new
        else:
            groups.append([r])
            used = len(tokens[r])
    return groups


def distinct_tokens(tokens: list[list[int]], groups: list[list[int]]) -> int:
    """Tokens a shared layout computes over ``groups`` (each group one trie)."""
    return sum(shared_layout([tokens[r] for r in g]).total for g in groups if g)
