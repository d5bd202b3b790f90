"""Trainer weights -> the rollout's inference engine, in memory, as tensors (nothing is pickled).

ZeRO-3 (collective): bucket by bucket, each all-gathered on every rank and
loaded inside one ``weight_sync`` of the inference engine: a rank holds one
bucket beyond its shards, never the whole model, and nothing funnels through
rank 0. ZeRO-1/2 keep the full weights in the module, updated in place by each
optimizer step: an inference engine in the same dtype samples with those very
tensors (``share_weights``) instead of holding a second copy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch
from torch import nn

from agent_r1.accelerator import select_accelerator
from agent_r1.training.buckets import bucket_elements
from agent_r1.training.lora import has_lora, is_adapter_key, lora_scaling, merged_weights
from agent_r1.training.models import unwrap


def sync_rollout_weights(actor: Any, inference: Any, bucket: int | None = None) -> None:
    """The actor's weights into the ``inference`` engine: shared (ZeRO-1/2, same dtype), or loaded in
    buckets of at most ``bucket`` elements (default: the size of ZeRO's own buckets). Collective.
    With LoRA adapters the engine gets the merged weights (:func:`~agent_r1.training.lora.merged_weights`)."""
    as_base = _as_base_model(unwrap(actor))
    if actor.zero_optimization_partition_weights():
        with inference.weight_sync():
            for weights in gathered_weight_buckets(actor, bucket):
                inference.update_weights(as_base(weights))
        return
    state = as_base({k: v.detach() for k, v in unwrap(actor).state_dict().items()})  # ZeRO-1/2: the full weights
    if not inference.share_weights(state):  # re-pointed at every sync: follows a buffer DeepSpeed replaced
        inference.update_weights(state)


def _as_base_model(lm: nn.Module) -> Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    """The state dict under the base model's names: LoRA merged in, or as it is."""
    if not has_lora(lm):
        return lambda state: state
    return partial(merged_weights, scaling=lora_scaling(lm))


# One distinct tensor of a state dict and every name it has there (tied weights: several).
NamedTensor = tuple[list[str], torch.Tensor]


def _distinct_tensors(model: nn.Module) -> list[NamedTensor]:
    """The model's ``state_dict`` entries (parameters and persistent buffers) in module order,
    one per tensor: a tied weight comes once, with all its names."""
    tensors: dict[int, NamedTensor] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        tensors.setdefault(id(tensor), ([], tensor))[0].append(name)
    return list(tensors.values())


def _full_numel(tensor: torch.Tensor) -> int:
    return getattr(tensor, "ds_numel", tensor.numel())  # a ZeRO-3 parameter's numel() is its shard's


def _buckets(tensors: list[NamedTensor], max_elements: int) -> list[list[NamedTensor]]:
    """Consecutive runs of ``tensors`` of at most ``max_elements`` elements (a larger tensor alone);
    LoRA tensors stay in their base layer's run, so that each run can be merged on its own."""
    buckets: list[list[NamedTensor]] = []
    size = 0
    for entry in tensors:
        n = _full_numel(entry[1])
        if not buckets or (size + n > max_elements and not is_adapter_key(entry[0][0])):
            buckets.append([])
            size = 0
        buckets[-1].append(entry)
        size += n
    return buckets


def gathered_weight_buckets(model: Any, max_elements: int | None = None) -> Iterator[dict[str, torch.Tensor]]:
    """A DeepSpeed-wrapped model's weights with the Hugging Face model's key names, a bucket at a time, whole on every rank.

    Collective under ZeRO-3, every rank must iterate to the end: each bucket is
    one ``deepspeed.zero.GatheredParameters`` (an all-gather of the bucket's
    shards) after which every rank holds the full tensors, so nothing goes
    through rank 0 or is broadcast. A bucket's tensors are the gathered
    parameters themselves, re-partitioned when the next bucket is asked for:
    copy what you keep. Peak extra memory is one bucket: ``max_elements``
    (default :func:`~agent_r1.training.models.bucket_elements` of the model,
    the size of ZeRO's own buckets); a larger tensor comes alone. Persistent
    buffers are not partitioned and come as they are (as in the consolidated
    state dict). Without ZeRO-3 the buckets are the module's own tensors.
    """
    select_accelerator()  # before deepspeed's first import: it picks its accelerator then
    import deepspeed

    tensors = _distinct_tensors(unwrap(model))
    if max_elements is None:
        sizes = [_full_numel(t) for _, t in tensors]
        max_elements = bucket_elements(sum(sizes), max(sizes, default=0))
    for bucket in _buckets(tensors, max_elements):
        params = [t for _, t in bucket if hasattr(t, "ds_id")]
        with deepspeed.zero.GatheredParameters(params):  # no modifier_rank: read only, nothing broadcast on exit
            yield {name: t.detach() for names, t in bucket for name in names}
