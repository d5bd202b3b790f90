"""StepBatch: episodes as the step-level MDP sees them, one row per step (assistant turn).

A step is what the policy saw and did at one decision: the prompt ids exactly
as shown to it, then the response (action) ids it generated. All [N, L]
tensors are right-padded, one row per step:

* ``input_ids`` / ``attention_mask`` -- the step's prompt ids then its response ids;
* ``action_mask`` -- 1 on the response tokens only (the loss mask);
* ``rollout_logprobs`` -- the engine's logprob at response tokens, 0 elsewhere.

Per row: ``step_reward`` (the sum of the step's token rewards: that turn's
process reward, plus the outcome reward on the episode's last step), ``turn``
(the step's index in its episode), ``episode`` (index of the episode in
``info``), ``group_id`` (the question it came from) and ``prompt_length``.
``info`` holds one dict per episode. Rows may come in any order; each
episode's turns are 0, 1, ..., its last, each exactly once.

With the full history as context, step k of an episode is its flat trajectory
(:class:`~agent_r1.rollout.trajectory.TrajectoryBatch`) cut at turn k: the
prompt is every token before turn k's first action token (the prompt, the
earlier actions and observations), the response is turn k's action tokens.
:func:`steps_from_trajectories` slices those ids, never re-tokenising, so a
model scores every action token identically in both representations. What
differs is the cost: step k recomputes its whole context, so a StepBatch holds
``sum_k (prompt_k + response_k)`` tokens where the flat batch holds the final
length once. With a managed context (``env.context``) step k's prompt is the
context the rollout recorded for turn k (older observations shortened), which
no flat sequence holds: that is what the step representation is for.

:func:`episode_step_matrix` lays the step rewards out as ``[E, S]`` (episode,
step) for step-level estimators; :func:`broadcast_to_actions` puts per-step
values (advantages, returns) back on each row's response tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from agent_r1.algorithms.masking import response_mask
from agent_r1.rollout.trajectory import TrajectoryBatch, batch_to, load_batch, pad_rows, save_batch

STEP_TOKEN_FIELDS: tuple[str, ...] = ("input_ids", "attention_mask", "action_mask", "rollout_logprobs")
STEP_ROW_FIELDS: tuple[str, ...] = ("step_reward", "turn", "episode", "group_id", "prompt_length")



@dataclass(frozen=True)
class Step:
    """One step as a producer records it: the ids shown, the ids generated, their logprobs, the reward."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float]
    reward: float
    turn: int
    episode: int
    group_id: int


@dataclass
class StepBatch:
    input_ids: torch.Tensor  # [N, L] long
    attention_mask: torch.Tensor  # [N, L] long
    action_mask: torch.Tensor  # [N, L] long
    rollout_logprobs: torch.Tensor  # [N, L] float32
    step_reward: torch.Tensor  # [N] float32
    turn: torch.Tensor  # [N] long
    episode: torch.Tensor  # [N] long
    group_id: torch.Tensor  # [N] long
    prompt_length: torch.Tensor  # [N] long
    info: list[dict] = field(default_factory=list)  # one per episode

    def __post_init__(self) -> None:
        shape = self.input_ids.shape
        for name in STEP_TOKEN_FIELDS:
            if getattr(self, name).shape != shape:
                raise ValueError(f"StepBatch.{name} has shape {tuple(getattr(self, name).shape)}, expected {tuple(shape)}")
        for name in STEP_ROW_FIELDS:
            if getattr(self, name).shape != shape[:1]:
                raise ValueError(f"StepBatch.{name} has shape {tuple(getattr(self, name).shape)}, expected ({shape[0]},)")
        _check_rows(self)
        _check_episodes(self)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def n_episodes(self) -> int:
        return len(self.info)

    def to(self, device: str | torch.device) -> "StepBatch":
        return batch_to(self, device)

    def save(self, path: str | Path) -> None:
        """torch.save of a plain dict (atomic), loadable with ``weights_only=True``."""
        save_batch(self, path)

    @classmethod
    def load(cls, path: str | Path) -> "StepBatch":
        return load_batch(cls, path)

    @classmethod
    def from_steps(cls, steps: list[Step], info: list[dict], pad_id: int) -> "StepBatch":
        """Right-pad ``steps`` into tensors; ``info`` has one dict per episode (``Step.episode`` indexes it)."""
        if not steps:
            raise ValueError("no steps to batch")
        for j, s in enumerate(steps):
            if len(s.response_logprobs) != len(s.response_ids):
                raise ValueError(
                    f"step {j} (episode {s.episode}, turn {s.turn}): {len(s.response_logprobs)} logprobs "
                    f"for {len(s.response_ids)} response ids"
                )
        return cls(
            input_ids=pad_rows([s.prompt_ids + s.response_ids for s in steps], pad_id, torch.long),
            attention_mask=pad_rows([[1] * (len(s.prompt_ids) + len(s.response_ids)) for s in steps], 0, torch.long),
            action_mask=pad_rows([[0] * len(s.prompt_ids) + [1] * len(s.response_ids) for s in steps], 0, torch.long),
            rollout_logprobs=pad_rows([[0.0] * len(s.prompt_ids) + list(s.response_logprobs) for s in steps], 0.0, torch.float32),
            step_reward=torch.tensor([float(s.reward) for s in steps], dtype=torch.float32),
            turn=torch.tensor([s.turn for s in steps], dtype=torch.long),
            episode=torch.tensor([s.episode for s in steps], dtype=torch.long),
            group_id=torch.tensor([s.group_id for s in steps], dtype=torch.long),
            prompt_length=torch.tensor([len(s.prompt_ids) for s in steps], dtype=torch.long),
            info=list(info),
        )


def _check_rows(b: StepBatch) -> None:
    """Each row is right-padded, its prompt then a non-empty response, and only the response is in the loss."""
    lengths = b.attention_mask.sum(-1)
    positions = torch.arange(b.attention_mask.shape[1], device=lengths.device)
    if not torch.equal(b.attention_mask.bool(), positions[None, :] < lengths[:, None]):
        raise ValueError("StepBatch.attention_mask must be 1 then 0 in every row (right padding)")
    short = ((b.prompt_length < 1) | (b.prompt_length >= lengths)).nonzero().flatten().tolist()
    if short:
        r = short[0]
        raise ValueError(
            f"StepBatch row {r} (episode {int(b.episode[r])}, turn {int(b.turn[r])}): prompt_length "
            f"{int(b.prompt_length[r])} of {int(lengths[r])} tokens; a step needs a prompt and a response"
        )
    if not torch.equal(b.action_mask.long(), response_mask(b.attention_mask, b.prompt_length)):
        raise ValueError("StepBatch.action_mask must be 1 exactly on each row's response (after prompt_length, before padding)")


def _check_episodes(b: StepBatch) -> None:
    """Every episode of ``info`` has steps 0..S-1, each once, all of one group."""
    n_ep, n = len(b.info), len(b)
    if n and (int(b.episode.min()) < 0 or int(b.episode.max()) >= n_ep):
        raise ValueError(f"StepBatch.episode must index info ({n_ep} episodes), got values {int(b.episode.min())}..{int(b.episode.max())}")
    counts = torch.bincount(b.episode, minlength=n_ep)
    if n_ep and int(counts.min()) == 0:
        raise ValueError(f"StepBatch: episode {int((counts == 0).nonzero()[0])} of info has no step")
    if n == 0:
        return
    out_of_range = ((b.turn < 0) | (b.turn >= counts[b.episode])).nonzero().flatten().tolist()
    if out_of_range:
        r = out_of_range[0]
        raise ValueError(
            f"StepBatch row {r}: turn {int(b.turn[r])} of episode {int(b.episode[r])}, which has "
            f"{int(counts[b.episode[r]])} steps (turns must be 0..steps-1)"
        )
    if len(torch.unique(b.episode * n + b.turn)) != n:  # turn < n, so the key is unique per pair
        raise ValueError("StepBatch: an (episode, turn) pair appears on more than one row")
    first = torch.zeros(n_ep, dtype=b.group_id.dtype, device=b.group_id.device).scatter_(0, b.episode, b.group_id)
    if not torch.equal(first[b.episode], b.group_id):
        raise ValueError("StepBatch.group_id differs between steps of one episode")


# ------------------------------------------------------------ flat -> steps
def turn_spans(batch: TrajectoryBatch, row: int) -> list[tuple[int, int]]:
    """``[(start, end), ...]``: turn k's action tokens are ``input_ids[row, start:end]``.

    Checks that the row is laid out as the rollout loop writes it: the prompt
    (turn_index -1, no action), then per turn k = 0, 1, ... its action tokens
    followed by its observation tokens (possibly none), all with turn_index k;
    and that rewards sit on action tokens only. Raises ValueError naming the
    trajectory and position otherwise.
    """
    n, p = int(batch.attention_mask[row].sum()), int(batch.prompt_length[row])
    turn, act = batch.turn_index[row, :n], batch.action_mask[row, :n].bool()
    where = f"trajectory {row}"
    if not 0 < p < n:
        raise ValueError(f"{where}: prompt_length {p} of {n} tokens leaves no action token")
    if bool((turn[:p] != -1).any()) or bool(act[:p].any()):
        raise ValueError(f"{where}: its prompt (first {p} tokens) must have turn_index -1 and no action token")
    t, a = turn[p:], act[p:]
    prev_t, prev_a = torch.cat([t.new_tensor([-1]), t[:-1]]), torch.cat([a.new_tensor([False]), a[:-1]])
    # same turn: never an action after its observation; next turn: starts with an action
    ok = torch.where(t == prev_t, ~(~prev_a & a), (t == prev_t + 1) & a)
    if not bool(ok.all()):
        i = int((~ok).nonzero()[0])
        raise ValueError(
            f"{where}: position {p + i} has turn_index {int(t[i])}, action_mask {int(a[i])} after turn_index "
            f"{int(prev_t[i])}: each turn k = 0, 1, ... must be its action tokens then its observation"
        )
    stray = ((batch.token_rewards[row, :n] != 0) & ~act).nonzero().flatten().tolist()
    if stray:
        raise ValueError(f"{where}: reward {float(batch.token_rewards[row, stray[0]])} on non-action position {stray[0]}")
    starts = (p + (t != prev_t).nonzero().flatten()).tolist()
    sizes = torch.bincount(t[a], minlength=len(starts)).tolist()
    return [(s, s + k) for s, k in zip(starts, sizes)]


def steps_from_trajectories(batch: TrajectoryBatch) -> StepBatch:
    """The steps of the episodes: each turn's action ids, with the context shown before them as the prompt.

    The context is the trajectory's recorded ``contexts[k]`` when its context
    was managed, else every token before the turn (the full history). Token-
    exact by construction (slices of the flat ids, or the recorded ids). Step
    reward = the sum of the turn's token rewards. ``info`` is the flat batch's,
    one per episode; padding ids are the flat batch's padding id (0 if none).
    """
    steps: list[Step] = []
    for row in range(len(batch)):
        ids, lps = batch.input_ids[row].tolist(), batch.rollout_logprobs[row].tolist()
        rewards = batch.token_rewards[row]
        spans = turn_spans(batch, row)
        shown = batch.contexts[row] if batch.contexts else []
        if shown and len(shown) != len(spans):
            raise ValueError(f"trajectory {row}: {len(shown)} recorded contexts for {len(spans)} turns")
        for k, (s, e) in enumerate(spans):
            prompt = list(shown[k]) if shown else ids[:s]
            steps.append(Step(prompt, ids[s:e], lps[s:e], float(rewards[s:e].sum()), k, row, int(batch.group_id[row])))
    padding = batch.input_ids[batch.attention_mask == 0]
    return StepBatch.from_steps(steps, batch.info, int(padding[0]) if len(padding) else 0)


# ------------------------------------------------------------ per-step values
def episode_step_matrix(steps: StepBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(step_rewards [E, S] float32, step_mask [E, S] long, group_id [E] long)``, S = the most steps of an episode.

    The layout of a flat batch with one "token" per step, which the step-level
    estimators take (:mod:`agent_r1.algorithms.step_advantages`).
    """
    from agent_r1.algorithms.step_advantages import step_table

    rewards, mask = step_table(steps.step_reward, steps.episode, steps.turn, steps.n_episodes)
    group = torch.zeros(steps.n_episodes, dtype=torch.long, device=mask.device).scatter_(0, steps.episode, steps.group_id)
    return rewards, mask, group


def broadcast_to_actions(steps: StepBatch, values: torch.Tensor) -> torch.Tensor:
    """``[N, L]`` float32: ``values[e, k]`` ([E, S], e.g. step advantages) on the response tokens of
    episode e's step k, 0 on prompts and padding; the inverse of :func:`episode_step_matrix`'s layout."""
    from agent_r1.algorithms.step_advantages import broadcast_to_tokens

    _, mask, _ = episode_step_matrix(steps)
    if values.ndim != 2 or values.shape[0] != mask.shape[0] or values.shape[1] < mask.shape[1]:
        raise ValueError(f"per-step values of shape {tuple(values.shape)}, expected [episodes, steps] = {tuple(mask.shape)}")
    return broadcast_to_tokens(values[:, : mask.shape[1]], mask, steps.episode, steps.turn, steps.action_mask)
