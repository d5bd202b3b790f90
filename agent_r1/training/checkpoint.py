"""Resumable checkpoints of several engines, and Hugging Face exports.

Layout under ``root``::

    actor/step12/...       one DeepSpeed checkpoint per engine and tag
    critic/step12/...
    latest.json            {"step": 12, "tag": "step12", "engines": [...]}

``latest.json`` is written atomically and only after every engine (on every
rank) has finished saving, so a run killed in the middle of a save resumes
from the previous complete checkpoint. The last ``keep`` tags are kept.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from agent_r1.io import atomic_dir, write_json
from agent_r1.training.distributed import barrier, is_rank0
from agent_r1.training.engines import unwrap
from agent_r1.training.logprobs import unwrap_engine

log = logging.getLogger(__name__)

LATEST = "latest.json"
_TAG = re.compile(r"^step(\d+)$")


def _tag(step: int) -> str:
    return f"step{step}"


def save_checkpoint(
    engines: dict[str, Any],
    root: str | Path,
    step: int,
    extra: dict[str, Any] | None = None,
    keep: int = 2,
    fingerprint: str | None = None,
) -> None:
    """Save every engine under ``root/<name>/step<step>``; then publish ``latest.json``.

    Collective: every rank must call it. ``extra`` (JSON-able or torch-picklable:
    data position, RNG states, metrics) is stored with each engine and returned
    by :func:`load_latest`. ``fingerprint`` identifies the run's settings in
    ``latest.json``, so a caller can refuse to resume a run with other params.
    """
    root, tag = Path(root), _tag(step)
    client_state = {"agent_r1": dict(extra or {}), "step": step}
    for name, engine in engines.items():
        engine.save_checkpoint(str(root / name), tag=tag, client_state=client_state, save_latest=False)
    barrier()  # every rank's shards are on disk before the checkpoint is published
    if is_rank0():
        latest = {"step": step, "tag": tag, "engines": sorted(engines), "fingerprint": fingerprint}
        write_json(root / LATEST, latest)
        _prune(root, list(engines), step, keep)
    barrier()
    log.info("checkpoint %s saved to %s", tag, root)


def _prune(root: Path, names: list[str], latest_step: int, keep: int) -> None:
    """Delete all tags but the ``keep`` newest at or below ``latest_step``.

    Tags above it are leftovers of a save that was killed before it was
    published; the resumed run rewrites them.
    """
    for name in names:
        tags = {int(m.group(1)): p for p in (root / name).iterdir() if p.is_dir() and (m := _TAG.match(p.name))}
        kept = sorted((s for s in tags if s <= latest_step), reverse=True)[:keep]
        for step, path in tags.items():
            if step not in kept:
                shutil.rmtree(path, ignore_errors=True)


def load_latest(engines: dict[str, Any], root: str | Path) -> tuple[int, dict[str, Any]] | None:
    """Restore every engine (weights, optimizer, LR schedule) from ``root/latest.json``.

    Returns ``(step, extra)``, or ``None`` when there is no checkpoint yet.
    Collective: every rank must call it.
    """
    root = Path(root)
    latest = read_latest(root)
    if latest is None:
        return None
    missing = [n for n in engines if n not in latest.get("engines", [])]
    if missing:
        raise ValueError(f"{root / LATEST}: checkpoint {latest['tag']} has no engine(s) {missing}")
    extra: dict[str, Any] = {}
    for name, engine in engines.items():
        path, client_state = engine.load_checkpoint(
            str(root / name), tag=latest["tag"], load_optimizer_states=True, load_lr_scheduler_states=True
        )
        if path is None:
            raise FileNotFoundError(f"{root / name / latest['tag']}: DeepSpeed found no checkpoint for {name!r}")
        extra = client_state.get("agent_r1", {})
    log.info("resumed from %s (step %d)", root / latest["tag"], latest["step"])
    return int(latest["step"]), extra


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
