"""Advantage estimators over multi-turn trajectories: GAE (PPO), GRPO, RLOO, REINFORCE++, REINFORCE++-baseline.

Every estimator is a pure function of [B, T] tensors that cover the whole
trajectory (prompt + every turn + every tool observation + right padding) and
returns ``(advantages, returns)``, both [B, T] float32, 0 off the advantage mask.

Shared conventions (the paper's three points):

* ``token_rewards`` holds the outcome reward on the episode's last action token
  and each turn's process reward on that turn's last action token, so rewards
  only ever sit on action tokens (checked: a reward elsewhere is an error).
* Advantage mask (``align``): ``align=True`` gives advantages to the action
  tokens only, and the recursive estimators (GAE, REINFORCE++) step from one
  action token to the next, skipping the observation tokens in between as if
  the policy's turns were contiguous. ``align=False`` (the ablation) gives them
  to every response token (``response_mask``; default: first to last action
  token, see :func:`masking.span_mask`), and the recursions step over
  observation tokens too.
* Process rewards in the advantages (``process_rewards=True``): each token's
  advantage reflects the rewards from its turn on, not only the episode total.
  ``process_rewards=False`` first moves every reward of a row onto its last
  action token (:func:`masking.collapse_rewards`, what Agent-R1's released
  code effectively did). When a row's only reward is at its last action token
  (outcome only) the two settings are identical, and every estimator below is
  then exactly its standard outcome-reward definition.

Group estimators use ``group_id`` [B] (which prompt a sample came from). A group
of one sample has no baseline to compare against: all its advantages are 0
(verl instead uses mean 0 and std 1 there, i.e. the raw score, which is a
biased, unnormalised signal; we prefer no signal).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Callable

import torch

from agent_r1.algorithms.masking import (
    advantage_mask,
    collapse_rewards,
    masked_mean,
    masked_whiten,
    returns_to_go,
)
from agent_r1.registry import ESTIMATORS

AdvantageFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


# ----------------------------------------------------------------- helpers
def _prepare(
    token_rewards: torch.Tensor,
    action_mask: torch.Tensor,
    align: bool,
    response_mask: torch.Tensor | None,
    process_rewards: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate the inputs; return (float32 rewards, process rewards on or collapsed) and the advantage mask."""
    if token_rewards.shape != action_mask.shape or token_rewards.dim() != 2:
        raise ValueError(f"token_rewards {tuple(token_rewards.shape)} and action_mask {tuple(action_mask.shape)} must be the same [B, T]")
    stray = (token_rewards != 0) & (action_mask <= 0)
    if stray.any():
        b, t = (int(i) for i in stray.nonzero()[0])
        raise ValueError(f"token_rewards[{b}, {t}] = {float(token_rewards[b, t])} sits on a non-action token; rewards belong on action tokens")
    rewards = token_rewards.float()
    if not process_rewards:
        rewards = collapse_rewards(rewards, action_mask)
    mask = advantage_mask(action_mask, align, response_mask)
    if mask.shape != action_mask.shape:
        raise ValueError(f"response_mask {tuple(mask.shape)} does not match action_mask {tuple(action_mask.shape)}")
    uncovered = (action_mask > 0) & (mask <= 0)
    if uncovered.any():
        b, t = (int(i) for i in uncovered.nonzero()[0])
        raise ValueError(f"response_mask[{b}, {t}] is 0 on an action token; the response must cover every action token")
    return rewards, mask


def _compact(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the positions where ``mask`` is 1 in order, packed to the left.

    Returns ``order`` [B, W] (W = the longest row's count; a shorter row is
    filled with some of its unmasked positions, each position at most once)
    and ``valid`` [B, W] (True on the packed masked positions).
    """
    width = mask.shape[-1]
    positions = torch.arange(width, device=mask.device)
    key = torch.where(mask > 0, positions, positions + width)
    count = (mask > 0).sum(-1)
    longest = int(count.max()) if count.numel() else 0
    order = key.argsort(-1)[:, :longest]
    valid = torch.arange(longest, device=mask.device)[None, :] < count[:, None]
    return order, valid


def _masked_gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    """Raw (unwhitened) GAE run over the masked positions of each row only, 0 elsewhere.

    For masked position t with next masked position t' (V(t') = 0 after the
    row's last masked position):
        delta_t = r_t + gamma * V(t') - V(t),    A_t = delta_t + gamma * lam * A_{t'}.
    The masked positions are gathered compactly per row, so the loop runs over
    the longest row's count with [B]-wide tensor ops (as verl's loop over T).
    """
    order, valid = _compact(mask)
    zero = torch.zeros((), dtype=torch.float32, device=rewards.device)
    r = torch.where(valid, rewards.gather(1, order).float(), zero)
    v = torch.where(valid, values.gather(1, order).float(), zero)
    packed = torch.zeros_like(r)
    running = torch.zeros(r.shape[0], dtype=torch.float32, device=r.device)
    next_value = torch.zeros_like(running)
    for j in reversed(range(r.shape[1])):
        delta = r[:, j] + gamma * next_value - v[:, j]
        running = delta + gamma * lam * running
        packed[:, j] = running
        next_value = v[:, j]
    out = torch.zeros(rewards.shape, dtype=torch.float32, device=rewards.device)
    return out.scatter_(1, order, torch.where(valid, packed, zero))


def _groups(group_id: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(index of each sample's group in 0..G-1, size of each sample's group), both [B]."""
    if group_id.dim() != 1:
        raise ValueError(f"group_id must be [B], got shape {tuple(group_id.shape)}")
    _, inverse, counts = torch.unique(group_id, return_inverse=True, return_counts=True)
    return inverse, counts[inverse]


def _group_sum(x: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """[B] -> [B]: the sum of ``x`` over each sample's group."""
    sums = torch.zeros(int(inverse.max()) + 1 if inverse.numel() else 0, dtype=x.dtype, device=x.device)
    return sums.index_add_(0, inverse, x)[inverse]


def _group_mean_total(rewards: torch.Tensor, group_id: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(episode totals S_i, group mean of S, group size n, group index), all [B]."""
    total = rewards.sum(-1)
    inverse, size = _groups(group_id)
    if size.shape[0] != rewards.shape[0]:
        raise ValueError(f"group_id has {size.shape[0]} entries for {rewards.shape[0]} trajectories")
    return total, _group_sum(total, inverse) / size, size, inverse


def _keep(mask: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
    """The advantage mask minus every sample of a group of one (bool [B, T])."""
    return (mask > 0) & (size >= 2)[:, None]


# -------------------------------------------------------------- estimators
@torch.no_grad()
def gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    action_mask: torch.Tensor,
    gamma: float,
    lam: float,
    align: bool = True,
    *,
    response_mask: torch.Tensor | None = None,
    process_rewards: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE for PPO, aligned to the policy's tokens.

    Let M be the advantage mask (``align=True``: action tokens; ``align=False``:
    response tokens, observations included with their own values and zero
    rewards). For t in M, t' = the next position in M after t, and V(t') = 0
    after the row's last position in M:

        delta_t = r_t + gamma * V(t') - V(t)
        A_t     = delta_t + gamma * lam * A_{t'}
        returns_t    = A_t + V(t)                         on M, 0 elsewhere
        advantages_t = (A_t - mean_M A) * rsqrt(var_M A + 1e-8)   on M, 0 elsewhere

    with mean_M / var_M the masked mean and unbiased (Bessel) masked variance
    over M in the whole batch (verl's ``masked_whiten``). Returns stay raw.

    Process rewards fall out of the recursion: a reward on turn k's last token
    enters A_t only for t at or before it, so earlier turns are credited with
    it (discounted by gamma * lam per step of M) and later turns are not.
    """
    rewards, mask = _prepare(token_rewards, action_mask, align, response_mask, process_rewards)
    if values.shape != rewards.shape:
        raise ValueError(f"values {tuple(values.shape)} must match token_rewards {tuple(rewards.shape)}")
    raw = _masked_gae(rewards, values, mask, gamma, lam)
    returns = torch.where(mask > 0, raw + values.float(), torch.zeros_like(raw))
    return masked_whiten(raw, mask), returns


@torch.no_grad()
def reinforce_pp(
    token_rewards: torch.Tensor,
    action_mask: torch.Tensor,
    gamma: float,
    *,
    align: bool = True,
    response_mask: torch.Tensor | None = None,
    process_rewards: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted reward-to-go over the advantage mask, whitened over the batch.

    For t in M (the advantage mask), t' = the next position in M:

        G_t = r_t + gamma * G_{t'}            (G = 0 after the row's last position in M)
        advantages_t = (G_t - mean_M G) * rsqrt(var_M G + 1e-8)   on M, 0 elsewhere
        returns_t    = G_t                                        on M, 0 elsewhere

    With ``align=True`` the discount counts action tokens only (observations
    do not age a reward). This is GAE with V = 0 and lam = 1. Process rewards
    fall out of the recursion: turn k's tokens see the rewards of turns >= k.
    """
    rewards, mask = _prepare(token_rewards, action_mask, align, response_mask, process_rewards)
    raw = _masked_gae(rewards, torch.zeros_like(rewards), mask, gamma, 1.0)
    return masked_whiten(raw, mask), raw


@torch.no_grad()
def grpo(
    token_rewards: torch.Tensor,
    action_mask: torch.Tensor,
    group_id: torch.Tensor,
    eps: float = 1e-6,
    norm_by_std: bool = True,
    *,
    align: bool = True,
    response_mask: torch.Tensor | None = None,
    process_rewards: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: each token's reward-to-go against its group's mean episode return.

    Per sample i in group g (n_g samples), with S_i = sum_t r_{i,t} (episode
    total) and R_{i,t} = the reward-to-go of t's turn (:func:`masking.returns_to_go`;
    = sum_{s >= t} r_{i,s} on action tokens, an observation takes its turn's value):

        mean_g = (1/n_g) sum_{j in g} S_j
        var_g  = 1/(n_g - 1) * sum_{j in g} (1/L_j) sum_{t in act_j} (R_{j,t} - mean_g)^2
                 (L_j = j's number of action tokens; (S_j - mean_g)^2 if L_j = 0)
        A_{i,t} = (R_{i,t} - mean_g) / (sqrt(var_g) + eps)     (norm_by_std=False: R_{i,t} - mean_g)

    on the advantage mask, 0 elsewhere and 0 for a group of one. returns = advantages (as verl).

    Why this form: an action cannot change the rewards earned before it, so
    its score is the reward-to-go (causality, as in REINFORCE), and the
    baseline is the group's mean episode return, the expected reward-to-go at
    the episode's first action. With outcome-only rewards R_{i,t} = S_i on every
    action token and var_g is the unbiased variance of the S_j: exactly
    verl's GRPO. With a process reward p on turn 1 and none after, turn 1's
    tokens sit exactly p / (sqrt(var_g) + eps) above turn 2's. The scale is the
    spread of the scores actually used (each trajectory weighted once), not of
    the totals alone: if every sample earns the same total but the process
    rewards differ along the trajectory, dividing by the std of the totals (0)
    would blow the advantages up to ~p / eps; this scale stays O(1).
    """
    rewards, mask = _prepare(token_rewards, action_mask, align, response_mask, process_rewards)
    total, mean, size, inverse = _group_mean_total(rewards, group_id)
    centred = returns_to_go(rewards, action_mask) - mean[:, None]
    adv = centred
    if norm_by_std:
        has_action = (action_mask > 0).any(-1)
        spread = torch.where(has_action, masked_mean(centred.square(), action_mask, dim=-1), (total - mean).square())
        std = (_group_sum(spread, inverse) / (size - 1).clamp(min=1)).sqrt()
        adv = centred / (std + eps)[:, None]
    adv = torch.where(_keep(mask, size), adv, torch.zeros_like(adv))
    return adv, adv


@torch.no_grad()
def rloo(
    token_rewards: torch.Tensor,
    action_mask: torch.Tensor,
    group_id: torch.Tensor,
    *,
    align: bool = True,
    response_mask: torch.Tensor | None = None,
    process_rewards: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: each token's reward-to-go against the mean episode return of the *other* group members.

    Per sample i in group g (n_g >= 2), S_j episode totals, R_{i,t} as in :func:`grpo`:

        A_{i,t} = R_{i,t} - (1/(n_g - 1)) * sum_{j in g, j != i} S_j

    on the advantage mask, 0 elsewhere and 0 for a group of one; returns =
    advantages. With outcome-only rewards this is S_i - mean of the others
    = n/(n-1) * (S_i - mean_g), verl's RLOO. A process reward p on turn 1
    puts turn 1's tokens exactly p above turn 2's (no normalisation). The
    baseline is leave-one-out on episode totals for the same reason as in
    :func:`grpo`, and stays independent of sample i's own actions.
    """
    rewards, mask = _prepare(token_rewards, action_mask, align, response_mask, process_rewards)
    total, mean, size, _ = _group_mean_total(rewards, group_id)
    others = (mean * size - total) / (size - 1).clamp(min=1)
    adv = returns_to_go(rewards, action_mask) - others[:, None]
    adv = torch.where(_keep(mask, size), adv, torch.zeros_like(adv))
    return adv, adv


@torch.no_grad()
def reinforce_pp_baseline(
    token_rewards: torch.Tensor,
    action_mask: torch.Tensor,
    group_id: torch.Tensor,
    *,
    align: bool = True,
    response_mask: torch.Tensor | None = None,
    process_rewards: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline: reward-to-go minus the group's mean return, whitened over the batch.

    Per sample i in group g, S_j episode totals, R_{i,t} as in :func:`grpo`,
    K = the advantage mask without the samples of groups of one:

        B_{i,t} = R_{i,t} - (1/n_g) sum_{j in g} S_j
        A_{i,t} = (B_{i,t} - mean_K B) * rsqrt(var_K B + 1e-8)     on K, 0 elsewhere

    (masked mean, unbiased masked variance over K in the whole batch);
    returns = advantages (as verl). With outcome-only rewards this is verl's
    ``reinforce_plus_plus_baseline`` (except that verl keeps singletons, with
    baseline 0). A process reward p on turn 1 puts turn 1's tokens exactly
    p * rsqrt(var_K B + 1e-8) above turn 2's.
    """
    rewards, mask = _prepare(token_rewards, action_mask, align, response_mask, process_rewards)
    _, mean, size, _ = _group_mean_total(rewards, group_id)
    centred = returns_to_go(rewards, action_mask) - mean[:, None]
    adv = masked_whiten(centred, _keep(mask, size))
    return adv, adv


# ------------------------------------------------------ by name (agent_r1.registry.ESTIMATORS)
def compute_advantages(
    name: str,
    *,
    token_rewards: torch.Tensor,
    action_mask: torch.Tensor,
    group_id: torch.Tensor | None,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    align: bool = True,
    response_mask: torch.Tensor | None = None,
    process_rewards: bool = True,
    norm_by_std: bool = True,
    options: Mapping[str, Any] | None = None,
    **kw,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One call for every estimator, a built-in or a plugin (``algorithm.name``, resolved by
    :data:`agent_r1.registry.ESTIMATORS`): passes each the arguments it takes and drops the rest.

    ``align`` is ``algorithm.advantage_mask``; ``response_mask`` the response
    tokens used when it is off. ``options`` is ``algorithm.options``: an estimator
    that declares ``Options`` gets them validated, as its ``options`` argument; one
    without takes none (a ValueError if some are given). The arguments offered are
    :data:`agent_r1.registry.ESTIMATOR_ARGUMENTS`; extra keywords (``eps``) go
    to the estimator unchanged, so a keyword it does not take is a TypeError naming it.
    """
    if (problem := ESTIMATORS.problem(name)) is not None:
        raise ValueError(problem)
    fn: AdvantageFn = ESTIMATORS.load(name)
    offered = dict(
        token_rewards=token_rewards, action_mask=action_mask, group_id=group_id, values=values, gamma=gamma,
        lam=lam, align=align, response_mask=response_mask, process_rewards=process_rewards, norm_by_std=norm_by_std,
        options=ESTIMATORS.options(name, options),
    )
    params = inspect.signature(fn).parameters
    args = {k: v for k, v in offered.items() if k in params}
    for k, v in args.items():
        if v is None and params[k].default is inspect.Parameter.empty:
            raise ValueError(f"advantage estimator {name!r} needs {k} (got None)")
    return fn(**args, **kw)
