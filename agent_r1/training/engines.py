"""DeepSpeed engines for the actor, the critic and the frozen reference policy.

Gradient accumulation is ours, not DeepSpeed's: micro-batches come from a
token budget, so their number changes from one optimizer step to the next.
The config therefore sets ``gradient_accumulation_steps=1`` (so
``engine.backward`` never divides the loss) and
``managed_gradient_accumulation=false`` (so ``engine.backward`` only
accumulates gradients, and ``engine.step()`` is the one accumulation boundary:
it finalises the reduced gradients, clips, updates and zeroes them). The
caller pre-scales each micro-batch loss by its own weight (e.g. its share of
the mini-batch's tokens); the update then follows exactly the gradient of the
sum of those losses. tests/test_training_infra.py checks this against one
full-batch step for ZeRO-2 and ZeRO-3.

Several ranks: DeepSpeed *averages* gradients over ranks, so weight a rank's
micro-batch loss by ``world_size / global_count`` to get the global mean; and
every rank must run the same number of forward/backward passes per step
(``logprobs.equalize_micro_batches``), because ZeRO's reductions and ZeRO-3's
weight gathers inside them are collectives (tests/test_deepspeed_ranks.py).
Always call the engine itself (``engine(...)``, ``token_logprobs(engine, ...)``),
never ``engine.module``: DeepSpeed's per-micro-batch bookkeeping runs there.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from agent_r1.accelerator import select_accelerator
from agent_r1.config import TrainConfig
from agent_r1.training.buckets import BUCKET_ALIGN, DEFAULT_BUCKET, DEFAULT_PREFETCH_BUCKET, bucket_elements  # noqa: F401
from agent_r1.training.distributed import init_distributed
from agent_r1.training.logprobs import LogprobModel, unwrap_engine, use_packed_attention

if TYPE_CHECKING:
    import deepspeed

log = logging.getLogger(__name__)

__all__ = ["bucket_elements", "ds_config", "make_engine", "make_reference", "init_distributed", "unwrap", "optimizer_groups"]


def ds_config(
    cfg: TrainConfig, lr: float, *, world_size: int = 1, train: bool = True, model: nn.Module | None = None
) -> dict[str, Any]:
    """The DeepSpeed config for one engine.

    ``train_batch_size`` is nominal (one sample per rank): it only feeds
    DeepSpeed's sample counter, since batching and accumulation are done by the
    caller (see the module docstring). The optimizer is not in the config: a
    torch AdamW is passed to ``deepspeed.initialize`` instead, which needs no
    compiled op. ``warmup_steps > 0`` adds a linear WarmupLR to ``lr``; else the
    rate is constant. ``train=False`` gives an inference-only config (reference).
    ``model``: size ZeRO's buckets to it (:func:`bucket_elements`); without
    it DeepSpeed's defaults apply.
    """
    sizes = [p.numel() for p in model.parameters()] if model is not None else []
    bucket = bucket_elements(sum(sizes), max(sizes, default=0))
    config: dict[str, Any] = {
        "train_batch_size": world_size,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {
            "stage": cfg.zero_stage, "reduce_bucket_size": bucket, "allgather_bucket_size": bucket,
            "stage3_prefetch_bucket_size": min(bucket, DEFAULT_PREFETCH_BUCKET),
        },
        "bf16": {"enabled": cfg.bf16},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if not train:
        # A frozen model has no gradients or optimizer state to partition: ZeRO-1/2 would
        # partition nothing (and DeepSpeed refuses them without an optimizer); ZeRO-3 still
        # shards its weights.
        if cfg.zero_stage < 3:
            config["zero_optimization"] = {"stage": 0, "reduce_bucket_size": bucket, "allgather_bucket_size": bucket}
        return config
    config["managed_gradient_accumulation"] = False
    config["gradient_clipping"] = cfg.grad_clip
    if cfg.bf16:
        # Accumulate micro-batch gradients in fp32: bf16 sums lose low bits.
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    if cfg.warmup_steps > 0:
        config["scheduler"] = {
            "type": "WarmupLR",
            "params": {
                "warmup_min_lr": 0.0,
                "warmup_max_lr": lr,
                "warmup_num_steps": cfg.warmup_steps,
                "warmup_type": "linear",
            },
        }
    return config


def optimizer_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on matrices only (not on norms, biases or the value head's bias)."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _as_engine_module(model: nn.Module) -> nn.Module:
    """Causal LMs run as a :class:`LogprobModel` (forward = token log-probs); others as they are."""
    if isinstance(model, LogprobModel) or not hasattr(model, "get_output_embeddings"):
        return model
    return LogprobModel(model) if model.get_output_embeddings() is not None else model


def make_engine(model: nn.Module, cfg: TrainConfig, lr: float) -> deepspeed.DeepSpeedEngine:
    """Wrap a trainable model (actor or critic) in a DeepSpeed engine with torch AdamW.

    A causal LM becomes a :class:`LogprobModel`: ``engine(input_ids,
    attention_mask, temperature, return_entropy, chunk_tokens)`` returns
    ``(logprobs, entropy)`` (or call :func:`token_logprobs` on the engine). A
    :class:`ValueModel` engine returns values. Use per mini-batch:
    ``engine.backward(weighted_loss)`` for each micro-batch, then one
    ``engine.step()``. Always run forwards through the engine (never
    ``engine.module``): DeepSpeed's accumulation bookkeeping lives there.
    ``cfg.pack``: the LM's attention takes packed rows too (see
    :func:`~agent_r1.training.logprobs.use_packed_attention`).
    """
    _, world = init_distributed()
    model = _as_engine_module(model)
    if cfg.pack and isinstance(model, LogprobModel):  # the actor's updates run packed (update.update_actor)
        use_packed_attention(model.lm)
    # fused: one pass over the flat fp32 partition; the per-tensor loop makes two temporaries
    # of the model's size (the sqrt and its scaling), 1 GB at the step's memory peak for 135M
    optimizer = torch.optim.AdamW(
        optimizer_groups(model, cfg.weight_decay), lr=lr, betas=(0.9, 0.999), eps=1e-8, fused=True
    )
    select_accelerator()  # before deepspeed's first import: it picks its accelerator then
    import deepspeed

    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config(cfg, lr, world_size=world, model=model))
    return engine


def make_reference(model: nn.Module, cfg: TrainConfig) -> deepspeed.DeepSpeedEngine:
    """The frozen reference policy: an engine without optimizer, in eval mode.

    With ZeRO-3 its weights are sharded across ranks like the actor's and
    gathered layer by layer in the forward; with ZeRO-2 each rank holds a full
    (bf16 when ``cfg.bf16``) copy. Call it under ``torch.no_grad()``.
    """
    _, world = init_distributed()
    model = _as_engine_module(model)
    model.requires_grad_(False)
    select_accelerator()  # before deepspeed's first import: it picks its accelerator then
    import deepspeed

    engine, *_ = deepspeed.initialize(model=model, config=ds_config(cfg, 0.0, world_size=world, train=False, model=model))
    engine.eval()
    return engine


def unwrap(model: nn.Module) -> nn.Module:
    """The user-level model inside an engine: the Hugging Face causal LM or the ValueModel.

    It shares its parameters with the engine (under ZeRO-3 they are shards:
    gather them before using the module outside the engine).
    """
    inner = unwrap_engine(model)
    return inner.lm if isinstance(inner, LogprobModel) else inner
