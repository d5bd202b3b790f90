"""Resumable checkpoints of several engines, and Hugging Face exports.

Layout under ``root``::

    actor/step12/...       one DeepSpeed checkpoint per engine and tag
    critic/step12/...
    rng/step12/rank0.pt    each rank's RNG states (python, numpy, torch)
    latest.json            {"step": 12, "tag": "step12", "engines": [...], "fingerprint": ...}

``latest.json`` is written atomically, and only after every engine (on every
rank) has finished saving and every file of the checkpoint has been fsync'ed,
so a run killed (or a machine losing power) in the middle of a save resumes
from the previous complete checkpoint. The last ``keep`` tags are kept; any of
them can be resumed (:func:`published_steps`, :func:`load_checkpoint`).
"""

from __future__ import annotations

import json
import logging
import random
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from agent_r1.accelerator import select_accelerator
from agent_r1.io import atomic_dir, atomic_path, fsync_path, fsync_tree, write_json
from agent_r1.training.distributed import barrier, is_rank0
from agent_r1.training.engines import bucket_elements, unwrap
from agent_r1.training.logprobs import unwrap_engine

log = logging.getLogger(__name__)

LATEST = "latest.json"
RNG = "rng"
_TAG = re.compile(r"^step(\d+)$")


def _tag(step: int) -> str:
    return f"step{step}"


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def rng_state() -> dict[str, Any]:
    """This process's global RNG states: whatever draws from them (dropout) continues identically."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    engines: dict[str, Any],
    root: str | Path,
    step: int,
    extra: dict[str, Any] | None = None,
    keep: int = 2,
    fingerprint: Any = None,
) -> None:
    """Save every engine under ``root/<name>/step<step>``; then publish ``latest.json``.

    Collective: every rank must call it. ``extra`` (JSON-able or torch-picklable:
    data position, metrics) is stored with each engine and returned by
    :func:`load_checkpoint`; each rank's RNG states are stored too and restored
    on load. ``fingerprint`` identifies the run's settings in ``latest.json``,
    so a caller can refuse to resume a run with other params.
    """
    root, tag = Path(root), _tag(step)
    client_state = {"agent_r1": dict(extra or {}), "step": step}
    for name, engine in engines.items():
        engine.save_checkpoint(str(root / name), tag=tag, client_state=client_state, save_latest=False)
    with atomic_path(root / RNG / tag / f"rank{_rank()}.pt") as tmp:
        torch.save(rng_state(), tmp)
    for name in (*engines, RNG):  # this rank's files reach the disk before anything points at them
        fsync_tree(root / name / tag)
        fsync_path(root / name)
    fsync_path(root)
    barrier()  # every rank's shards are on disk before the checkpoint is published
    if is_rank0():
        latest = {"step": step, "tag": tag, "engines": sorted(engines), "fingerprint": fingerprint}
        write_json(root / LATEST, latest)
        _prune(root, [*engines, RNG], step, keep)
    barrier()
    log.info("checkpoint %s saved to %s", tag, root)


def _tags(folder: Path) -> dict[int, Path]:
    if not folder.is_dir():
        return {}
    return {int(m.group(1)): p for p in folder.iterdir() if p.is_dir() and (m := _TAG.match(p.name))}


def _prune(root: Path, names: list[str], latest_step: int, keep: int) -> None:
    """Delete all tags but the ``keep`` newest at or below ``latest_step``.

    Tags above it are leftovers of a save that was killed before it was
    published; the resumed run rewrites them.
    """
    for name in names:
        tags = _tags(root / name)
        kept = sorted((s for s in tags if s <= latest_step), reverse=True)[:keep]
        for step, path in tags.items():
            if step not in kept:
                shutil.rmtree(path, ignore_errors=True)


def published_steps(root: str | Path) -> list[int]:
    """Steps of the complete checkpoints under ``root``, oldest first: at or below
    ``latest.json``'s step (above it: a save killed before it was published),
    with a folder for every engine it names."""
    root = Path(root)
    latest = read_latest(root)
    if latest is None:
        return []
    per_engine = [set(_tags(root / name)) for name in latest.get("engines", [])]
    common = set.intersection(*per_engine) if per_engine else set()
    return sorted(s for s in common if s <= int(latest["step"]))


def load_checkpoint(engines: dict[str, Any], root: str | Path, step: int) -> dict[str, Any]:
    """Restore every engine (weights, optimizer, LR schedule) and this rank's RNG states
    from the checkpoint at ``step``; return its ``extra``. Collective: every rank must call it."""
    root, tag = Path(root), _tag(step)
    latest = read_latest(root)
    if latest is None or step not in published_steps(root):
        raise FileNotFoundError(f"{root}: no complete checkpoint at step {step} (kept: {published_steps(root)})")
    missing = [n for n in engines if n not in latest.get("engines", [])]
    if missing:
        raise ValueError(f"{root / LATEST}: checkpoint {tag} has no engine(s) {missing}")
    extra: dict[str, Any] = {}
    for name, engine in engines.items():
        path, client_state = engine.load_checkpoint(
            str(root / name), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True
        )
        if path is None:
            raise FileNotFoundError(f"{root / name / tag}: DeepSpeed found no checkpoint for {name!r}")
        extra = client_state.get("agent_r1", {})
    rng = root / RNG / tag / f"rank{_rank()}.pt"
    if rng.is_file():  # absent in checkpoints written before RNG states were saved
        set_rng_state(torch.load(rng, weights_only=False))
    log.info("resumed from the checkpoint at step %d in %s", step, root)
    return extra


def load_latest(engines: dict[str, Any], root: str | Path) -> tuple[int, dict[str, Any]] | None:
    """Restore every engine from ``root/latest.json``'s checkpoint (see :func:`load_checkpoint`).

    Returns ``(step, extra)``, or ``None`` when there is no checkpoint yet.
    Collective: every rank must call it.
    """
    latest = read_latest(root)
    if latest is None:
        return None
    step = int(latest["step"])
    return step, load_checkpoint(engines, root, step)


def full_state_dict(engine: Any) -> dict[str, torch.Tensor] | None:
    """The complete weights, with the Hugging Face model's key names, on rank 0.

    Collective under ZeRO-3 (partitions are gathered layer by layer); other
    ranks get ``None``. Tensors are detached CPU copies in the engine's dtype
    (e.g. to load into a rollout engine).
    """
    module = unwrap_engine(engine)
    if engine.zero_optimization_partition_weights():
        state = engine._zero3_consolidated_16bit_state_dict()
    else:
        state = module.state_dict() if is_rank0() else None
    if state is None:
        return None
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}


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
    """Consecutive runs of ``tensors`` of at most ``max_elements`` elements (a larger tensor alone)."""
    buckets: list[list[NamedTensor]] = []
    size = 0
    for entry in tensors:
        n = _full_numel(entry[1])
        if not buckets or size + n > max_elements:
            buckets.append([])
            size = 0
        buckets[-1].append(entry)
        size += n
    return buckets


def gathered_weight_buckets(engine: Any, max_elements: int | None = None) -> Iterator[dict[str, torch.Tensor]]:
    """The engine's weights with the Hugging Face model's key names, a bucket at a time, whole on every rank.

    Collective under ZeRO-3, every rank must iterate to the end: each bucket is
    one ``deepspeed.zero.GatheredParameters`` (an all-gather of the bucket's
    shards) after which every rank holds the full tensors, so nothing goes
    through rank 0 or is broadcast. A bucket's tensors are the gathered
    parameters themselves, re-partitioned when the next bucket is asked for:
    copy what you keep. Peak extra memory is one bucket: ``max_elements``
    (default :func:`~agent_r1.training.engines.bucket_elements` of the model,
    the size of ZeRO's own buckets); a larger tensor comes alone. Persistent
    buffers are not partitioned and come as they are (as in the consolidated
    state dict). Without ZeRO-3 the buckets are the module's own tensors.
    """
    select_accelerator()  # before deepspeed's first import: it picks its accelerator then
    import deepspeed

    tensors = _distinct_tensors(unwrap(engine))
    if max_elements is None:
        sizes = [_full_numel(t) for _, t in tensors]
        max_elements = bucket_elements(sum(sizes), max(sizes, default=0))
    for bucket in _buckets(tensors, max_elements):
        params = [t for _, t in bucket if hasattr(t, "ds_id")]
        with deepspeed.zero.GatheredParameters(params):  # no modifier_rank: read only, nothing broadcast on exit
            yield {name: t.detach() for names, t in bucket for name in names}


def export_hf(engine: Any, tokenizer: Any, out_dir: str | Path) -> None:
    """Write the engine's model as a plain transformers (safetensors) folder, atomically.

    Collective (ZeRO-3 gathers); only rank 0 writes. A causal LM gives a folder
    ``AutoModelForCausalLM.from_pretrained`` loads; a ValueModel its own format
    (``ValueModel.from_pretrained``).
    """
    state = full_state_dict(engine)
    if state is not None:
        model = unwrap(engine)
        if hasattr(model, "save_pretrained"):
            with atomic_dir(out_dir) as tmp:
                model.save_pretrained(tmp, state_dict=state, safe_serialization=True)
                if tokenizer is not None:
                    tokenizer.save_pretrained(tmp)
        else:  # ValueModel: backbone folder + head; a tokenizer is not needed to score
            model.save(out_dir, state_dict=state)
    barrier()


def read_latest(root: str | Path) -> dict[str, Any] | None:
    """``latest.json`` of a checkpoint root, or ``None`` (no checkpoint yet)."""
    path = Path(root) / LATEST
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as exc:  # cannot happen with atomic writes; say where if it does
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
