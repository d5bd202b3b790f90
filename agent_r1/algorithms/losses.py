"""Losses over [B, T] token tensors: PPO policy loss, clipped value loss, KL estimators, entropy.

Each loss is an elementwise [B, T] matrix reduced by :func:`aggregate_loss` over a
mask (the paper's loss mask: the policy's own tokens). Masking uses ``where``,
never a product, so a masked-out token contributes exactly zero loss and
exactly zero gradient, whatever its (possibly garbage) logprob.
Metrics are plain floats for logging.
"""

from __future__ import annotations

import torch

from agent_r1.algorithms.masking import masked_mean, masked_sum

AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
LOG_RATIO_CLAMP = 20.0


def aggregate_loss(loss_mat: torch.Tensor, mask: torch.Tensor, agg: str = "token-mean", denominator: float | None = None) -> torch.Tensor:
    """Reduce a [B, T] loss matrix over ``mask`` to a scalar.

    * ``token-mean``: sum over masked tokens / number of masked tokens in the batch;
    * ``seq-mean-token-sum``: per-sequence masked sum, mean over sequences with >= 1 masked token;
    * ``seq-mean-token-mean``: per-sequence masked mean, mean over sequences with >= 1 masked token.

    An empty mask gives 0 (with a zero gradient), not NaN. ``denominator``
    replaces the count (tokens for token-mean, sequences otherwise): with
    gradient accumulation, pass the whole mini-batch's count so that the
    micro-batch losses add up to the mini-batch loss.
    """
    if agg == "token-mean":
        total = masked_sum(loss_mat, mask)
        count = (mask > 0).sum()
    elif agg in ("seq-mean-token-sum", "seq-mean-token-mean"):
        per_seq = masked_sum(loss_mat, mask, dim=-1) if agg == "seq-mean-token-sum" else masked_mean(loss_mat, mask, dim=-1)
        has_token = (mask > 0).any(-1)
        total = torch.where(has_token, per_seq, torch.zeros_like(per_seq)).sum()
        count = has_token.sum()
    else:
        raise ValueError(f"unknown loss aggregation {agg!r}; known: {', '.join(AGGREGATIONS)}")
    if denominator is not None:
        return total / denominator
    return total / count.clamp(min=1).to(total.dtype)


def _share(flags: torch.Tensor, mask: torch.Tensor) -> float:
    """Masked share of True entries, as a float for logging."""
    return float(masked_mean(flags.float(), mask))


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_ratio: float = 0.2,
    clip_ratio_high: float | None = None,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    denominator: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate (with optional asymmetric and dual clip), aggregated over ``mask``.

        rho_t = exp(clamp(logp_t - old_t, -20, 20))
        L1 = -A_t * rho_t,   L2 = -A_t * clamp(rho_t, 1 - clip_ratio, 1 + clip_ratio_high)
        L_t = max(L1, L2)                              (clip_ratio_high defaults to clip_ratio)
        dual clip (c = dual_clip > 1), for A_t < 0:  L_t = min(max(L1, L2), -A_t * c)

    The dual clip bounds the loss of a negative-advantage token whose ratio
    has run far above 1 (verl's ``clip_ratio_c``). Metrics: ``clipfrac`` (masked
    share with L2 > L1, the clipped branch active), ``approx_kl`` (masked mean
    of old - new logprob, clamped as above), and with a dual clip
    ``dual_clipfrac`` (masked share with A < 0 and max(L1, L2) > -A * c).
    """
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    log_ratio = (logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio, 1.0 + high)
    loss_mat = torch.maximum(unclipped, clipped)
    metrics = {
        "clipfrac": _share(clipped > unclipped, mask),
        "approx_kl": float(masked_mean(-log_ratio.detach(), mask)),
    }
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        bound = -advantages * dual_clip
        negative = advantages < 0
        metrics["dual_clipfrac"] = _share(negative & (loss_mat > bound), mask)
        loss_mat = torch.where(negative, torch.minimum(loss_mat, bound), loss_mat)
    return aggregate_loss(loss_mat, mask, agg, denominator), metrics


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    agg: str = "token-mean",
    denominator: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss: 1/2 * agg( max((v - R)^2, (clamp(v, old - clip, old + clip) - R)^2) ).

    The clipped branch keeps the critic from moving a value more than ``clip``
    away from the one used to compute the advantages. Metric ``vf_clipfrac``:
    masked share of tokens where the clipped branch is the larger.
    """
    clipped_values = torch.maximum(torch.minimum(values, old_values + clip), old_values - clip)
    plain = (values - returns).square()
    clipped = (clipped_values - returns).square()
    loss = 0.5 * aggregate_loss(torch.maximum(plain, clipped), mask, agg, denominator)
    return loss, {"vf_clipfrac": _share(clipped > plain, mask)}


KL_KINDS = ("k1", "k2", "k3", "abs")
_KL_ALIASES = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}  # verl's names


def kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    """Elementwise estimate of KL(policy || reference) from sampled-token logprobs.

    * ``k1``:  logp - ref                       (unbiased, high variance, can be negative)
    * ``k2``:  1/2 (logp - ref)^2
    * ``k3``:  x = clamp(ref - logp, -20, 20);  clamp(exp(x) - x - 1, -10, 10)   (unbiased, >= 0, low variance)
    * ``abs``: |logp - ref|
    (verl's names ``kl``, ``mse``, ``low_var_kl`` are accepted for k1, k2, k3.)
    """
    kind = _KL_ALIASES.get(kind, kind)
    diff = logprobs - ref_logprobs
    if kind == "k1":
        return diff
    if kind == "k2":
        return 0.5 * diff.square()
    if kind == "k3":
        x = (-diff).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return (torch.exp(x) - x - 1.0).clamp(-10.0, 10.0)
    if kind == "abs":
        return diff.abs()
    raise ValueError(f"unknown KL kind {kind!r}; known: {', '.join(KL_KINDS)}")


def entropy_from_logits(logits: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """Entropy of softmax(logits) over the last (vocabulary) axis: logsumexp(z) - sum softmax(z) * z.

    [..., T, V] -> [..., T]. Computed ``chunk_size`` rows of the flattened
    [N, V] at a time (in float32) so that the softmax temporaries never hold
    more than ``chunk_size * V`` floats at once; differentiable.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    parts = []
    for chunk in flat.split(chunk_size):
        z = chunk.float()
        parts.append(torch.logsumexp(z, -1) - (torch.softmax(z, -1) * z).sum(-1))
    out = torch.cat(parts) if parts else flat.new_zeros(0, dtype=torch.float32)
    return out.reshape(logits.shape[:-1])
