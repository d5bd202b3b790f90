"""Trajectories -> samples: the only place where the flat and the step-level representations differ.

A *sample* is one row the update trains on: its ids, the positions its policy
loss reads, where the critic reads and learns values, and the engine's
log-probs of its tokens. How its advantages are assigned (credit) travels with
it, because that is the other thing the representations do differently:

* **flat** (``algorithm.representation: flat``): one sample per trajectory, the
  whole multi-turn sequence; token-level credit (GAE and friends over the
  agent's tokens, :func:`~agent_r1.algorithms.compute_advantages`); the critic
  values every token and learns on the policy-loss positions.
* **step** (``algorithm.representation: step``, the step-level MDP): one sample
  per turn, the context shown at that turn then the turn's action; step-level
  credit (the estimators over a step table, one value per step read at the
  step's last prompt token, :func:`~agent_r1.algorithms.step_advantages.compute_step_advantages`),
  each step's advantage broadcast onto its action tokens.

Everything after this module (scoring, the actor and critic updates) is one
code path for both: :func:`agent_r1.training.update.rl_update`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from agent_r1.algorithms import compute_advantages, loss_mask
from agent_r1.algorithms.masking import spread_to_observations
from agent_r1.algorithms.step_advantages import compute_step_advantages, step_table
from agent_r1.rollout.steps import StepBatch, broadcast_to_actions, episode_step_matrix, steps_from_trajectories
from agent_r1.rollout.trajectory import TrajectoryBatch


@dataclass(frozen=True)
class EstimatorSettings:
    """The advantage estimator and its knobs (params.yaml's ``algorithm`` group)."""

    name: str
    gamma: float = 1.0
    lam: float = 1.0
    advantage_mask: bool = True  # advantages aligned to the agent's tokens (the paper's advantage mask)
    process_rewards: bool = True  # process rewards inside the advantages
    norm_by_std: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)  # a plugin estimator's own settings


class Credit(Protocol):
    """How a representation turns its samples' rewards (and the critic's values) into advantages."""

    def advantages(
        self, values: torch.Tensor | None, est: EstimatorSettings
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(advantages, returns)``, both ``[N, L]`` over the samples' tokens (returns None: no target)."""
        ...


@dataclass
class TokenCredit:
    """Flat credit: the estimator runs over each trajectory's tokens."""

    token_rewards: torch.Tensor  # [B, T]
    action_mask: torch.Tensor  # [B, T]
    response_mask: torch.Tensor  # [B, T]: every token after the prompt
    group_id: torch.Tensor  # [B]
    loss_masked: bool  # algorithm.loss_mask: off (an ablation) trains observation tokens too

    def advantages(
        self, values: torch.Tensor | None, est: EstimatorSettings
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """With the loss mask off and the advantage mask on, observation tokens take their turn's
        advantage (:func:`~agent_r1.algorithms.masking.spread_to_observations`): the ablation trains them."""
        advantages, returns = compute_advantages(
            est.name, token_rewards=self.token_rewards, action_mask=self.action_mask, group_id=self.group_id,
            values=values, gamma=est.gamma, lam=est.lam, align=est.advantage_mask, response_mask=self.response_mask,
            process_rewards=est.process_rewards, norm_by_std=est.norm_by_std, options=est.options,
        )
        if est.advantage_mask and not self.loss_masked:
            advantages = spread_to_observations(advantages, self.action_mask, self.response_mask)
        return advantages, returns


@dataclass
class StepCredit:
    """Step-level credit: the estimator runs over a step table ``[episodes, steps]``; values (when a
    critic gives them) are each step's value at its last prompt token."""

    steps: StepBatch
    value_mask: torch.Tensor  # [N, L]: 1 at each step's last prompt token

    def advantages(
        self, values: torch.Tensor | None, est: EstimatorSettings
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        steps = self.steps
        step_rewards, step_mask, group = episode_step_matrix(steps)
        table = None if values is None else step_table(values.sum(-1), steps.episode, steps.turn, steps.n_episodes)[0]
        advantages, returns = compute_step_advantages(
            est.name, step_rewards=step_rewards, step_mask=step_mask, group_id=group, values=table, gamma=est.gamma,
            lam=est.lam, process_rewards=est.process_rewards, norm_by_std=est.norm_by_std, options=est.options,
        )
        step_returns = None if values is None else returns[steps.episode, steps.turn][:, None] * self.value_mask
        return broadcast_to_actions(steps, advantages), step_returns


@dataclass
class Samples:
    """What the update consumes, one row per sample, ``[N, L]`` right-padded tensors.

    ``value_mask``: where the critic reads the values credit uses and learns
    them; None (flat) means values are read at every token and learnt on
    ``loss_mask``. ``rows_per_episode`` keeps the mini-batch schedule the same
    in optimizer steps whatever the representation (``mini_batch_size`` counts
    episodes).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor  # float: the tokens the policy loss (and KL, entropy) reads
    action_mask: torch.Tensor  # float: the tokens the policy sampled
    rollout_logprobs: torch.Tensor  # the engine's log-probs of the sampled tokens, 0 elsewhere
    credit: Credit
    value_mask: torch.Tensor | None = None
    rows_per_episode: float = 1.0

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def token_lists(self) -> list[list[int]]:
        """Each sample's real tokens (what prefix sharing compares)."""
        return [ids[: int(n)].tolist() for ids, n in zip(self.input_ids, self.attention_mask.sum(-1))]

    @property
    def critic_mask(self) -> torch.Tensor:
        """The positions the critic's value loss is on."""
        return self.loss_mask if self.value_mask is None else self.value_mask


def flat_samples(batch: TrajectoryBatch, loss_masked: bool = True) -> Samples:
    """One sample per trajectory; the policy loss on the agent's tokens (``loss_masked``, the paper's
    loss mask) or on every response token (the ablation)."""
    response = batch.response_mask()
    mask = loss_mask(batch.action_mask, batch.attention_mask, batch.prompt_length, loss_masked).float()
    credit = TokenCredit(batch.token_rewards, batch.action_mask, response, batch.group_id, loss_masked)
    return Samples(batch.input_ids, batch.attention_mask, mask, batch.action_mask.float(), batch.rollout_logprobs, credit)


def value_positions(steps: StepBatch) -> torch.Tensor:
    """``[N, L]`` long: 1 at each step's last prompt token, where the critic reads V(state the step acts from)."""
    mask = torch.zeros_like(steps.attention_mask)
    return mask.scatter_(1, (steps.prompt_length - 1)[:, None], 1)


def step_samples(batch: TrajectoryBatch) -> Samples:
    """One sample per turn: the context shown at that turn (:func:`~agent_r1.rollout.steps.steps_from_trajectories`)
    then the turn's action, the loss on the action."""
    steps = steps_from_trajectories(batch)
    value_mask = value_positions(steps)
    actions = steps.action_mask.float()
    return Samples(
        steps.input_ids, steps.attention_mask, actions, actions, steps.rollout_logprobs,
        StepCredit(steps, value_mask), value_mask.float(), len(steps) / max(len(batch), 1),
    )


def make_samples(batch: TrajectoryBatch, representation: str, loss_masked: bool = True) -> Samples:
    """``algorithm.representation``'s samples of the rollout ``batch``."""
    if representation == "flat":
        return flat_samples(batch, loss_masked)
    if representation == "step":
        return step_samples(batch)
    raise ValueError(f"algorithm.representation: unknown {representation!r} (flat | step)")
