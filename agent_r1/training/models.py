"""The trained models: the policy (a causal LM), the critic (a value model), and their DeepSpeed wrapping.

The critic is the policy's backbone with a scalar head, initialised from the
same checkpoint (as in PPO for LLMs): it starts with useful features and a
head near zero, so its first values do not swamp the returns.

DeepSpeed wraps the actor and the critic (:func:`make_trainable`) and the frozen
reference (:func:`make_frozen`). (DeepSpeed calls its wrapper an "engine"; in this
package *engine* means the inference backend of the rollout, so the wrapped
models are called by their role: actor, critic, reference.)

Gradient accumulation is ours, not DeepSpeed's: micro-batches come from a
token budget, so their number changes from one optimizer step to the next.
The config therefore sets ``gradient_accumulation_steps=1`` (so
``model.backward`` never divides the loss) and
``managed_gradient_accumulation=false`` (so ``model.backward`` only
accumulates gradients, and ``model.step()`` is the one accumulation boundary:
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
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModel, AutoModelForCausalLM, PreTrainedModel

from agent_r1.accelerator import select_accelerator
from agent_r1.config import TrainConfig
from agent_r1.io import atomic_dir, write_json
from agent_r1.training.buckets import DEFAULT_PREFETCH_BUCKET, bucket_elements
from agent_r1.training.distributed import init_distributed
from agent_r1.training.grad_norm import use_correctly_rounded_grad_norm
from agent_r1.training.logprobs import LogprobModel, inner_module, use_packed_attention
from agent_r1.training.packing import PackedLayout

if TYPE_CHECKING:
    import deepspeed

log = logging.getLogger(__name__)

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

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, layout: PackedLayout | None = None
    ) -> torch.Tensor:
        """Values ``[B, T]`` in float32; ``values[:, t]`` is the value of the state ending at token t.
        ``layout``: ``input_ids`` is one packed row laid out by it (see :func:`~agent_r1.training.logprobs.token_values`)."""
        extra = {}
        if layout is not None:
            extra = {"position_ids": layout.position_ids(input_ids.device), "packed_layout": layout}
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=None if extra else attention_mask, use_cache=False, **extra
        ).last_hidden_state
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


# ------------------------------------------------------------------ DeepSpeed
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


def _as_trainable_module(model: nn.Module) -> nn.Module:
    """Causal LMs run as a :class:`LogprobModel` (forward = token log-probs); others as they are."""
    if isinstance(model, LogprobModel) or not hasattr(model, "get_output_embeddings"):
        return model
    return LogprobModel(model) if model.get_output_embeddings() is not None else model


def _packed_attention(model: nn.Module) -> None:
    """Let the transformer inside an actor or critic run packed rows too (padded ones run as before)."""
    if isinstance(model, LogprobModel):
        use_packed_attention(model.lm)
    elif isinstance(model, ValueModel):
        use_packed_attention(model.backbone)


def make_trainable(model: nn.Module, cfg: TrainConfig, lr: float) -> deepspeed.DeepSpeedEngine:
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
    model = _as_trainable_module(model)
    if cfg.pack:  # the updates run packed (update.update_actor, update.update_critic)
        _packed_attention(model)
    # fused: one pass over the flat fp32 partition; the per-tensor loop makes two temporaries
    # of the model's size (the sqrt and its scaling), 1 GB at the step's memory peak for 135M
    optimizer = torch.optim.AdamW(
        optimizer_groups(model, cfg.weight_decay), lr=lr, betas=(0.9, 0.999), eps=1e-8, fused=True
    )
    select_accelerator()  # before deepspeed's first import: it picks its accelerator then
    import deepspeed

    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config(cfg, lr, world_size=world, model=model))
    use_correctly_rounded_grad_norm(engine)  # the clip's scale, the same on every CPU
    return engine


def make_frozen(model: nn.Module, cfg: TrainConfig) -> deepspeed.DeepSpeedEngine:
    """The frozen reference policy: an engine without optimizer, in eval mode.

    With ZeRO-3 its weights are sharded across ranks like the actor's and
    gathered layer by layer in the forward; with ZeRO-2 each rank holds a full
    (bf16 when ``cfg.bf16``) copy. Call it under ``torch.no_grad()``.
    """
    _, world = init_distributed()
    model = _as_trainable_module(model)
    model.requires_grad_(False)
    if cfg.pack:  # its scoring runs packed (update.score)
        _packed_attention(model)
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
    inner = inner_module(model)
    return inner.lm if isinstance(inner, LogprobModel) else inner
