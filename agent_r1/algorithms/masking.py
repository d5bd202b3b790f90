"""Masks and masked statistics over [B, T] trajectory tensors.

Every tensor here covers the whole trajectory (prompt, every turn, every tool
observation, right padding). Three masks matter:

* ``action_mask`` -- 1 on tokens the policy generated. The paper's *loss mask*
  and *advantage mask* are both this mask.
* ``response_mask`` -- 1 on every real token after the prompt (actions and
  observations), 0 on prompt and padding. Used when a mask is switched off
  (the ablations "w/o loss mask", "w/o advantage mask").
* ``span_mask`` -- first action token to last action token of each row: the
  response when no attention mask is at hand.

The statistics follow verl's ``torch_functional``: masked mean, unbiased masked
variance, whitening ``(x - mean) * rsqrt(var + 1e-8)``. Unlike verl they never
raise on a mask with fewer than two tokens: the variance is then 0 and the
whitened values are 0 (nothing to compare against), so an empty batch cannot
produce a NaN.
"""

from __future__ import annotations

import torch

WHITEN_EPS = 1e-8


def response_mask(attention_mask: torch.Tensor, prompt_length: torch.Tensor | int) -> torch.Tensor:
    """1 on real (non-pad) tokens at positions >= the row's prompt length, else 0 (long)."""
    positions = torch.arange(attention_mask.shape[-1], device=attention_mask.device)
    start = torch.as_tensor(prompt_length, device=attention_mask.device).reshape(-1, 1)
    return ((positions[None, :] >= start) & (attention_mask > 0)).long()


def span_mask(action_mask: torch.Tensor) -> torch.Tensor:
    """1 from each row's first action token to its last action token (inclusive), else 0.

    The response of a trajectory that ends with the policy's last turn, when the
    attention mask is not at hand: every observation between two turns is
    inside, the prompt and right padding are outside. Rows without an action
    token are all 0.
    """
    acted = action_mask > 0
    from_first = acted.long().cumsum(-1) > 0
    to_last = acted.flip(-1).long().cumsum(-1).flip(-1) > 0
    return (from_first & to_last).long()


def loss_mask(
    action_mask: torch.Tensor,
    attention_mask: torch.Tensor,
    response_start: torch.Tensor | int,
    use_action_mask: bool,
) -> torch.Tensor:
    """Tokens the actor loss (and its KL/entropy terms) is computed on.

    ``use_action_mask`` is the paper's loss mask (``algorithm.loss_mask``): on,
    only the policy's own tokens; off, every response token (tool observations
    included; prompt and padding never).
    """
    if use_action_mask:
        return action_mask.long()
    return response_mask(attention_mask, response_start)


def advantage_mask(action_mask: torch.Tensor, align: bool, response: torch.Tensor | None = None) -> torch.Tensor:
    """Tokens that carry advantages (``algorithm.advantage_mask``).

    ``align=True`` (paper): the action tokens. ``align=False``: every response
    token -- ``response`` if given (see :func:`response_mask`), else the span
    from the first to the last action token (:func:`span_mask`).
    """
    if align:
        return action_mask.long()
    return (response if response is not None else span_mask(action_mask)).long()


def last_action_index(action_mask: torch.Tensor) -> torch.Tensor:
    """[B] position of each row's last action token (-1 for a row without one)."""
    positions = torch.arange(action_mask.shape[-1], device=action_mask.device)
    return torch.where(action_mask > 0, positions, -1).amax(-1)


def collapse_rewards(token_rewards: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """Every reward of a row moved onto its last action token (process rewards *off*).

    The episode total is kept, the per-turn timing is lost: this is how
    Agent-R1's released code fed process rewards to the estimators. A row
    whose only reward already sits at its last action token (outcome only) is
    returned unchanged, so ``process_rewards`` on and off agree there. Rows
    without an action token keep no reward (they can hold none: rewards sit on
    action tokens).
    """
    last = last_action_index(action_mask)
    total = token_rewards.sum(-1)
    out = torch.zeros_like(token_rewards)
    has = last >= 0
    out[has, last[has]] = total[has]
    return out


def returns_to_go(token_rewards: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """R_t = sum of the row's rewards at positions >= a(t), a(t) = the last action token at or before t.

    On an action token this is the plain undiscounted reward-to-go
    ``sum_{s >= t} r_s``. A token that is not an action (an observation) takes
    the value of the action token before it: an observation belongs to the
    turn that called the tool (as ``turn_index`` says), so it shares that
    turn's score. Positions before the first action token get the episode
    total. Within a turn the value is constant, since a turn's rewards sit on
    its last token.
    """
    rtg = token_rewards.flip(-1).cumsum(-1).flip(-1)
    return rtg.gather(-1, action_anchor(action_mask).clamp(min=0))


def action_anchor(action_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] position of the last action token at or before each position (-1 before the first)."""
    positions = torch.arange(action_mask.shape[-1], device=action_mask.device)
    return torch.where(action_mask > 0, positions, -1).cummax(-1).values


def spread_to_observations(advantages: torch.Tensor, action_mask: torch.Tensor, response: torch.Tensor) -> torch.Tensor:
    """Advantages on every response token: an observation token takes the advantage of the action token before it.

        A'_t = A_{a(t)} on response tokens (a(t): the last action token at or before t), 0 elsewhere

    The loss-mask ablation (``algorithm.loss_mask: false`` with the advantage
    mask on): the loss then reads observation tokens, and they are trained
    with their turn's advantage -- for an outcome-only critic-free estimator,
    the trajectory's -- instead of a 0 that would make the ablation a uniform
    rescale of the loss (which AdamW cancels). ``response``: see
    :func:`response_mask`.
    """
    anchor = action_anchor(action_mask)
    spread = advantages.gather(-1, anchor.clamp(min=0))
    return torch.where((response > 0) & (anchor >= 0), spread, torch.zeros_like(spread))


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``x`` where ``mask`` is non-zero; ``where`` (not a product) so inf/NaN off the mask cannot leak."""
    kept = torch.where(mask > 0, x, torch.zeros_like(x))
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum(x * m) / max(sum(m), 1): 0 (not NaN) for an empty mask."""
    count = (mask > 0).sum() if dim is None else (mask > 0).sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1).to(x.dtype)


def masked_var(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Unbiased (Bessel-corrected) variance over the masked entries: sum(m (x - mean)^2) / (n - 1); 0 if n < 2."""
    n = (mask > 0).sum()
    centred = x - masked_mean(x, mask)
    return masked_sum(centred.square(), mask) / (n - 1).clamp(min=1).to(x.dtype)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(x - masked mean) * rsqrt(unbiased masked var + 1e-8), 0 off the mask (as verl, but total)."""
    white = (x - masked_mean(x, mask)) * torch.rsqrt(masked_var(x, mask) + WHITEN_EPS)
    return torch.where(mask > 0, white, torch.zeros_like(white))
