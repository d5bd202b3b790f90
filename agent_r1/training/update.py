"""The RL update, one function for both representations: score the samples, assign credit,
update the actor (and the critic).

    samples -> score: old / reference log-probs, the critic's values (no gradients)
            -> credit: advantages and returns (the representation's, by the estimator's name)
            -> actor: PPO-clipped policy loss (+ KL to the reference, - entropy), masked
            -> critic: clipped value loss on its positions

Each mini-batch is one optimizer step; its micro-batches' losses are pre-scaled
by the mini-batch's global count of loss tokens, so the accumulated gradient is
exactly that of the mini-batch's token mean (whatever the micro-batching and the
number of ranks). Everything comes in as explicit arguments: the models, the
samples, and two small settings objects built once from params.yaml.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from agent_r1.algorithms import kl, policy_loss, value_loss
from agent_r1.algorithms.losses import aggregate_loss
from agent_r1.training.batching import global_denominator, minibatches, padding_share, select_rows, shared_token_share
from agent_r1.training.logprobs import (
    batched_token_logprobs, batched_values, inner_module, token_logprobs, token_values,
)
from agent_r1.training.lora import adapters_disabled
from agent_r1.training.samples import EstimatorSettings, Samples


@dataclass
class Models:
    """The trained models: the actor, the frozen reference (``kl_coef > 0``) and the critic (PPO).

    ``reference_is_base``: the actor carries LoRA adapters and the reference is the actor without
    them (``reference`` is then None)."""

    actor: Any
    reference: Any | None = None
    critic: Any | None = None
    reference_is_base: bool = False

    def checkpointed(self) -> dict[str, Any]:
        return {k: v for k, v in (("actor", self.actor), ("critic", self.critic)) if v is not None}


@dataclass(frozen=True)
class UpdateSettings:
    """The update's hyperparameters (params.yaml's ``algorithm`` and ``train`` groups)."""

    temperature: float = 1.0  # the policy optimised is the one that sampled (rollout.temperature)
    clip_ratio: float = 0.2
    clip_ratio_high: float | None = None
    dual_clip: float | None = None
    value_clip: float = 0.2
    kl_coef: float = 0.0
    kl_kind: str = "k3"
    entropy_coef: float = 0.0
    loss_agg: str = "token-mean"
    ppo_epochs: int = 1
    mini_batch_size: int = 1  # episodes per optimizer step
    micro_batch_tokens: int = 1024  # the token budget of one forward/backward
    pack: bool = True  # actor micro-batches run packed (no padding computed)
    share_prefix: bool = True  # packed micro-batches compute their rows' shared prefixes once
    skip_zero_signal: bool = True  # samples whose loss terms are all exactly zero are not forwarded
    seed: int = 0  # the mini-batch shuffle's


@dataclass
class Scores:
    """What the samples' scoring gave (no gradients): log-probs under the policy before the update
    (None: exactly on-policy, read from the first forward), under the reference, the critic's values."""

    old: torch.Tensor | None
    ref: torch.Tensor | None
    values: torch.Tensor | None


def masked_token_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    m = mask.bool()
    return float(x[m].float().mean()) if m.any() else 0.0


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var(returns - values) / Var(returns)`` over the masked positions."""
    m = mask.bool()
    if m.sum() < 2:
        return float("nan")
    v, r = values[m].float(), returns[m].float()
    return float(1 - (r - v).var() / (r.var() + 1e-8))


def critic_values(models: Models, samples: Samples, cfg: UpdateSettings) -> torch.Tensor | None:
    """The critic's values before the update (masked to the value positions where the representation has them)."""
    if models.critic is None:
        return None
    values = batched_values(models.critic, samples.input_ids, samples.attention_mask, cfg.micro_batch_tokens,
                            share_prefix=cfg.share_prefix)
    return values * samples.value_mask if samples.value_mask is not None else values


def signal_rows(advantages: torch.Tensor, samples: Samples, cfg: UpdateSettings, models: Models) -> list[int]:
    """The samples whose policy loss can have a gradient: all of them, unless the loss is made of the
    policy-gradient term alone (no KL to a reference, no entropy bonus), in which case a sample whose
    advantages are exactly 0 on every loss token is left out (a GRPO/RLOO group that got one return).

    Why exact: its PPO term ``-A * ratio`` (clipped or not) is ``-0 * ratio``, whose gradient is
    exactly 0, so leaving it out of the forward changes no gradient; the loss normaliser (the
    mini-batch's token count, its row count) still counts it (:func:`optimize`).
    """
    rows = list(range(len(samples)))
    if not cfg.skip_zero_signal or models.reference is not None or models.reference_is_base or cfg.kl_coef > 0 \
            or cfg.entropy_coef > 0:
        return rows
    nonzero = ((advantages != 0) & samples.loss_mask.bool()).any(-1)
    return [i for i in rows if nonzero[i]]


def score(models: Models, samples: Samples, cfg: UpdateSettings, on_policy: bool, rows: list[int]) -> Scores:
    """Old (for ``rows`` only: no other sample is forwarded) and reference log-probs on the loss
    positions only (the loss reads nothing else), without gradients."""
    ids, am, budget, mask = samples.input_ids, samples.attention_mask, cfg.micro_batch_tokens, samples.loss_mask

    def logprobs(model: Any, score_mask: torch.Tensor) -> torch.Tensor:
        return batched_token_logprobs(model, ids, am, budget, temperature=cfg.temperature, score_mask=score_mask,
                                      share_prefix=cfg.share_prefix)

    old = None
    if not on_policy:
        only_rows = torch.zeros_like(mask)
        only_rows[rows] = mask[rows]
        old = logprobs(models.actor, only_rows)
    ref = None
    if models.reference is not None:
        ref = logprobs(models.reference, mask)
    elif models.reference_is_base:
        with adapters_disabled(inner_module(models.actor)):
            ref = logprobs(models.actor, mask)
    return Scores(old=old, ref=ref, values=None)


def rl_update(
    models: Models, samples: Samples, est: EstimatorSettings, cfg: UpdateSettings, world: int = 1
) -> dict[str, float]:
    """One RL update from ``samples``: values, credit, scoring, actor and critic updates. Returns metrics.

    The schedule keeps the number of optimizer steps whatever the representation:
    ``mini_batch_size`` episodes' worth of samples per step. One epoch of one
    mini-batch is exactly on-policy: the old log-probs are then the first forward's.
    Samples without a gradient (:func:`signal_rows`) are neither scored nor forwarded.
    """
    rows = max(1, round(cfg.mini_batch_size * samples.rows_per_episode))
    on_policy = cfg.ppo_epochs == 1 and math.ceil(len(samples) / rows) == 1
    t0 = time.monotonic()
    values = critic_values(models, samples, cfg)
    advantages, returns = samples.credit.advantages(values, est)
    live = signal_rows(advantages, samples, cfg, models)
    scores = score(models, samples, cfg, on_policy, live)
    scores.values = values
    metrics = {"time/logprobs_s": time.monotonic() - t0, **skipped_shares(samples, live)}
    metrics["advantage_abs"] = masked_token_mean(advantages.abs(), samples.loss_mask)
    t0 = time.monotonic()
    metrics |= update_actor(models.actor, samples, advantages, scores, cfg, rows, world, live)
    if models.critic is not None:
        metrics |= update_critic(models.critic, samples, returns, scores.values, cfg, rows, world)
        metrics["explained_variance"] = explained_variance(scores.values, returns, samples.critic_mask)
    metrics |= {"time/update_s": time.monotonic() - t0, "samples": float(len(samples)),
                "sample_tokens": float(samples.attention_mask.sum())}
    return metrics


def skipped_shares(samples: Samples, live: list[int]) -> dict[str, float]:
    """The shares of samples and of their tokens that the actor update left out (no gradient)."""
    tokens = samples.attention_mask.sum(-1).float()
    total = float(tokens.sum())
    return {"skipped_samples": 1 - len(live) / max(len(samples), 1),
            "skipped_tokens": 1 - float(tokens[live].sum()) / total if total else 0.0}


# (micro-batch tensors, the mini-batch's token denominator, the micro-batch's share of it, its share
# of the mini-batch's rows) -> (the loss to backpropagate, its metrics per token)
MicroLoss = Callable[[dict[str, torch.Tensor], float, float, float], tuple[torch.Tensor, dict[str, Any]]]


def _accumulate(sums: dict[str, float], metrics: dict[str, Any], weight: float) -> None:
    for k, v in metrics.items():
        sums[k] = sums.get(k, 0.0) + float(v) * weight


def optimize(
    model: Any, tensors: dict[str, torch.Tensor], schedule: Iterator[tuple[list[int], list[list[int]]]],
    world: int, micro_loss: MicroLoss, *, grad_norm: bool = False,
) -> tuple[dict[str, float], list[list[int]], float]:
    """Per mini-batch of ``schedule``: each micro-batch's ``micro_loss`` backpropagated, then one optimizer step.

    The denominator is the mini-batch's global count of ``tensors['mask']``
    tokens. A micro-batch's metrics are weighted by its share of it, then
    averaged over the optimizer steps (with the gradient norm when
    ``grad_norm``). Returns (those metrics, the micro-batches run, the seconds
    spent in the optimizer steps).
    """
    mask = tensors["mask"]
    sums: dict[str, float] = {}
    n_steps, step_s, planned = 0, 0.0, []
    for mb_rows, groups in schedule:
        denom = global_denominator(float(mask[mb_rows].sum()), world)
        planned += groups
        for rows in groups:
            t = select_rows(tensors, rows or mb_rows[:1])
            live = 1.0 if rows else 0.0  # an empty group is a placeholder pass (see batching.minibatches)
            share = float(t["mask"].sum()) / denom * live
            loss, m = micro_loss(t, denom, share, len(rows) / len(mb_rows))
            model.backward(loss * live)
            _accumulate(sums, m, share)
        t0 = time.monotonic()
        model.step()
        step_s += time.monotonic() - t0
        norm = model.get_global_grad_norm() if grad_norm else None
        if norm is not None:
            sums["grad_norm"] = sums.get("grad_norm", 0.0) + float(norm)
        n_steps += 1
    return {k: v / max(n_steps, 1) for k, v in sums.items()}, planned, step_s


def rollout_mismatch(trainer_lp: torch.Tensor, engine_lp: torch.Tensor, actions: torch.Tensor) -> float:
    """Mean ``|log pi_engine(a) - log pi_trainer(a)|`` over the sampled tokens ``actions``, both under the
    weights that sampled them: how far the inference engine's numerics are from the trainer's (the
    gap that makes "on-policy" samples slightly off-policy). A per-token mean over this micro-batch."""
    n = actions.sum()
    return float(((trainer_lp - engine_lp).abs() * actions).sum() / n) if n > 0 else 0.0


def actor_loss(
    actor: Any, cfg: UpdateSettings, t: dict[str, torch.Tensor], denom: float, share: float, row_weight: float
) -> tuple[torch.Tensor, dict[str, Any]]:
    """A micro-batch's policy loss (+ KL to ``t['ref']`` when given, - entropy), pre-scaled by ``denom``
    (a :data:`MicroLoss`). Without ``t['old']`` the update is exactly on-policy: ratio 1.

    ``rollout_mismatch`` (:func:`rollout_mismatch`) compares the old log-probs with the engine's.
    """
    token_mean = cfg.loss_agg == "token-mean"
    entropy = cfg.entropy_coef > 0
    out = token_logprobs(actor, t["input_ids"], t["attention_mask"], temperature=cfg.temperature,
                         return_entropy=entropy, score_mask=t["mask"], packed=cfg.pack, share_prefix=cfg.share_prefix)
    lp, ent = out if entropy else (out, None)
    old = t["old"] if "old" in t else lp.detach()
    pg, m = policy_loss(
        lp, old, t["adv"], t["mask"], clip_ratio=cfg.clip_ratio, clip_ratio_high=cfg.clip_ratio_high,
        dual_clip=cfg.dual_clip, agg=cfg.loss_agg, denominator=denom if token_mean else None,
    )
    loss = pg
    m["pg_loss"] = float(pg.detach()) / max(share, 1e-8) if token_mean else float(pg.detach())
    m["rollout_mismatch"] = rollout_mismatch(old, t["rollout"], t["actions"])
    if "ref" in t:
        kl_term = aggregate_loss(kl(lp, t["ref"], cfg.kl_kind), t["mask"], "token-mean", denominator=denom)
        loss = loss + cfg.kl_coef * kl_term
        m["kl"] = float(kl_term.detach()) / max(share, 1e-8)
    if entropy:
        ent_term = aggregate_loss(ent, t["mask"], "token-mean", denominator=denom)
        loss = loss - cfg.entropy_coef * ent_term
        m["entropy"] = float(ent_term.detach()) / max(share, 1e-8)
    if not token_mean:  # sequence-level aggregations: weight micro-batches by their rows
        loss = loss * row_weight
    return loss, m


def update_actor(
    actor: Any, samples: Samples, advantages: torch.Tensor, scores: Scores, cfg: UpdateSettings, rows: int,
    world: int, live: list[int] | None = None,
) -> dict[str, float]:
    """``cfg.ppo_epochs`` passes of ``rows``-sample mini-batches, packed micro-batches when ``cfg.pack``;
    only the ``live`` samples (default: all) are forwarded, the others still count in each mini-batch's
    normaliser. ``padding_share`` reports the padding computed; ``time/actor_step_s`` the optimizer steps' seconds."""
    given = {k: v for k, v in (("old", scores.old), ("ref", scores.ref)) if v is not None}
    tensors = {"input_ids": samples.input_ids, "attention_mask": samples.attention_mask, "adv": advantages,
               "mask": samples.loss_mask, "rollout": samples.rollout_logprobs, "actions": samples.action_mask, **given}
    lengths = samples.attention_mask.sum(-1).tolist()
    tokens = samples.token_lists() if cfg.share_prefix else None
    schedule = minibatches(lengths, epochs=cfg.ppo_epochs, rows=rows, token_budget=cfg.micro_batch_tokens,
                           seed=cfg.seed, packed=cfg.pack, live=live, tokens=tokens)
    out, planned, step_s = optimize(actor, tensors, schedule, world, partial(actor_loss, actor, cfg), grad_norm=True)
    out["padding_share"] = padding_share(lengths, planned, cfg.pack)
    out["shared_token_share"] = shared_token_share(lengths, planned, tokens)
    out["time/actor_step_s"] = step_s
    return out


def critic_loss(
    critic: Any, cfg: UpdateSettings, t: dict[str, torch.Tensor], denom: float, share: float, row_weight: float
) -> tuple[torch.Tensor, dict[str, Any]]:
    """A micro-batch's clipped value loss, pre-scaled by ``denom`` (a :data:`MicroLoss`)."""
    values = token_values(critic, t["input_ids"], t["attention_mask"], packed=cfg.pack, share_prefix=cfg.share_prefix)
    vl, m = value_loss(values, t["old"], t["ret"], t["mask"], cfg.value_clip, denominator=denom)
    m["value_loss"] = float(vl.detach()) / max(share, 1e-8)
    return vl, m


def update_critic(
    critic: Any, samples: Samples, returns: torch.Tensor, old_values: torch.Tensor, cfg: UpdateSettings,
    rows: int, world: int,
) -> dict[str, float]:
    """The clipped value loss on the critic's positions, on its own shuffle of the actor's schedule."""
    tensors = {"input_ids": samples.input_ids, "attention_mask": samples.attention_mask, "ret": returns,
               "old": old_values, "mask": samples.critic_mask}
    tokens = samples.token_lists() if cfg.share_prefix else None
    schedule = minibatches(samples.attention_mask.sum(-1).tolist(), epochs=cfg.ppo_epochs, rows=rows,
                           token_budget=cfg.micro_batch_tokens, seed=cfg.seed + 1, packed=cfg.pack, tokens=tokens)
    out, _, step_s = optimize(critic, tensors, schedule, world, partial(critic_loss, critic, cfg))
    out["time/critic_step_s"] = step_s
    return out
