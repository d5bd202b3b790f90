"""LoRA adapters through PEFT: the actor trains low-rank updates of its linear layers, the base stays frozen.

``train.lora`` (null: full fine-tuning). The adapters are injected into the
Hugging Face model itself (PEFT's ``get_peft_model``, then its inner model), so
the trainer, packing, ZeRO and checkpoints see the same module tree as before,
with each adapted ``Linear`` holding ``base_layer`` plus ``lora_A`` / ``lora_B``.
Everything that leaves the trainer is the *merged* model, ``W + (alpha / r) B A``,
under the base model's own key names: the weights synced to the rollout engine
(ours or vLLM) and the exported Hugging Face folder. With a KL term the
reference policy is the same model with its adapters switched off
(:func:`adapters_disabled`): the base, without a second copy of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

BASE = ".base_layer."
A, B = ".lora_A.default.weight", ".lora_B.default.weight"


def add_lora(lm: nn.Module, rank: int, alpha: float, target_modules: list[str] | str) -> nn.Module:
    """``lm`` with LoRA adapters (B = 0, so the model is unchanged until trained) on ``target_modules``
    (module names, or ``"all-linear"``: every linear layer but the output head); only they train."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=target_modules, lora_dropout=0.0, bias="none")
    return get_peft_model(lm, config).base_model.model


def tuner_layers(model: nn.Module) -> list[nn.Module]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


def has_lora(model: nn.Module) -> bool:
    return bool(tuner_layers(model))


def lora_scaling(model: nn.Module) -> float:
    """``alpha / r`` of the model's adapters (one adapter, one setting for every layer)."""
    scales = {float(s) for m in tuner_layers(model) for s in m.scaling.values()}
    if len(scales) != 1:
        raise ValueError(f"expected one LoRA scaling for every layer, got {sorted(scales)}")
    return scales.pop()


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """The base model inside this block: every adapter layer skips its adapter."""
    layers = tuner_layers(model)
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def merged_weights(state: dict[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """A LoRA model's state dict as the base model's: ``X.weight = X.base_layer.weight + scaling * B @ A``.

    Keys without adapters pass through (the same tensors). A layer's three
    tensors must all be in ``state`` (weight-sync buckets keep them together).
    """
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key.endswith((A, B)):
            continue
        if BASE not in key:
            out[key] = value
            continue
        module, leaf = key.split(BASE)
        if leaf == "weight":
            lora_a, lora_b = state[module + A], state[module + B]
            value = value + scaling * (lora_b.to(value.dtype) @ lora_a.to(value.dtype))
        out[f"{module}.{leaf}"] = value
    return out


def is_adapter_key(name: str) -> bool:
    """A LoRA tensor's state-dict name (it must travel with its base layer's weight)."""
    return ".lora_" in name


def trainable_share(model: Any) -> float:
    """Trainable parameters / all parameters (a ZeRO-3 shard counts its full size)."""
    total = trainable = 0
    for p in model.parameters():
        n = getattr(p, "ds_numel", p.numel())
        total += n
        trainable += n if p.requires_grad else 0
    return trainable / max(total, 1)
