"""TrajectoryBatch: the token-exact record of a set of episodes, rollout -> trainer.

All [B, T] tensors are right-padded. Per token:

* ``input_ids`` / ``attention_mask`` -- prompt and every turn, concatenated ids;
* ``action_mask`` -- 1 where the policy generated the token (the loss mask);
* ``turn_index`` -- k for the action tokens of turn k and the observation that
  follows them, -1 for the prompt and padding;
* ``token_rewards`` -- each turn's process reward on that turn's last action
  token, plus the outcome reward on the episode's last action token;
* ``rollout_logprobs`` -- the engine's temperature-1 logprob at action tokens,
  0 elsewhere.

Per trajectory: ``group_id`` (index of the question it came from; GRPO/RLOO
groups), ``prompt_length`` and ``info`` (episode metrics). With a managed
context (``env.context``) the ids above are still the full history, and
``contexts`` holds per trajectory the ids the policy was shown at each turn
(empty: the full history, i.e. the prefix before the turn); the step
representation trains on those.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TypeVar

import torch

from agent_r1.algorithms.masking import response_mask
from agent_r1.io import atomic_path

TOKEN_FIELDS: tuple[str, ...] = (
    "input_ids",
    "attention_mask",
    "action_mask",
    "turn_index",
    "token_rewards",
    "rollout_logprobs",
)


Batch = TypeVar("Batch")


def batch_to(batch: Batch, device: str | torch.device) -> Batch:
    """A copy of a tensors-plus-lists dataclass with every tensor on ``device`` (lists shared)."""
    values = {f.name: getattr(batch, f.name) for f in fields(batch)}
    return type(batch)(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in values.items()})


def save_batch(batch: object, path: str | Path) -> None:
    """torch.save of the dataclass as a plain dict (atomic), loadable with ``weights_only=True``."""
    data = {f.name: getattr(batch, f.name) for f in fields(batch)}
    with atomic_path(path) as tmp:
        torch.save(data, tmp)


def load_batch(cls: type[Batch], path: str | Path) -> Batch:
    """What :func:`save_batch` wrote, checked to hold exactly ``cls``'s fields."""
    data = torch.load(path, map_location="cpu", weights_only=True)
    expected = {f.name for f in fields(cls)}
    if set(data) != expected:
        raise ValueError(f"{path}: not a {cls.__name__} (keys {sorted(data)}, expected {sorted(expected)})")
    return cls(**data)


def pad_rows(rows: list[list], pad: int | float, dtype: torch.dtype) -> torch.Tensor:
    """``[len(rows), longest]`` tensor of ``rows`` right-padded with ``pad``."""
    width = max((len(r) for r in rows), default=0)
    return torch.tensor([list(r) + [pad] * (width - len(r)) for r in rows], dtype=dtype).reshape(len(rows), width)


@dataclass
class TrajectoryBatch:
    input_ids: torch.Tensor  # [B, T] long
    attention_mask: torch.Tensor  # [B, T] long
    action_mask: torch.Tensor  # [B, T] long
    turn_index: torch.Tensor  # [B, T] long
    token_rewards: torch.Tensor  # [B, T] float32
    rollout_logprobs: torch.Tensor  # [B, T] float32
    group_id: torch.Tensor  # [B] long
    prompt_length: torch.Tensor  # [B] long
    info: list[dict] = field(default_factory=list)
    contexts: list[list[list[int]]] = field(default_factory=list)  # [] or one list per trajectory

    def __post_init__(self) -> None:
        shape = self.input_ids.shape
        if len(self.contexts) not in (0, shape[0]):
            raise ValueError(f"TrajectoryBatch.contexts has {len(self.contexts)} entries for {shape[0]} trajectories")
        for name in TOKEN_FIELDS:
            if getattr(self, name).shape != shape:
                raise ValueError(f"TrajectoryBatch.{name} has shape {tuple(getattr(self, name).shape)}, expected {tuple(shape)}")
        for name in ("group_id", "prompt_length"):
            if getattr(self, name).shape != shape[:1]:
                raise ValueError(f"TrajectoryBatch.{name} has shape {tuple(getattr(self, name).shape)}, expected ({shape[0]},)")
        if len(self.info) != shape[0]:
            raise ValueError(f"TrajectoryBatch.info has {len(self.info)} entries for {shape[0]} trajectories")

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: str | torch.device) -> "TrajectoryBatch":
        return batch_to(self, device)

    def response_mask(self) -> torch.Tensor:
        """1 on every real token after the prompt (actions and observations), 0 on prompt and padding."""
        return response_mask(self.attention_mask, self.prompt_length)

    def save(self, path: str | Path) -> None:
        save_batch(self, path)

    @classmethod
    def load(cls, path: str | Path) -> "TrajectoryBatch":
        return load_batch(cls, path)

    @classmethod
    def from_sequences(cls, seqs: list[dict], pad_id: int) -> "TrajectoryBatch":
        """Right-pad per-trajectory lists into tensors.

        Each item holds the TOKEN_FIELDS except ``attention_mask`` as equal-length
        lists, plus ``group_id``, ``prompt_length`` and ``info`` (and optionally
        ``contexts``; the batch keeps none when no item has any).
        """
        if not seqs:
            raise ValueError("no trajectories to batch")
        pads = {"input_ids": pad_id, "action_mask": 0, "turn_index": -1, "token_rewards": 0.0, "rollout_logprobs": 0.0}
        dtypes = {"token_rewards": torch.float32, "rollout_logprobs": torch.float32}
        out: dict[str, torch.Tensor] = {}
        for name, pad in pads.items():
            for j, s in enumerate(seqs):
                if len(s[name]) != len(s["input_ids"]):
                    raise ValueError(f"trajectory {j}: {name} has {len(s[name])} entries, input_ids {len(s['input_ids'])}")
            out[name] = pad_rows([s[name] for s in seqs], pad, dtypes.get(name, torch.long))
        out["attention_mask"] = pad_rows([[1] * len(s["input_ids"]) for s in seqs], 0, torch.long)
        return cls(
            **out,
            group_id=torch.tensor([s["group_id"] for s in seqs], dtype=torch.long),
            prompt_length=torch.tensor([s["prompt_length"] for s in seqs], dtype=torch.long),
            info=[s["info"] for s in seqs],
            contexts=[list(s.get("contexts", [])) for s in seqs] if any(s.get("contexts") for s in seqs) else [],
        )
