"""Step-level credit assignment: the advantage estimators over a *step table* instead of a token sequence.

In the step-level MDP (Agent-R1 v0.1.0) an episode is a list of steps; a step
is one policy turn: the context the policy saw, the response it produced, and
the step's reward r_t = the sum of that turn's token rewards (its process
reward, plus the outcome on the episode's last step). Credit is assigned over
step indices t = 0..n_e-1, then each step's advantage is put on every action
token of that step.

The step table, per batch of E episodes padded to S steps:

* ``step_rewards`` [E, S] float, r_{e,t}; 0 on padded steps (an error otherwise);
* ``step_mask``    [E, S], 1 on the episode's real steps 0..n_e-1, 0 after;
* ``values``       [E, S], V_{e,t} = the critic's value of the state step t acts
  from: read at the step row's last prompt token (the state ending there, before
  the step's first response token), as Agent-R1 v0.1.0 does;
* ``group_id``     [E], which prompt an episode came from (GRPO/RLOO groups).

A step table is a trajectory table whose every real position is an action:
:func:`compute_step_advantages` runs any estimator of the registry (its flat
form in :mod:`agent_r1.algorithms.advantages`, or a plugin) over the step table
with the advantage mask = ``step_mask``, so the flat formulas read with "token"
replaced by "step" and no logic is repeated. What changes against flat training
on token sequences:

* gamma and lam discount per step, not per action token (a turn of 40 tokens
  ages a reward by one step, not by 40);
* whitening (GAE, REINFORCE++, REINFORCE++-baseline) weights each step once,
  not once per token, so long turns do not dominate the batch statistics
  (Agent-R1 v0.1.0 whitens at step level for this reason);
* the GRPO scale averages each episode's squared centred returns over its
  steps, not its tokens.

With one step per episode and a flat episode of one turn, GRPO and RLOO equal
the flat ones whatever the turn's length; GAE, REINFORCE++ and
REINFORCE++-baseline equal them when the turn is one action token (longer
turns add the per-token discount and token-weighted whitening above).

The estimators over steps
-------------------------

What each built-in computes through :func:`compute_step_advantages`. Episode
i of group g (n_g episodes, n_i real steps), r_{i,t} its step rewards,
S_i = sum_t r_{i,t} its return, R_{i,t} = sum_{t' >= t} r_{i,t'} step t's
undiscounted return-to-go; whiten(x) = (x - mean x) * rsqrt(var x + 1e-8),
mean / var over every real step of the batch, each step once, unbiased
variance. Every result is 0 on padded steps; ``process_rewards=False`` first
moves every step reward of an episode onto its last step.

``gae`` / ``ppo``: V_t the value of the state step t acts from, V_{n_i} = 0::

    delta_t = r_t + gamma * V_{t+1} - V_t
    A_t     = delta_t + gamma * lam * A_{t+1}      (= sum_l (gamma lam)^l delta_{t+l})
    returns_t = A_t + V_t,   advantages_t = whiten(A)_t

``reinforce_pp`` (``gae`` with V = 0 and lam = 1)::

    G_t = r_t + gamma * G_{t+1}      (= sum_{t' >= t} gamma^(t'-t) r_{t'}; G = 0 after the last step)
    returns_t = G_t,   advantages_t = whiten(G)_t

``grpo`` (undiscounted, as the flat GRPO, which takes no gamma)::

    mean_g  = (1/n_g) sum_{j in g} S_j
    var_g   = 1/(n_g - 1) * sum_{j in g} (1/n_j) sum_{t < n_j} (R_{j,t} - mean_g)^2
    A_{i,t} = (R_{i,t} - mean_g) / (sqrt(var_g) + eps)     (norm_by_std=False: R_{i,t} - mean_g)

Step 0's return-to-go is the episode return S_i, so mean_g is the group's
expected return-to-go at the first step, and a step's score counts only the
rewards from that step on (its own process reward included; earlier rewards
it cannot change). With one step per episode R_{i,0} = S_i: the standard
outcome GRPO, equal to the flat one.

``rloo`` (no normalisation: a process reward p on step t puts step t exactly
p above step t+1)::

    A_{i,t} = R_{i,t} - (1/(n_g - 1)) * sum_{j in g, j != i} S_j

``reinforce_pp_baseline`` (K = the real steps of episodes in groups of two or
more; 0 off K)::

    B_{i,t} = R_{i,t} - (1/n_g) sum_{j in g} S_j
    A_{i,t} = (B_{i,t} - mean_K B) * rsqrt(var_K B + 1e-8)

The group estimators (``grpo``, ``rloo``, ``reinforce_pp_baseline``) return
returns = advantages, and give a group of one 0.

:func:`compute_step_advantages` passes the step table under the estimator
interface's names (:data:`agent_r1.registry.ESTIMATOR_ARGUMENTS`):
``token_rewards`` is the step rewards and ``action_mask`` the step mask, with
``align=True`` and no ``response_mask``: a step table holds no observation
positions; the advantage-mask switch is which tokens of a step's row
:func:`broadcast_to_tokens` fills.

Row layout for training on steps: every step is one row n of an [N, T] batch
(its prompt, then its response), with ``episode[n]`` and ``step[n]`` its place
in the table. :func:`step_table` builds the table from per-row numbers,
:func:`broadcast_to_tokens` puts per-step numbers back on the rows' tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from agent_r1.algorithms.advantages import compute_advantages


# ----------------------------------------------------------------- checks
def _check_steps(step_rewards: torch.Tensor, step_mask: torch.Tensor) -> None:
    """A step table's rewards and mask: the same [E, S], rewards only on real steps (worded for steps:
    the flat estimators' own check speaks of tokens)."""
    if step_rewards.dim() != 2 or step_rewards.shape != step_mask.shape:
        raise ValueError(f"step rewards {tuple(step_rewards.shape)} and step_mask {tuple(step_mask.shape)} must be the same [E, S]")
    stray = (step_rewards != 0) & (step_mask <= 0)
    if stray.any():
        e, s = (int(i) for i in stray.nonzero()[0])
        raise ValueError(f"step reward [{e}, {s}] = {float(step_rewards[e, s]):g} is on a padded step (step_mask 0)")


# ------------------------------------------------------------ by name
def compute_step_advantages(
    name: str,
    *,
    step_rewards: torch.Tensor,
    step_mask: torch.Tensor,
    group_id: torch.Tensor | None,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    process_rewards: bool = True,
    norm_by_std: bool = True,
    options: Mapping[str, Any] | None = None,
    **kw,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Any estimator of :data:`agent_r1.registry.ESTIMATORS` (``algorithm.name``, a built-in or a
    plugin) over a step table: ``(advantages, returns)`` [E, S], 0 on padded steps. ``options``
    (``algorithm.options``) reach the estimator as in :func:`~agent_r1.algorithms.advantages.compute_advantages`.

    The step table goes where the estimator interface expects the token
    tensors, with the advantage mask aligned to it (``align=True``: every real
    step is an action; there are no observation positions), so each built-in
    computes its step-level formula of the module docstring.
    """
    _check_steps(step_rewards, step_mask)
    return compute_advantages(
        name, token_rewards=step_rewards, action_mask=step_mask, group_id=group_id, values=values, gamma=gamma,
        lam=lam, align=True, response_mask=None, process_rewards=process_rewards, norm_by_std=norm_by_std,
        options=options, **kw,
    )


# ------------------------------------------------------- rows <-> step table
def _check_rows(episode: torch.Tensor, step: torch.Tensor, rows: int) -> None:
    """``episode`` and ``step``: [N] integer indices, one per step row, non-negative."""
    for name, index in (("episode", episode), ("step", step)):
        if index.dim() != 1 or index.shape[0] != rows or index.is_floating_point():
            raise ValueError(f"{name} must be an integer [N] index with N = {rows} rows, got {index.dtype} {tuple(index.shape)}")
        if index.numel() and int(index.min()) < 0:
            raise ValueError(f"{name} index {int(index.min())} is negative")


def step_table(
    row_values: torch.Tensor, episode: torch.Tensor, step: torch.Tensor, episodes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row numbers -> ``(table [E, S] float32, step_mask [E, S] long)``, E = ``episodes``, S = the most steps.

    Row n (one step: its prompt plus its response) is step ``step[n]`` of
    episode ``episode[n]``; ``row_values[n]`` goes to ``table[episode[n], step[n]]``.
    Build the step rewards from each row's token rewards summed, the values
    from the critic's value at each row's last prompt token. Every episode's
    steps must be exactly 0..n_e-1, each given once (an error naming the
    episode otherwise); an episode with no row has no real step.
    """
    if row_values.dim() != 1:
        raise ValueError(f"row_values must be [N], one number per step row, got shape {tuple(row_values.shape)}")
    _check_rows(episode, step, row_values.shape[0])
    if episode.numel() and int(episode.max()) >= episodes:
        raise ValueError(f"episode index {int(episode.max())} out of range for {episodes} episodes")
    width = int(step.max()) + 1 if step.numel() else 0
    counts = torch.bincount(episode * width + step, minlength=episodes * width).view(episodes, width)
    if (counts > 1).any():
        e, s = (int(i) for i in (counts > 1).nonzero()[0])
        raise ValueError(f"step {s} of episode {e} is given by {int(counts[e, s])} rows; one row per step")
    mask = (counts > 0).long()
    gap = mask[:, 1:] > mask[:, :-1]
    if gap.any():
        e, s = (int(i) for i in gap.nonzero()[0])
        raise ValueError(f"episode {e} has step {s + 1} but no step {s}; an episode's steps are 0..n-1")
    table = torch.zeros(episodes, width, dtype=torch.float32, device=row_values.device)
    return table.index_put_((episode, step), row_values.float()), mask


def broadcast_to_tokens(
    step_values: torch.Tensor,
    step_mask: torch.Tensor,
    episode: torch.Tensor,
    step: torch.Tensor,
    token_mask: torch.Tensor,
) -> torch.Tensor:
    """Per-step numbers [E, S] -> the step rows' tokens [N, T]: row n gets ``step_values[episode[n], step[n]]``
    on every position where ``token_mask[n]`` is 1, 0 elsewhere (float32).

    ``token_mask`` is the rows' action mask (the paper's advantage mask: the
    step's response tokens the policy generated) or, for the ``advantage_mask``
    ablation, their response mask. A row naming a padded step (``step_mask``
    0) or a place outside the table is an error, never a silent 0.
    """
    if token_mask.dim() != 2:
        raise ValueError(f"token_mask must be [N, T], one row per step, got shape {tuple(token_mask.shape)}")
    _check_rows(episode, step, token_mask.shape[0])
    if step_values.shape != step_mask.shape or step_values.dim() != 2:
        raise ValueError(f"step_values {tuple(step_values.shape)} and step_mask {tuple(step_mask.shape)} must be the same [E, S]")
    inside = (episode < step_mask.shape[0]) & (step < step_mask.shape[1])
    real = inside.clone()
    real[inside] = step_mask[episode[inside], step[inside]] > 0
    if not real.all():
        n = int((~real).nonzero()[0])
        raise ValueError(f"row {n} is step {int(step[n])} of episode {int(episode[n])}, not a real step of the {tuple(step_mask.shape)} table")
    per_row = step_values[episode, step].float()
    return torch.where(token_mask > 0, per_row[:, None], torch.zeros((), dtype=torch.float32, device=per_row.device))
