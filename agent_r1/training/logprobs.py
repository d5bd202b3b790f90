"""Token log-probabilities and values, micro-batched by a token budget.

Full-vocabulary float32 logits (49,152 classes) for a whole batch of
trajectories do not fit in memory. So logits are never materialised
for the whole batch: the backbone runs once, and the LM head + float32
log-softmax run over chunks of at most ``chunk_tokens`` positions. With
gradients on, each chunk is wrapped in activation checkpointing, so only the
hidden states are kept for the backward and each chunk's logits are rebuilt
there one at a time. Padding positions are skipped entirely.

Packed micro-batches (:func:`token_logprobs` with ``packed``): the rows' real tokens
are concatenated into one row, positions restart at 0 for each, and
attention runs per row (:data:`PACKED_ATTENTION`), so no padding position is
computed and the result equals the padded computation's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from agent_r1.accelerator import select_accelerator
from agent_r1.training.batching import equalize_micro_batches, max_over_ranks, micro_batches, select_rows  # noqa: E402
from agent_r1.training.packing import PackedLayout, plain_layout, shared_layout, shared_micro_batches

PACKED_ATTENTION = "agent_r1_packed"


def _packed_attention(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, **kwargs,
) -> tuple[torch.Tensor, None]:
    """SDPA per node of ``packed_layout`` (a :class:`~agent_r1.training.packing.PackedLayout`) when given;
    plain SDPA otherwise. A root node attends causally to itself; a shared prefix's child attends to
    the nodes on its path, then causally to itself.

    Why per node: one causal SDPA with a block mask over a packed row of T
    tokens costs T^2 attention, about as much as the rest of a 135M model at
    T = 4096; per node it is what each row would cost alone.
    """
    layout = kwargs.pop("packed_layout", None)
    if layout is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    # split, not slices: a slice's backward zero-fills the whole tensor once per node
    qs, ks, vs = (t.split(layout.sizes, dim=2) for t in (query, key, value))
    outs = []
    for node, q in enumerate(qs):
        mask = layout.attention_mask(node, q.device)
        if mask is None:
            outs.append(sdpa_attention_forward(module, q, ks[node], vs[node], None, is_causal=True, **kwargs)[0])
            continue
        path = layout.path(node)
        k, v = torch.cat([ks[n] for n in path], dim=2), torch.cat([vs[n] for n in path], dim=2)
        outs.append(_masked_sdpa(module, q, k, v, mask, **kwargs))
    return torch.cat(outs, dim=1), None  # [1, T, heads, head_dim]


def _masked_sdpa(
    module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, **kwargs
) -> torch.Tensor:
    """SDPA with an explicit mask, ``[1, T, heads, head_dim]``. On CPU its kernel takes grouped KV heads
    with a mask, so the keys and values it keeps for the backward are not repeated per query head
    (transformers repeats them whenever a mask is given, for the CUDA kernels' sake)."""
    if q.device.type != "cpu":
        return sdpa_attention_forward(module, q, k, v, mask, is_causal=False, **kwargs)[0]
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=kwargs.get("dropout", 0.0), scale=kwargs.get("scaling"),
        enable_gqa=k.shape[1] != q.shape[1],
    )
    return out.transpose(1, 2).contiguous()


AttentionInterface.register(PACKED_ATTENTION, _packed_attention)
AttentionMaskInterface.register(PACKED_ATTENTION, sdpa_mask)  # unpacked calls get SDPA's own masks


def use_packed_attention(lm: nn.Module) -> None:
    """Let ``lm`` run packed micro-batches; without a ``packed_layout`` its attention is SDPA as before."""
    if lm.config._attn_implementation not in ("sdpa", PACKED_ATTENTION):
        raise ValueError(f"packed updates need SDPA attention, the model uses {lm.config._attn_implementation!r}")
    lm.config._attn_implementation = PACKED_ATTENTION


def partitioned(model: nn.Module) -> bool:
    """True when the model's weights are ZeRO-3 shards (every forward is then a collective)."""
    return any(hasattr(p, "ds_id") for p in inner_module(model).parameters())


def _chunk_logprobs(
    head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(target) and entropy for ``[N, H]`` hidden states, in float32."""
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, dim=-1)
    logprob = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if with_entropy:
        logp = logits - lse.unsqueeze(-1)  # not lse - E[logits]: that cancels badly when peaked
        entropy = -(logp.exp() * logp).sum(-1)
    else:
        entropy = torch.zeros_like(logprob)
    return logprob, entropy


class LogprobModel(nn.Module):
    """A causal LM whose forward returns token log-probs (and entropy) instead of logits.

    Why: DeepSpeed does its gradient-accumulation bookkeeping in
    ``engine.forward`` (ZeRO-3 otherwise overwrites, instead of summing, the
    gradients of successive micro-batches), so the chunked log-prob computation
    must run *inside* the engine's forward. The wrapper registers the LM's own
    children under their own names (``model``, ``lm_head``), so its
    ``state_dict`` keys are exactly the Hugging Face model's.
    """

    def __init__(self, lm: nn.Module):
        super().__init__()
        head = lm.get_output_embeddings()
        children = dict(lm.named_children())
        head_name = next((n for n, m in children.items() if m is head), None)
        backbone_name = getattr(lm, "base_model_prefix", "")
        if head is None or head_name is None or backbone_name not in children:
            raise TypeError(f"LogprobModel needs a causal LM with a backbone and an LM head, got {type(lm).__name__}")
        extra = set(children) - {head_name, backbone_name}
        if extra or any(True for _ in lm.named_parameters(recurse=False)):
            raise TypeError(f"LogprobModel: {type(lm).__name__} has modules beyond backbone and head: {sorted(extra)}")
        self.add_module(backbone_name, children[backbone_name])
        self.add_module(head_name, head)
        self.__dict__["lm"] = lm  # not registered: its parameters are the ones above
        self.config = lm.config
        self._backbone_name, self._head_name = backbone_name, head_name

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        temperature: float = 1.0,
        return_entropy: bool = False,
        chunk_tokens: int = 1024,
        score_mask: torch.Tensor | None = None,
        layout: PackedLayout | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logprobs, entropy)``, both ``[B, T]`` float32 (entropy zeros unless asked for).

        ``score_mask`` ([B, T], optional): score only the tokens where it is set
        (0 elsewhere). Why: the LM head over 49k classes is ~20% of a 135M
        model's FLOPs per token, and a loss that reads only the agent's tokens
        (a small share of a trajectory) need not pay for it on the tool observations.
        ``layout``: ``input_ids`` is one packed row laid out by it (see
        :func:`token_logprobs`'s ``packed``); each token is then predicted by
        the hidden state the layout names (its row's previous token).
        """
        backbone, head = getattr(self, self._backbone_name), getattr(self, self._head_name)
        extra = {}
        if layout is not None:
            if input_ids.shape != (1, layout.total):
                raise ValueError(f"a packed layout of {layout.total} tokens, got input_ids {tuple(input_ids.shape)}")
            extra = {"position_ids": layout.position_ids(input_ids.device), "packed_layout": layout}
        hidden = backbone(
            input_ids=input_ids, attention_mask=None if extra else attention_mask, use_cache=False, **extra
        ).last_hidden_state
        B, T = input_ids.shape
        if layout is None:  # position t-1 predicts token t; only real (non-padding) targets are scored
            predictor = torch.arange(-1, T - 1, device=input_ids.device)
            valid = torch.zeros_like(attention_mask, dtype=torch.bool)
            valid[:, 1:] = attention_mask[:, 1:].bool() & attention_mask[:, :-1].bool()
        else:
            predictor = layout.predictors().to(input_ids.device)
            valid = (predictor >= 0)[None]
        if score_mask is not None:
            valid = valid & score_mask.bool()
        rows, cols = valid.nonzero(as_tuple=True)
        flat_hidden = hidden[rows, predictor[cols]]
        flat_targets = input_ids[rows, cols]
        pieces_lp, pieces_ent = [], []
        n_chunks = -(-flat_targets.shape[0] // chunk_tokens)
        if hasattr(head.weight, "ds_id"):  # ZeRO-3: each head call gathers its weight, a collective
            n_chunks = max_over_ranks(n_chunks)
        for start in range(0, n_chunks * chunk_tokens, chunk_tokens):  # trailing chunks may be empty
            h, y = flat_hidden[start : start + chunk_tokens], flat_targets[start : start + chunk_tokens]
            if torch.is_grad_enabled():  # keep only h for the backward; rebuild the logits there
                lp, ent = checkpoint(_chunk_logprobs, head, h, y, temperature, return_entropy, use_reentrant=False)
            else:
                lp, ent = _chunk_logprobs(head, h, y, temperature, return_entropy)
            pieces_lp.append(lp)
            pieces_ent.append(ent)
        logprobs = hidden.new_zeros((B, T), dtype=torch.float32)
        entropy = hidden.new_zeros((B, T), dtype=torch.float32)
        if pieces_lp:
            logprobs = logprobs.masked_scatter(valid, torch.cat(pieces_lp))
            entropy = entropy.masked_scatter(valid, torch.cat(pieces_ent))
        return logprobs, entropy


@dataclass
class PackedRows:
    """Right-padded rows ``[B, T]`` as one packed row ``ids`` ``[1, P]`` laid out by ``layout``;
    ``index``: the packed position of each real token, in the rows' order."""

    layout: PackedLayout
    ids: torch.Tensor
    index: torch.Tensor
    keep: torch.Tensor  # [B, T] bool: the real tokens

    @classmethod
    def of(cls, input_ids: torch.Tensor, attention_mask: torch.Tensor, share_prefix: bool) -> "PackedRows":
        keep = attention_mask.bool()
        lengths = keep.sum(-1).tolist()
        real = [n for n in lengths if n]
        if share_prefix:
            layout = shared_layout([input_ids[r, :n].tolist() for r, n in enumerate(lengths) if n])
        else:
            layout = plain_layout(real)
        index = torch.cat(layout.row_index(real)).to(input_ids.device)
        ids = input_ids.new_zeros(layout.total).index_copy_(0, index, input_ids[keep])[None]
        return cls(layout, ids, index, keep)

    def packed(self, row_values: torch.Tensor) -> torch.Tensor:
        """``[B, T]`` -> ``[1, P]`` bool: set where any row sharing the position has it set."""
        hits = torch.zeros(self.layout.total, device=self.ids.device).index_add_(0, self.index, row_values[self.keep].float())
        return (hits > 0)[None]

    def unpacked(self, x: torch.Tensor) -> torch.Tensor:
        """``[1, P]`` -> ``[B, T]`` (0 on padding); a shared position's value goes to every row sharing it."""
        return x.new_zeros(self.keep.shape).masked_scatter(self.keep, x[0, self.index])


def _packed_forward(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float,
    return_entropy: bool, chunk_tokens: int, score_mask: torch.Tensor | None, share_prefix: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``model``'s (a :class:`LogprobModel` or its engine) ``(logprobs, entropy)`` of right-padded rows
    computed as one packed row of their real tokens (their shared prefixes once when ``share_prefix``),
    back ``[B, T]`` with 0 on padding and outside ``score_mask``."""
    rows = PackedRows.of(input_ids, attention_mask, share_prefix)
    score = rows.packed(score_mask) if score_mask is not None else None  # scored if any of its rows scores it
    lp, ent = model(rows.ids, torch.ones_like(rows.ids), temperature, return_entropy, chunk_tokens, score, rows.layout)
    lp, ent = rows.unpacked(lp), rows.unpacked(ent)
    if share_prefix and score_mask is not None:  # each row keeps only what it scores
        lp, ent = (torch.where(score_mask.bool(), x, 0.0) for x in (lp, ent))
    return lp, ent


def token_values(
    value_model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, packed: bool = False,
    share_prefix: bool = False,
) -> torch.Tensor:
    """A value model's (or its engine's) ``[B, T]`` float32 values, 0 on padding; ``packed`` and
    ``share_prefix`` as in :func:`token_logprobs`."""
    if share_prefix and not packed:
        raise ValueError("share_prefix needs packed micro-batches")
    if not packed:
        return value_model(input_ids, attention_mask).float() * attention_mask
    rows = PackedRows.of(input_ids, attention_mask, share_prefix)
    return rows.unpacked(value_model(rows.ids, torch.ones_like(rows.ids), rows.layout).float())


def token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    return_entropy: bool = False,
    chunk_tokens: int = 1024,
    score_mask: torch.Tensor | None = None,
    packed: bool = False,
    share_prefix: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``logprobs[:, t] = log p(input_ids[:, t] | tokens < t)``, ``[B, T]`` float32.

    Column 0, padding positions and positions outside ``score_mask`` (when
    given) are 0 (as is the entropy there). Gradients
    flow to the parameters. ``model``: an engine from ``make_trainable`` /
    ``make_frozen`` (its forward is already a :class:`LogprobModel`), a
    :class:`LogprobModel`, or a plain Hugging Face causal LM (wrapped here).

    ``packed``: the real tokens of every row are concatenated and computed as
    one row (no padding computed); the results equal the padded computation's
    up to float rounding. ``model`` must then use :func:`use_packed_attention`
    (an engine's module, or a causal LM). ``share_prefix`` (packed only): the
    rows' shared prefixes are computed once (:mod:`agent_r1.training.packing`),
    with the same results up to float rounding.
    """
    if not isinstance(inner_module(model), LogprobModel):
        model = LogprobModel(model)
    args = (temperature, return_entropy, chunk_tokens, score_mask)
    if share_prefix and not packed:
        raise ValueError("share_prefix needs packed micro-batches")
    if packed:
        logprobs, entropy = _packed_forward(model, input_ids, attention_mask, *args, share_prefix)
    else:
        logprobs, entropy = model(input_ids, attention_mask, *args)
    return (logprobs, entropy) if return_entropy else logprobs


@torch.no_grad()
def batched_token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    token_budget: int,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 1024,
    score_mask: torch.Tensor | None = None,
    share_prefix: bool = False,
) -> torch.Tensor:
    """:func:`token_logprobs` over token-budget micro-batches, without gradients ([B, T]).

    For the old-policy and reference log-probabilities of a whole rollout batch
    (``score_mask``: only the positions a loss will read). ``share_prefix``:
    packed micro-batches cut in prefix order, shared prefixes computed once,
    and rows with nothing to score not computed at all.
    """
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    for rows, mb in _plan(model, input_ids, attention_mask, token_budget, share_prefix, score_mask=score_mask):
        lp = token_logprobs(
            model, mb["input_ids"], mb["attention_mask"], temperature=temperature, chunk_tokens=chunk_tokens,
            score_mask=mb.get("score_mask"), packed=share_prefix, share_prefix=share_prefix,
        )
        if rows:
            out[rows, : lp.shape[1]] = lp
    return out


@torch.no_grad()
@torch.no_grad()
def batched_values(
    value_model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_budget: int,
    share_prefix: bool = False,
) -> torch.Tensor:
    """:func:`token_values` over token-budget micro-batches, without gradients ([B, T]); ``share_prefix``:
    packed micro-batches cut in prefix order, shared prefixes computed once."""
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    for rows, mb in _plan(value_model, input_ids, attention_mask, token_budget, share_prefix):
        v = token_values(value_model, mb["input_ids"], mb["attention_mask"], packed=share_prefix, share_prefix=share_prefix)
        if rows:
            out[rows, : v.shape[1]] = v
    return out


def _plan(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_budget: int,
    share_prefix: bool, **extra: torch.Tensor | None,
):
    """``(rows, micro_batch)`` pairs; under ZeRO-3 padded with placeholders (``rows == []``,
    a one-row batch whose output is dropped) so that every rank runs as many forwards.
    ``extra`` ``[B, T]`` tensors (None ones are left out) are cut the same way.
    ``share_prefix``: the rows with something to score (``extra['score_mask']``), in prefix order."""
    lengths = attention_mask.sum(-1).tolist()
    if share_prefix:
        score = extra.get("score_mask")
        rows = [r for r in range(len(lengths)) if lengths[r] and (score is None or score[r].any())]
        local = shared_micro_batches([input_ids[r, : lengths[r]].tolist() for r in rows], token_budget)
        groups = [[rows[i] for i in g] for g in local]
    else:
        groups = micro_batches(lengths, token_budget)
    if partitioned(model):
        groups = equalize_micro_batches(groups)
    tensors = {"input_ids": input_ids, "attention_mask": attention_mask}
    tensors.update({k: v for k, v in extra.items() if v is not None})
    if input_ids.shape[0] == 0:
        tensors = {k: torch.ones((1, 2), dtype=v.dtype, device=v.device) for k, v in tensors.items()}
    for rows in groups:
        yield rows, select_rows(tensors, rows or [0])


def inner_module(model: nn.Module) -> nn.Module:
    """The module a DeepSpeed engine runs (or ``model`` itself)."""
    select_accelerator()  # before deepspeed's first import: it picks its accelerator then
    import deepspeed

    return model.module if isinstance(model, deepspeed.DeepSpeedEngine) else model
