"""The trainable models: the policy (a causal LM) and the critic (a value model).

The critic is the policy's backbone with a scalar head, initialised from the
same checkpoint (as in PPO for LLMs): it starts with useful features and a
head near zero, so its first values do not swamp the returns.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModel, AutoModelForCausalLM, PreTrainedModel

from agent_r1.io import atomic_dir, write_json

HEAD_FILE = "value_head.safetensors"
VALUE_META = "value_model.json"


def _dtype(dtype: str | torch.dtype) -> torch.dtype:
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


def _checkpointing(model: PreTrainedModel, enabled: bool) -> None:
    """Recompute activations in the backward (needed to fit on a CPU);
    the KV cache is useless in training and conflicts with checkpointing."""
    model.config.use_cache = False
    if enabled:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def load_policy(path: str | Path, dtype: str | torch.dtype = "float32", gradient_checkpointing: bool = True) -> PreTrainedModel:
    """A causal LM from a transformers folder, ready to train (no KV cache)."""
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=_dtype(dtype))
    _checkpointing(model, gradient_checkpointing)
    return model


class ValueModel(nn.Module):
    """Backbone of a causal LM + ``Linear(hidden, 1)``: one value per token."""

    def __init__(self, backbone: PreTrainedModel, head_std: float = 1e-3):
        super().__init__()
        self.backbone = backbone
        self.config = backbone.config
        hidden = backbone.config.hidden_size
        self.head = nn.Linear(hidden, 1, dtype=backbone.dtype)
        nn.init.normal_(self.head.weight, std=head_std)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Values ``[B, T]`` in float32; ``values[:, t]`` is the value of the state ending at token t."""
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        return self.head(hidden).squeeze(-1).float()

    @classmethod
    def from_pretrained(
        cls, path: str | Path, dtype: str | torch.dtype = "float32", gradient_checkpointing: bool = True
    ) -> "ValueModel":
        """From a causal-LM folder (fresh head) or a folder written by :meth:`save` (trained head)."""
        path = Path(path)
        backbone = AutoModel.from_pretrained(str(path), dtype=_dtype(dtype))
        _checkpointing(backbone, gradient_checkpointing)
        model = cls(backbone)
        if (path / HEAD_FILE).exists():
            state = load_file(str(path / HEAD_FILE))
            model.head.load_state_dict({k: v.to(model.head.weight.dtype) for k, v in state.items()})
        return model

    load = from_pretrained

    def save(self, out_dir: str | Path, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """Write the backbone as a transformers folder plus the head, atomically.

        ``state_dict`` (keys ``backbone.*`` and ``head.*``) overrides the
        module's own tensors: pass the gathered weights of a ZeRO-3 engine.
        """
        state = state_dict if state_dict is not None else self.state_dict()
        backbone_sd = {k.removeprefix("backbone."): v for k, v in state.items() if k.startswith("backbone.")}
        head_sd = {k.removeprefix("head."): v.contiguous() for k, v in state.items() if k.startswith("head.")}
        with atomic_dir(out_dir) as tmp:
            self.backbone.save_pretrained(tmp, state_dict=backbone_sd, safe_serialization=True)
            save_file(head_sd, str(tmp / HEAD_FILE))
            write_json(tmp / VALUE_META, {"kind": "value_model", "hidden_size": self.config.hidden_size})

