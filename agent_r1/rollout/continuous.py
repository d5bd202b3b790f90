"""Continuous batching for multi-turn episodes, with each episode's KV cache kept across turns.

:class:`ContinuousSession` is the turn session of the transformers engine
(:meth:`~agent_r1.rollout.transformers_engine.TransformersEngine.open_turns`).
The per-turn session (:class:`agent_r1.rollout.engine.TurnByTurnSession`)
hands the engine every episode's whole history on every turn, so the prompt,
earlier actions and observations are prefilled again turn after turn, and a
turn waits for its slowest episode. Here an episode is a *slot*:

* its KV cache is kept when its turn ends; when it comes back with an
  observation, only the tokens not yet computed (the turn's last sampled token
  and the observation) are prefilled on top of it;
* the first prompts are deduplicated (the ``n`` samples of a question share one
  prompt) and their common prefix (system prompt, one-shot example) is run
  once, so a group's prompt is prefilled once; later, episodes whose whole
  contexts are the same (a group's samples that made the same search and got the
  same documents) are prefilled once too;
* when the scheduler replaces an episode's context (older observations
  shortened, ``env.context``), its cache is cut to the prefix the new context
  shares with the old one and the rest is prefilled;
* rows leave the running batch as their turn ends, and waiting episodes
  (observations back from the tools, or episodes not started yet) are
  prefilled and merged into it while the others keep decoding.

The running batch is one KV cache ``[rows, kv_heads, width, head_dim]`` per
layer whose rows are left-padded to the same width; an attention mask marks
the real positions and each row carries its own position counter, so padding
never shifts a position. Every token of an episode is thus computed exactly
once, except that the group's shared prompt is computed once for the group.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from agent_r1.rollout.decoding import StopChecker, sample_tokens, shared_prefix_length
from agent_r1.rollout.engine import GenerationOutput, TurnSession, TurnSettings

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [kv_heads, n, head_dim]


class CachedDecoder(Protocol):
    """What the session uses of its engine (public attributes of
    :class:`~agent_r1.rollout.transformers_engine.TransformersEngine`)."""

    tokenizer: Any
    model: Any  # its ``config`` sizes the KV cache
    device: torch.device
    pad_id: int
    stop_token_ids: set[int]
    compact_fraction: float  # compact the running rows once this share of them is dead
    min_shared_prefix: int  # shortest common prompt prefix worth running once
    stats: dict[str, int]  # tokens run through the model, by kind

    def last_logits(self, **inputs: Any) -> torch.Tensor:
        """float32 logits at the last position of a decoder forward (ids, mask, positions, cache)."""


@dataclass
class _Episode:
    tokens: list[int]  # its context so far (what the cache is of): the last one added, then this turn's tokens
    kv: KV | None = None  # the cache of tokens[:n_cached]
    n_cached: int = 0
    out: GenerationOutput = field(default_factory=lambda: GenerationOutput([], [], "length"))
    limit: int = 0  # tokens this turn may generate


class _GrowingLayer(DynamicLayer):
    """A cache layer with spare room at the end: a decoding step writes its token into it.

    transformers' layer concatenates on every update, i.e. copies the whole
    cache for every token generated, which cost about as much as the step's
    forward pass. ``keys``/``values`` stay views of the buffer, so everything
    that reads them works unchanged; when they are replaced from outside (rows
    dropped), the next update moves them into a new buffer.
    """

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, s = (self.keys.shape[-2] if self.keys.numel() else 0), key_states.shape[-2]
        buf = getattr(self, "buffer", None)
        if buf is None or buf[0].shape[-2] < n + s or self.keys.data_ptr() != buf[0].data_ptr():
            shape = (*key_states.shape[:2], n + s + max(64, n // 4), key_states.shape[-1])
            buf = self.buffer = (key_states.new_empty(shape), value_states.new_empty(shape))
            if n:
                buf[0][:, :, :n], buf[1][:, :, :n] = self.keys, self.values
        buf[0][:, :, n : n + s], buf[1][:, :, n : n + s] = key_states, value_states
        self.keys, self.values = buf[0][:, :, : n + s], buf[1][:, :, : n + s]
        return self.keys, self.values


def _cache(kv: KV, config) -> DynamicCache:
    """A cache of growing layers holding ``kv`` (per layer [B, kv_heads, W, head_dim]), empty when ``kv`` is."""
    cache = DynamicCache(config=config)
    if all(type(layer) is DynamicLayer for layer in cache.layers):  # sliding-window layers keep their own
        cache.layers = [_GrowingLayer() for _ in cache.layers]
    for layer, (k, v) in zip(cache.layers, kv):
        layer.lazy_initialization(k, v)
        layer.keys, layer.values = k, v
    return cache


def _kv(cache: DynamicCache) -> KV:
    return [(layer.keys, layer.values) for layer in cache.layers]


@dataclass
class _Rows:
    """Running rows: their KV cache, attention mask [B, W], next positions [B] and episodes."""

    cache: DynamicCache  # kept across decoding steps: rebuilding it would copy it every token
    mask: torch.Tensor
    next_pos: torch.Tensor
    logits: torch.Tensor  # [B, V] float32: each row's next-token distribution
    episodes: list[Hashable]  # the key of each row's episode
    alive: list[bool]


# Admit waiting episodes once this share of the slots can be filled (or nothing runs): each
# admission is a prefill forward plus a copy of the running cache, worth batching.
ADMIT_FRACTION = 0.25


def _keep_common_prefix(ep: _Episode, context: list[int]) -> None:
    """Cut ``ep``'s cache to the part it shares with its new ``context``: a context that extends
    the old one keeps it all, a replaced one (shortened older observations) is prefilled from the
    first token that changed."""
    same = 0
    limit = min(ep.n_cached, len(context))
    while same < limit and ep.tokens[same] == context[same]:
        same += 1
    if same == ep.n_cached:  # an extension: the whole cache stays
        return
    if same == 0 or ep.kv is None:
        ep.kv, ep.n_cached = None, 0
        return
    ep.kv = [(k[:, :same], v[:, :same]) for k, v in ep.kv]
    ep.n_cached = same


def _pad_left(x: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - x.shape[dim]
    if missing == 0:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    return torch.cat([x.new_zeros(shape), x], dim=dim)


def _merge(parts: list[_Rows], config) -> _Rows:
    """One batch of all parts' rows, each left-padded to the widest."""
    width = max(p.mask.shape[1] for p in parts)
    layers = zip(*(_kv(p.cache) for p in parts))
    kv = [
        (torch.cat([_pad_left(k, width, 2) for k, _ in part]), torch.cat([_pad_left(v, width, 2) for _, v in part]))
        for part in layers
    ]
    return _Rows(
        _cache(kv, config),
        torch.cat([_pad_left(p.mask, width, 1) for p in parts]),
        torch.cat([p.next_pos for p in parts]),
        torch.cat([p.logits for p in parts]),
        [e for p in parts for e in p.episodes],
        [a for p in parts for a in p.alive],
    )


def _select(rows: _Rows, keep: list[int]) -> _Rows:
    """Only rows ``keep``, with the leading columns that are padding in every kept row cut off."""
    index = torch.tensor(keep, dtype=torch.long, device=rows.mask.device)
    mask = rows.mask.index_select(0, index)
    first = int(mask.any(0).long().argmax()) if mask.numel() else 0
    for layer in rows.cache.layers:
        layer.keys = layer.keys.index_select(0, index)[:, :, first:]
        layer.values = layer.values.index_select(0, index)[:, :, first:]
    return _Rows(
        rows.cache, mask[:, first:], rows.next_pos.index_select(0, index), rows.logits.index_select(0, index),
        [rows.episodes[r] for r in keep], [rows.alive[r] for r in keep],
    )


class ContinuousSession(TurnSession):
    """Multi-turn episodes on a :class:`CachedDecoder` (the transformers engine), continuously batched.

    Each :meth:`step` runs the schedule until some turns end: feed the tokens
    sampled last (one decoding step for the running rows), admit waiting
    episodes into free slots, sample; when turns end, their rows' caches go to
    their episodes and the step returns them. Episodes added meanwhile wait for
    the next admission.
    """

    def __init__(self, engine: CachedDecoder, settings: TurnSettings, stop_strings: Sequence[str], generator: torch.Generator):
        self.engine, self.cfg, self.gen = engine, settings, generator
        self.stops = StopChecker(engine.tokenizer, stop_strings)
        self.episodes: dict[Hashable, _Episode] = {}
        self.waiting: list[Hashable] = []  # in the order they were added: admitted first come, first served
        self.rows: _Rows | None = None
        self.sampled: torch.Tensor | None = None  # the tokens sampled last, fed at the start of the next step
        self.admit_min = max(1, math.ceil(ADMIT_FRACTION * settings.slots))

    # ------------------------------------------------------------ the session
    @torch.inference_mode()
    def add(self, key: Hashable, context: list[int]) -> None:
        if key in self.waiting or self._running(key):
            raise ValueError(f"episode {key!r} already has a turn queued or running")
        ep = self.episodes.get(key)
        if ep is None:
            self.episodes[key] = _Episode(list(context))
        else:
            _keep_common_prefix(ep, context)
            ep.tokens = list(context)
        self.waiting.append(key)

    def drop(self, key: Hashable) -> None:
        self.episodes.pop(key, None)  # and its cache with it

    @torch.inference_mode()
    def step(self) -> list[tuple[Hashable, GenerationOutput]]:
        while True:
            if self.sampled is not None:
                tokens, self.sampled = self.sampled, None
                if any(self.rows.alive):
                    self.rows = self._decode(self.rows, tokens)
            if not (self.waiting or (self.rows is not None and any(self.rows.alive))):
                return []
            self._admit_waiting()
            self.sampled, ended = self._sample(self.rows)
            if ended:
                return self._end_turns(self.rows, ended)

    def _running(self, key: Hashable) -> bool:
        rows = self.rows
        return rows is not None and any(a and k == key for k, a in zip(rows.episodes, rows.alive))

    # ------------------------------------------------------------ forwards
    def _forward(self, cache: DynamicCache, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Feed ``ids`` [B, S] on top of ``cache`` (grown in place; mask covers cache + ids); the last logits."""
        return self.engine.last_logits(
            input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True
        )

    def _shared_prefix(self, prompts: list[list[int]]) -> tuple[KV | None, int]:
        """The KV of the prompts' common prefix, computed once (at least one token of each is left)."""
        n = shared_prefix_length(prompts, self.engine.min_shared_prefix)
        if n == 0:
            return None, 0
        ids = torch.tensor([prompts[0][:n]], device=self.engine.device)
        cache = _cache([], self.engine.model.config)
        self._forward(cache, ids, torch.ones_like(ids), torch.arange(n, device=ids.device)[None])
        self.engine.stats["prefill_tokens"] += n
        return [(k[0], v[0]) for k, v in _kv(cache)], n

    def _prefill(
        self, items: list[tuple[KV | None, int, list[int]]]
    ) -> tuple[DynamicCache, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rows of (cached KV, its length, new ids): each row laid out as [pad | cache][pad | new ids].

        Returns the merged cache, mask, next positions and last-position logits.
        """
        width_c = max(n for _, n, _ in items)
        width_s = max(len(s) for _, _, s in items)
        B = len(items)
        mask = torch.zeros((B, width_c + width_s), dtype=torch.long)
        ids = torch.full((B, width_s), self.engine.pad_id, dtype=torch.long)
        pos = torch.zeros((B, width_s), dtype=torch.long)
        kv: KV = []
        for r, (cached, n, suffix) in enumerate(items):
            mask[r, width_c - n : width_c] = 1
            mask[r, width_c + width_s - len(suffix) :] = 1
            ids[r, width_s - len(suffix) :] = torch.tensor(suffix)
            pos[r, width_s - len(suffix) :] = torch.arange(n, n + len(suffix))
        mask, ids, pos = (t.to(self.engine.device) for t in (mask, ids, pos))
        if width_c:
            layers = next(c for c, _, _ in items if c is not None)
            for layer in range(len(layers)):
                k = torch.stack([_pad_left(c[layer][0] if c else layers[layer][0][:, :0], width_c, 1) for c, _, _ in items])
                v = torch.stack([_pad_left(c[layer][1] if c else layers[layer][1][:, :0], width_c, 1) for c, _, _ in items])
                kv.append((k, v))
        self.engine.stats["prefill_tokens"] += sum(len(s) for _, _, s in items)
        self.engine.stats["padded_tokens"] += B * width_s - sum(len(s) for _, _, s in items)
        config = self.engine.model.config
        cache = _cache(kv, config)
        logits = self._forward(cache, ids, mask, pos)
        return cache, mask, torch.tensor([n + len(s) for _, n, s in items], device=mask.device), logits

    def _admit(self, chosen: list[Hashable]) -> _Rows:
        """Prefill the waiting episodes ``chosen``: fresh prompts deduplicated, resumed ones on their cache.

        Episodes whose whole context is the same (a group's samples that made the same
        first search, got the same documents back) are prefilled once: one item, its
        cache row copied to each of them."""
        episodes = self.episodes
        fresh = [i for i in chosen if episodes[i].kv is None]
        resumed = [i for i in chosen if episodes[i].kv is not None]
        items: list[tuple[KV | None, int, list[int]]] = []
        order: list[int] = []  # item index of each admitted episode
        if fresh:
            unique: dict[tuple[int, ...], int] = {}
            for i in fresh:
                unique.setdefault(tuple(episodes[i].tokens), len(unique))
            prefix, n = self._shared_prefix([list(p) for p in unique])
            items += [(prefix, n, list(p[n:])) for p in unique]
            order += [unique[tuple(episodes[i].tokens)] for i in fresh]
        same: dict[tuple[int, ...], int] = {}  # a context already among the items: its row is copied
        for i in resumed:
            ep = episodes[i]
            context = tuple(ep.tokens)
            if context not in same:
                same[context] = len(items)
                items.append((ep.kv, ep.n_cached, ep.tokens[ep.n_cached :]))
            order.append(same[context])
            ep.kv = None  # the running batch holds it now
        cache, mask, next_pos, logits = self._prefill(items)
        index = torch.tensor(order, dtype=torch.long, device=mask.device)
        if order != list(range(len(items))):  # duplicated prompts or contexts: one cache row per episode
            cache.batch_select_indices(index)
        rows = _Rows(cache, mask.index_select(0, index), next_pos.index_select(0, index), logits.index_select(0, index),
                     fresh + resumed, [True] * len(order))
        for i, item in zip(rows.episodes, order):
            cached, n, suffix = items[item]
            self.engine.stats["row_tokens"] += len(suffix) + (n if i in fresh else 0)
            ep = episodes[i]
            ep.out = GenerationOutput([], [], "length")
            ep.limit = self.cfg.budget(len(ep.tokens))
            if ep.limit < 1:
                raise ValueError(f"episode {i!r}: {len(ep.tokens)} tokens leave no room under max_total_tokens")
        return rows

    # ------------------------------------------------------------ the schedule
    def _admit_waiting(self) -> None:
        """Merge waiting episodes into the running rows when enough slots are free (or nothing runs)."""
        rows = self.rows
        n_alive = sum(rows.alive) if rows is not None else 0
        free = self.cfg.slots - n_alive
        if not self.waiting or not (n_alive == 0 or min(free, len(self.waiting)) >= self.admit_min):
            return
        chosen, self.waiting = self.waiting[:free], self.waiting[free:]
        live = [r for r, a in enumerate(rows.alive) if a] if rows is not None else []
        new = self._admit(chosen)
        self.rows = _merge([_select(rows, live), new], self.engine.model.config) if live else new

    def _sample(self, rows: _Rows) -> tuple[torch.Tensor, list[int]]:
        """Sample every alive row's next token; return (tokens [B], rows whose turn ended)."""
        tokens, lps = sample_tokens(rows.logits, self.cfg.temperature, self.cfg.top_p, self.gen)
        ended = []
        for r, (tok, lp) in enumerate(zip(tokens.tolist(), lps.tolist())):
            if not rows.alive[r]:
                continue
            ep = self.episodes[rows.episodes[r]]
            ep.tokens.append(tok)
            ep.out.token_ids.append(tok)
            ep.out.logprobs.append(lp)
            if tok in self.engine.stop_token_ids or self.stops.hit(ep.out.token_ids):
                ep.out.finish_reason = "stop"
                ended.append(r)
            elif len(ep.out.token_ids) >= ep.limit:
                ended.append(r)
        return tokens, ended

    def _end_turns(self, rows: _Rows, ended: list[int]) -> list[tuple[Hashable, GenerationOutput]]:
        """Take the ended rows out of the running batch, each one's cache kept with its episode."""
        for r in ended:
            ep = self.episodes[rows.episodes[r]]
            real = rows.mask[r].nonzero().squeeze(-1)
            ep.kv = [(k[r].index_select(1, real), v[r].index_select(1, real)) for k, v in _kv(rows.cache)]
            ep.n_cached = len(real)
            rows.alive[r] = False
        return [(rows.episodes[r], self.episodes[rows.episodes[r]].out) for r in ended]

    def _decode(self, rows: _Rows, tokens: torch.Tensor) -> _Rows:
        """One token for every row (finished rows are compacted away first once enough are dead)."""
        dead = rows.alive.count(False)
        if dead >= max(1, self.engine.compact_fraction * len(rows.alive)):
            keep = [r for r, a in enumerate(rows.alive) if a]
            tokens = tokens.index_select(0, torch.tensor(keep, dtype=torch.long, device=tokens.device))
            rows = _select(rows, keep)
        mask = torch.cat([rows.mask, rows.mask.new_ones((len(rows.alive), 1))], dim=1)
        logits = self._forward(rows.cache, tokens[:, None], mask, rows.next_pos[:, None])
        self.engine.stats["decode_tokens"] += sum(rows.alive)
        self.engine.stats["row_tokens"] += sum(rows.alive)
        self.engine.stats["padded_tokens"] += rows.alive.count(False)
        return _Rows(rows.cache, mask, rows.next_pos + 1, logits, rows.episodes, rows.alive)
