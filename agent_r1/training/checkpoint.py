"""Resumable checkpoints of several DeepSpeed models, Hugging Face exports, and which
checkpoint a run may resume from (its fingerprint).

Layout under ``root``::

    actor/step12/...       one DeepSpeed checkpoint per model and tag
    critic/step12/...
    rng/step12/rank0.pt    each rank's RNG states (python, numpy, torch)
    latest.json            {"step": 12, "tag": "step12", "models": [...], "fingerprint": ...}

``latest.json`` is written atomically, and only after every model (on every
rank) has finished saving and every file of the checkpoint has been fsync'ed,
so a run killed (or a machine losing power) in the middle of a save resumes
from the previous complete checkpoint. The last ``keep`` tags are kept; any of
them can be resumed (:func:`published_steps`, :func:`load_checkpoint`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agent_r1.config import Params, plugin_refs
from agent_r1.io import atomic_dir, atomic_path, fsync_path, fsync_tree, hash_files, hash_tree, write_json
from agent_r1.registry import ref_source
from agent_r1.training.distributed import barrier, is_rank0
from agent_r1.training.lora import has_lora, lora_scaling, merged_weights
from agent_r1.training.models import unwrap
from agent_r1.training.logprobs import inner_module

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
    models: dict[str, Any],
    root: str | Path,
    step: int,
    extra: dict[str, Any] | None = None,
    keep: int = 2,
    fingerprint: Any = None,
) -> None:
    """Save every model under ``root/<name>/step<step>``; then publish ``latest.json``.

    Collective: every rank must call it. ``extra`` (JSON-able or torch-picklable:
    data position, metrics) is stored with each model and returned by
    :func:`load_checkpoint`; each rank's RNG states are stored too and restored
    on load. ``fingerprint`` identifies the run's settings in ``latest.json``,
    so a caller can refuse to resume a run with other params.
    """
    root, tag = Path(root), _tag(step)
    client_state = {"agent_r1": dict(extra or {}), "step": step}
    for name, model in models.items():
        model.save_checkpoint(str(root / name), tag=tag, client_state=client_state, save_latest=False)
    with atomic_path(root / RNG / tag / f"rank{_rank()}.pt") as tmp:
        torch.save(rng_state(), tmp)
    for name in (*models, RNG):  # this rank's files reach the disk before anything points at them
        fsync_tree(root / name / tag)
        fsync_path(root / name)
    fsync_path(root)
    barrier()  # every rank's shards are on disk before the checkpoint is published
    if is_rank0():
        latest = {"step": step, "tag": tag, "models": sorted(models), "fingerprint": fingerprint}
        write_json(root / LATEST, latest)
        _prune(root, [*models, RNG], step, keep)
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
    with a folder for every model it names."""
    root = Path(root)
    latest = read_latest(root)
    if latest is None:
        return []
    per_model = [set(_tags(root / name)) for name in latest.get("models", [])]
    common = set.intersection(*per_model) if per_model else set()
    return sorted(s for s in common if s <= int(latest["step"]))


def load_checkpoint(models: dict[str, Any], root: str | Path, step: int) -> dict[str, Any]:
    """Restore every model (weights, optimizer, LR schedule) and this rank's RNG states
    from the checkpoint at ``step``; return its ``extra``. Collective: every rank must call it."""
    root, tag = Path(root), _tag(step)
    latest = read_latest(root)
    if latest is None or step not in published_steps(root):
        raise FileNotFoundError(f"{root}: no complete checkpoint at step {step} (kept: {published_steps(root)})")
    missing = [n for n in models if n not in latest.get("models", [])]
    if missing:
        raise ValueError(f"{root / LATEST}: checkpoint {tag} has no model(s) {missing}")
    extra: dict[str, Any] = {}
    for name, model in models.items():
        path, client_state = model.load_checkpoint(
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


def load_latest(models: dict[str, Any], root: str | Path) -> tuple[int, dict[str, Any]] | None:
    """Restore every model from ``root/latest.json``'s checkpoint (see :func:`load_checkpoint`).

    Returns ``(step, extra)``, or ``None`` when there is no checkpoint yet.
    Collective: every rank must call it.
    """
    latest = read_latest(root)
    if latest is None:
        return None
    step = int(latest["step"])
    return step, load_checkpoint(models, root, step)


def full_state_dict(model: Any) -> dict[str, torch.Tensor] | None:
    """The complete weights, with the Hugging Face model's key names, on rank 0.

    Collective under ZeRO-3 (partitions are gathered layer by layer); other
    ranks get ``None``. Tensors are detached CPU copies in the model's dtype
    (e.g. to load into an inference engine).
    """
    module = inner_module(model)
    if model.zero_optimization_partition_weights():
        state = model._zero3_consolidated_16bit_state_dict()
    else:
        state = module.state_dict() if is_rank0() else None
    if state is None:
        return None
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}


def export_hf(model: Any, tokenizer: Any, out_dir: str | Path) -> None:
    """Write a trained model as a plain transformers (safetensors) folder, atomically.

    Collective (ZeRO-3 gathers); only rank 0 writes. A causal LM gives a folder
    ``AutoModelForCausalLM.from_pretrained`` loads; a ValueModel its own format
    (``ValueModel.from_pretrained``).
    """
    state = full_state_dict(model)
    if state is not None:
        inner = unwrap(model)
        if has_lora(inner):  # the merged model: loads anywhere, no PEFT needed
            state = merged_weights(state, lora_scaling(inner))
        if hasattr(inner, "save_pretrained"):
            with atomic_dir(out_dir) as tmp:
                inner.save_pretrained(tmp, state_dict=state, safe_serialization=True)
                if tokenizer is not None:
                    tokenizer.save_pretrained(tmp)
        else:  # ValueModel: backbone folder + head; a tokenizer is not needed to score
            inner.save(out_dir, state_dict=state)
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


# ------------------------------------------------------------------ what a resumed run must share
# The agent_r1 sources a run's weights and metrics depend on (params cover the settings).
TRAINING_CODE: tuple[str, ...] = (
    "training", "algorithms", "env", "rollout", "retrieval", "evaluation/summary.py", "config.py", "registry.py",
    "accelerator.py", "data/answers.py",
)
FINGERPRINT_PARTS: dict[str, str] = {
    "params": "params",
    "init_model": "init model (its files' content)",
    "code": "training code (with the plugins')",
    "data": "data (questions or index)",
}


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.ndarray, np.generic)):
        return obj.tolist()  # str() of a long array elides its middle
    return str(obj)


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=_json_default).encode()).hexdigest()


PACKAGE = Path(__file__).resolve().parents[1]  # agent_r1/


def code_hash(package: Path = PACKAGE) -> str:
    """Content hash of the :data:`TRAINING_CODE` sources under ``package``."""
    files: list[tuple[str, Path]] = []
    for entry in TRAINING_CODE:
        found = sorted((package / entry).rglob("*.py")) if (package / entry).is_dir() else [package / entry]
        files += [(f.relative_to(package).as_posix(), f) for f in found]
    return hash_files(files)


def plugin_code_hash(ref: str) -> str | None:
    """Content hash of the Python sources of the user package (or module) a plugin ``ref`` lives in."""
    source = ref_source(ref)
    if source is None:
        return None
    files = sorted(source.rglob("*.py")) if source.is_dir() else [source]
    return hash_files([(f.relative_to(source.parent).as_posix(), f) for f in files])


def index_identity(index_path: str | Path | None) -> str:
    """An index folder's content hash; a server's URL (what it serves is its own business);
    "none" for an env that searches none."""
    if index_path is None:
        return "none"
    return hash_tree(index_path) if Path(index_path).is_dir() else str(index_path)


def run_fingerprint(
    params: Params, init_model: Path, index_path: str | Path | None, train_questions: list[dict],
    eval_questions: list[dict],
) -> dict[str, str]:
    """What a checkpoint must share with this run to be resumed, part by part (see
    :data:`FINGERPRINT_PARTS`): everything but the step count, the logging
    cadence (so raising ``train.steps`` continues a run) and where the ranks run."""
    where = {"hostfile", "master_addr", "master_port", "launcher"}
    cfg = params.model_dump(exclude={"experiments": True, "schedule": True, "train": {"steps", "save_every", "eval_every", *where}})
    code = code_hash()
    if refs := plugin_refs(params):  # the user's tools, rewards, estimator... are training code too
        code = _digest([code, sorted({plugin_code_hash(ref) or "" for ref in refs.values()})])
    return {
        "params": _digest(cfg),
        "init_model": hash_tree(init_model),
        "code": code,
        "data": _digest([index_identity(index_path), train_questions, eval_questions]),
    }


def changed_parts(stored: Any, current: dict[str, str]) -> list[str]:
    """Which parts of the fingerprint differ (all, for a checkpoint of an older format)."""
    if not isinstance(stored, dict):
        return ["fingerprint (written by an older version of agent_r1)"]
    return [FINGERPRINT_PARTS[k] for k in current if stored.get(k) != current[k]]


def resume_step(checkpoint_dir: Path, fingerprint: dict[str, str], steps: int) -> int | None:
    """The kept checkpoint this run resumes from: the newest at or below ``steps`` of the
    same run; ``None`` (start afresh) otherwise, saying why."""
    latest = read_latest(checkpoint_dir)
    if latest is None:
        return None
    changed = changed_parts(latest.get("fingerprint"), fingerprint)
    if changed:
        log.warning("%s holds a run with other %s: starting afresh", checkpoint_dir, ", ".join(changed))
        return None
    kept = published_steps(checkpoint_dir)
    usable = [s for s in kept if s <= steps]
    if not usable:
        log.warning("%s: train.steps is %d, below every kept checkpoint (steps %s): training afresh",
                    checkpoint_dir, steps, kept)
        return None
    if usable[-1] < int(latest["step"]):
        log.info("train.steps is %d, below the checkpoint's %d: resuming from the kept one at step %d",
                 steps, latest["step"], usable[-1])
    return usable[-1]


# ------------------------------------------------------------------ helpers
def evaluates_at(step: int, cfg: Any) -> bool:
    """Whether 0-based ``step`` ends with a held-out evaluation (and the last step always does)."""
    return (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps


def scheduled(history: list[dict[str, float]], cfg: Any) -> list[dict[str, float]]:
    """A resumed history as this run's schedule has it: evaluations only where it evaluates
    (a checkpoint of a run with more steps may hold one where this run has none)."""
    return [m if evaluates_at(i, cfg) else {k: v for k, v in m.items() if not k.startswith("eval/")}
            for i, m in enumerate(history)]
