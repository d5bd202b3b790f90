"""The RL loop: rollout -> old/ref logprobs and values -> advantages -> masked
PPO-style updates of the actor (and critic) on DeepSpeed -> weight sync.

One step, per rank (whole GRPO/RLOO groups stay on one rank):

1. ``run_episodes`` plays ``questions_per_step / world`` questions x ``rollout.n``
   samples with the rollout engine (the actor's current weights);
2. the reference policy's logprobs (when ``kl_coef > 0``) and the critic's
   values (PPO) over the trajectories, micro-batched by a token budget;
   the old-policy logprobs too, unless the update is exactly on-policy (one
   epoch, one mini-batch), where they equal the current ones detached;
3. advantages by the configured estimator, aligned to the agent's tokens
   (``algorithm.advantage_mask``) with process rewards as return-to-go;
4. ``ppo_epochs`` passes over mini-batches of ``mini_batch_size`` trajectories:
   per micro-batch the masked policy loss (+ KL, - entropy) is backpropagated,
   pre-scaled so that the mini-batch's update is exactly its token mean, then
   one optimizer step; the critic likewise with the clipped value loss;
5. the rollout engine gets the new weights in memory.

Metrics go to dvclive every step; a greedy evaluation on held-out
questions (the stage passes the validation split, never the test split) every
``eval_every`` steps; DeepSpeed checkpoints every ``save_every`` steps, from
which a killed run resumes.

A checkpoint is reused only by a run that would have produced it: same params
(but for ``train.steps`` and the logging cadence), same init model *content*,
same training code and data (:func:`run_fingerprint`); otherwise the run starts
afresh and logs which of them changed. A run resumes from the newest kept
checkpoint at or below ``train.steps`` (so lowering it exports the policy
after exactly ``train.steps`` steps, or re-trains), and a resumed run ends with
the same weights, metrics and dvclive history as an uninterrupted one: the
metric history travels in the checkpoint and dvclive is rebuilt from it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

import agent_r1

from agent_r1.accelerator import device
from agent_r1.algorithms import compute_advantages, kl, loss_mask, policy_loss, value_loss
from agent_r1.algorithms.losses import aggregate
from agent_r1.algorithms.masking import spread_to_observations
from agent_r1.config import Params, plugin_refs
from agent_r1.io import hash_files, hash_tree
from agent_r1.registry import ESTIMATORS, ref_source
from agent_r1.algorithms.step_advantages import compute_step_advantages, step_table
from agent_r1.rollout.steps import StepBatch, broadcast_to_actions, episode_step_matrix, steps_from_trajectories
from agent_r1.rollout.trajectory import TrajectoryBatch
from agent_r1.training.checkpoint import (
    export_hf,
    gathered_weight_buckets,
    load_checkpoint,
    published_steps,
    read_latest,
    save_checkpoint,
)
from agent_r1.training.distributed import barrier, init_distributed, is_rank0
from agent_r1.training.engines import make_engine, make_reference, unwrap
from agent_r1.training.logprobs import (
    batched_token_logprobs,
    batched_values,
    computed_positions,
    equalize_micro_batches,
    micro_batches,
    select_rows,
    token_logprobs,
)
from agent_r1.training.models import ValueModel, load_policy

log = logging.getLogger(__name__)


@dataclass
class Engines:
    actor: Any
    reference: Any | None
    critic: Any | None

    def checkpointed(self) -> dict[str, Any]:
        return {k: v for k, v in (("actor", self.actor), ("critic", self.critic)) if v is not None}


# ------------------------------------------------------------------ what a checkpoint must share
# The agent_r1 sources a run's weights and metrics depend on (params cover the settings).
TRAINING_CODE: tuple[str, ...] = (
    "training", "algorithms", "env", "rollout", "retrieval", "evaluation/aggregate.py", "config.py", "registry.py",
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


def code_hash(package: Path = Path(agent_r1.__file__).parent) -> str:
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


def index_identity(index_path: str | Path) -> str:
    """An index folder's content hash; a server's URL (what it serves is its own business)."""
    return hash_tree(index_path) if Path(index_path).is_dir() else str(index_path)


def run_fingerprint(
    params: Params, init_model: Path, index_path: str | Path, train_questions: list[dict], eval_questions: list[dict]
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


def log_step(step: int, steps: int, metrics: dict[str, float]) -> None:
    log.info(
        "step %d/%d reward %.3f em %.3f answer %.2f calls %.2f | rollout %.0fs update %.0fs%s",
        step + 1, steps, metrics["reward"], metrics["em"], metrics["answer_rate"], metrics["tool_calls"],
        metrics["time/rollout_s"], metrics["time/update_s"],
        f" | eval em {metrics['eval/em']:.3f}" if "eval/em" in metrics else "",
    )


def log_metrics(live: Any, metrics: dict[str, float]) -> None:
    for k, v in metrics.items():
        live.log_metric(f"train/{k}" if "/" not in k else k, v)
    live.next_step()


def open_live(live_dir: Path, history: list[dict[str, float]]) -> Any:
    """A fresh dvclive folder holding exactly ``history`` (one row per step), so a resumed
    run's plots and summary are those of an uninterrupted run, whatever a killed one left."""
    from dvclive import Live

    live = Live(str(live_dir), resume=False, save_dvc_exp=False, dvcyaml=None)
    for metrics in history:
        log_metrics(live, metrics)
    return live


def step_questions(questions: list[dict], n: int, step: int, seed: int) -> list[dict]:
    """The step's questions: a seeded sample, the same on every rank and on resume."""
    rng = random.Random(seed * 1_000_003 + step)
    return rng.sample(questions, min(n, len(questions)))


def rollout_seed(params: Params, step: int, rank: int) -> int:
    """The sampling seed of a step's rollouts on ``rank``: a training seed (``train.seed``) changes
    what is sampled as well as which questions, so runs of several seeds differ in both."""
    return (params.rollout.seed + 7919 * step + rank + 1_000_003 * params.train.seed) % 2**32


def shard(records: list[dict], rank: int, world: int) -> list[dict]:
    """Whole questions (so whole groups) per rank."""
    return records[rank::world]


def sync_rollout_weights(actor: Any, rollout_engine: Any, bucket: int | None = None) -> None:
    """Actor weights -> this rank's rollout engine, in memory, as tensors (nothing is pickled).

    ZeRO-3 (collective): bucket by bucket of at most ``bucket`` elements (default: the size of
    ZeRO's own buckets), each all-gathered on every rank and copied into the engine within one
    ``weight_sync`` (:func:`~agent_r1.training.checkpoint.gathered_weight_buckets`): a rank holds
    one bucket beyond its shards, never the whole model, and nothing funnels through rank 0.
    ZeRO-1/2 keep the full weights in the module, updated in place by each optimizer step: an
    engine in the same dtype samples with those very tensors (``share_weights``, re-pointed at
    every sync so a buffer DeepSpeed replaced is followed) instead of holding a second copy.
    """
    if actor.zero_optimization_partition_weights():
        with rollout_engine.weight_sync():
            for weights in gathered_weight_buckets(actor, bucket):
                rollout_engine.update_weights(weights)
        return
    state = {k: v.detach() for k, v in unwrap(actor).state_dict().items()}  # ZeRO-1/2: the full weights
    if getattr(rollout_engine, "share_weights", None) and rollout_engine.share_weights(state):
        return
    rollout_engine.update_weights(state)


def token_tensors(batch: TrajectoryBatch, **extra: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, **extra}


def masked_token_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    m = mask.bool()
    return float(x[m].float().mean()) if m.any() else 0.0


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    m = mask.bool()
    if m.sum() < 2:
        return float("nan")
    v, r = values[m].float(), returns[m].float()
    return float(1 - (r - v).var() / (r.var() + 1e-8))


def rollout_metrics(batch: TrajectoryBatch) -> dict[str, float]:
    info = batch.info
    n = max(len(info), 1)
    calls = sum(i["tool_calls"] for i in info)
    return {
        "reward": float(batch.token_rewards.sum(-1).mean()),
        "outcome_reward": sum(i["outcome_reward"] for i in info) / n,
        "process_reward": sum(i["process_reward"] for i in info) / n,
        "em": sum(i["em"] for i in info) / n,
        "f1": sum(i["f1"] for i in info) / n,
        "answer_rate": sum(bool(i["answered"]) for i in info) / n,
        "turns": sum(i["turns"] for i in info) / n,
        "tool_calls": calls / n,
        "invalid_call_rate": sum(i["invalid_calls"] for i in info) / calls if calls else 0.0,
        "response_length": float(batch.action_mask.sum(-1).float().mean()),
        "tokens": float(batch.attention_mask.sum()),
    }


def all_reduce_mean(metrics: dict[str, float], world: int) -> dict[str, float]:
    if world == 1:
        return metrics
    import torch.distributed as dist

    keys = sorted(metrics)
    t = torch.tensor([metrics[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    return {k: float(v) / world for k, v in zip(keys, t.tolist())}


# ------------------------------------------------------------------ updates
def minibatches(
    attention_mask: torch.Tensor, cfg: Any, seed: int, packed: bool = False
) -> Iterator[tuple[list[int], list[list[int]]]]:
    """``ppo_epochs`` shuffled passes: (mini-batch rows, its token-budget micro-batches).

    ``packed``: micro-batches whose rows' total length fits the budget (they
    run as one packed row); else whose padded size does. Micro-batch lists are
    padded to the same length on every rank (empty groups): ZeRO's
    collectives need every rank to run as many passes.
    """
    order = list(range(attention_mask.shape[0]))
    rng = random.Random(seed)
    for _ in range(cfg.ppo_epochs):
        rng.shuffle(order)
        for start in range(0, len(order), cfg.mini_batch_size):
            rows = order[start : start + cfg.mini_batch_size]
            local = micro_batches(attention_mask[rows].sum(-1).tolist(), cfg.micro_batch_tokens, packed)
            yield rows, [[rows[i] for i in group] for group in equalize_micro_batches(local)]


def global_denominator(local_count: float, world: int) -> float:
    """Per-rank denominator that makes DeepSpeed's rank-average of gradients the global token mean:
    sum over ranks of (local sum / (global count / world)) / world = global sum / global count."""
    if world > 1:
        import torch.distributed as dist

        t = torch.tensor([local_count], dtype=torch.float64)
        dist.all_reduce(t)
        local_count = float(t.item()) / world
    return max(local_count, 1.0)


def _accumulate(sums: dict[str, float], metrics: dict[str, Any], weight: float) -> None:
    for k, v in metrics.items():
        sums[k] = sums.get(k, 0.0) + float(v) * weight


def padding_share(lengths: list[int], groups: list[list[int]], packed: bool) -> float:
    """Padded positions computed / real tokens, over the real (non-placeholder) micro-batches."""
    groups = [g for g in groups if g]
    real = sum(lengths[i] for g in groups for i in g)
    return (computed_positions(lengths, groups, packed) - real) / max(real, 1)


# (micro-batch tensors, the mini-batch's token denominator, the micro-batch's share of it, its share
# of the mini-batch's rows) -> (the loss to backpropagate, its metrics per token)
MicroLoss = Callable[[dict[str, torch.Tensor], float, float, float], tuple[torch.Tensor, dict[str, Any]]]


def run_minibatches(
    engine: Any, tensors: dict[str, torch.Tensor], schedule: Iterator[tuple[list[int], list[list[int]]]],
    world: int, micro_loss: MicroLoss, *, grad_norm: bool = False,
) -> tuple[dict[str, float], list[list[int]], float]:
    """The update loop of the actor and the critic: per mini-batch of ``schedule``
    (:func:`minibatches`), each micro-batch's ``micro_loss`` backpropagated, then one optimizer step.

    The denominator is the mini-batch's global count of ``tensors['mask']``
    tokens, so the accumulated gradient is exactly that of the mini-batch's
    token mean. A micro-batch's metrics are weighted by its share of it, then
    averaged over the optimizer steps (with the engine's gradient norm when
    ``grad_norm``). Returns (those metrics, the micro-batches run, the seconds
    spent in the optimizer steps).
    """
    mask = tensors["mask"]
    sums: dict[str, float] = {}
    n_steps = 0
    planned: list[list[int]] = []
    step_s = 0.0
    for mb_rows, groups in schedule:
        denom = global_denominator(float(mask[mb_rows].sum()), world)
        planned += groups
        for rows in groups:
            t = select_rows(tensors, rows or mb_rows[:1])
            live = 1.0 if rows else 0.0  # an empty group is a placeholder pass (see minibatches)
            share = float(t["mask"].sum()) / denom * live
            loss, m = micro_loss(t, denom, share, len(rows) / len(mb_rows))
            engine.backward(loss * live)
            _accumulate(sums, m, share)
        t0 = time.monotonic()
        engine.step()
        step_s += time.monotonic() - t0
        norm = engine.get_global_grad_norm() if grad_norm else None
        if norm is not None:
            sums["grad_norm"] = sums.get("grad_norm", 0.0) + float(norm)
        n_steps += 1
    return {k: v / max(n_steps, 1) for k, v in sums.items()}, planned, step_s


def actor_loss(
    params: Params, actor: Any, t: dict[str, torch.Tensor], denom: float, share: float, row_weight: float
) -> tuple[torch.Tensor, dict[str, Any]]:
    """A micro-batch's policy loss (+ KL to ``t['ref']`` when given, - entropy), pre-scaled by ``denom``
    (a :data:`MicroLoss`). Without ``t['old']`` the update is exactly on-policy: ratio 1."""
    alg = params.algorithm
    token_mean = alg.loss_agg == "token-mean"
    temperature = params.rollout.temperature  # the policy being optimised is the one that sampled
    entropy = alg.entropy_coef > 0
    out = token_logprobs(actor, t["input_ids"], t["attention_mask"], temperature=temperature,
                         return_entropy=entropy, score_mask=t["mask"], packed=params.train.pack)
    lp, ent = out if entropy else (out, None)
    old = t["old"] if "old" in t else lp.detach()
    pg, m = policy_loss(
        lp, old, t["adv"], t["mask"], clip_ratio=alg.clip_ratio, clip_ratio_high=alg.clip_ratio_high,
        dual_clip=alg.dual_clip, agg=alg.loss_agg, denominator=denom if token_mean else None,
    )
    loss = pg
    m["pg_loss"] = float(pg.detach()) / max(share, 1e-8) if token_mean else float(pg.detach())
    if "ref" in t:
        kl_term = aggregate(kl(lp, t["ref"], alg.kl_kind), t["mask"], "token-mean", denominator=denom)
        loss = loss + alg.kl_coef * kl_term
        m["kl"] = float(kl_term.detach()) / max(share, 1e-8)
    if alg.entropy_coef > 0:
        ent_term = aggregate(ent, t["mask"], "token-mean", denominator=denom)
        loss = loss - alg.entropy_coef * ent_term
        m["entropy"] = float(ent_term.detach()) / max(share, 1e-8)
    if not token_mean:  # sequence-level aggregations: weight micro-batches by their rows
        loss = loss * row_weight
    return loss, m


def update_actor(
    params: Params, engines: Engines, batch: TrajectoryBatch, advantages: torch.Tensor,
    old_logprobs: torch.Tensor | None, ref_logprobs: torch.Tensor | None, mask: torch.Tensor, world: int,
) -> dict[str, float]:
    """PPO epochs over mini-batches; micro-batches by token budget; one optimizer step per mini-batch.

    Each micro-batch's loss is pre-scaled by the mini-batch's (global) token
    count, so the accumulated gradient is exactly that of the token-mean loss.
    ``train.pack``: micro-batches run packed (no padding computed);
    ``padding_share`` reports the padding computed either way; ``time/actor_step_s``
    the seconds of its optimizer steps.
    """
    given = {k: v for k, v in (("old", old_logprobs), ("ref", ref_logprobs)) if v is not None}
    tensors = token_tensors(batch, adv=advantages, mask=mask, **given)
    packed = params.train.pack
    schedule = minibatches(batch.attention_mask, params.train, params.train.seed, packed)
    loss = partial(actor_loss, params, engines.actor)
    out, planned, step_s = run_minibatches(engines.actor, tensors, schedule, world, loss, grad_norm=True)
    out["padding_share"] = padding_share(batch.attention_mask.sum(-1).tolist(), planned, packed)
    out["time/actor_step_s"] = step_s
    return out


def critic_loss(
    params: Params, critic: Any, t: dict[str, torch.Tensor], denom: float, share: float, row_weight: float
) -> tuple[torch.Tensor, dict[str, Any]]:
    """A micro-batch's clipped value loss, pre-scaled by ``denom`` (a :data:`MicroLoss`)."""
    values = critic(t["input_ids"], t["attention_mask"])
    vl, m = value_loss(values, t["old"], t["ret"], t["mask"], params.algorithm.value_clip, denominator=denom)
    m["value_loss"] = float(vl.detach()) / max(share, 1e-8)
    return vl, m


def update_critic(
    params: Params, critic: Any, batch: TrajectoryBatch, returns: torch.Tensor, old_values: torch.Tensor,
    mask: torch.Tensor, world: int,
) -> dict[str, float]:
    """The clipped value loss on the same positions and mini-batch schedule as the actor."""
    tensors = token_tensors(batch, ret=returns, old=old_values, mask=mask)
    schedule = minibatches(batch.attention_mask, params.train, params.train.seed + 1)
    out, _, step_s = run_minibatches(critic, tensors, schedule, world, partial(critic_loss, params, critic))
    out["time/critic_step_s"] = step_s
    return out


# ------------------------------------------------------------------ the loop
def build_engines(params: Params, init_model: Path) -> Engines:
    cfg, alg = params.train, params.algorithm
    actor = make_engine(load_policy(init_model, "float32", cfg.gradient_checkpointing), cfg, cfg.actor_lr)
    reference = make_reference(load_policy(init_model, "float32", False), cfg) if alg.kl_coef > 0 else None
    critic = None
    if ESTIMATORS.meta(alg.name, "needs_critic", False):
        critic = make_engine(ValueModel.from_pretrained(init_model, "float32", cfg.gradient_checkpointing), cfg, cfg.critic_lr)
    return Engines(actor, reference, critic)


def policy_loss_mask(params: Params, batch: TrajectoryBatch) -> torch.Tensor:
    """The positions the policy loss reads (``algorithm.loss_mask``), float [B, T]."""
    return loss_mask(batch.action_mask, batch.attention_mask, batch.prompt_length, params.algorithm.loss_mask).float()


def batch_advantages(
    params: Params, batch: TrajectoryBatch, values: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns)`` of ``batch`` by ``algorithm.name``'s estimator (``values``: the critic's).

    With the loss mask off and the advantage mask on, observation tokens take their turn's
    advantage (:func:`~agent_r1.algorithms.masking.spread_to_observations`): the ablation trains them.
    """
    alg = params.algorithm
    advantages, returns = compute_advantages(
        alg.name, token_rewards=batch.token_rewards, action_mask=batch.action_mask, group_id=batch.group_id,
        values=values, gamma=alg.gamma, lam=alg.lam, align=alg.advantage_mask, response_mask=batch.response_mask(),
        process_rewards=alg.process_rewards_in_advantage, norm_by_std=alg.norm_by_std,
    )
    if alg.advantage_mask and not alg.loss_mask:
        advantages = spread_to_observations(advantages, batch.action_mask, batch.response_mask())
    return advantages, returns


@dataclass
class StepSamples:
    """``algorithm.representation: step``: one sample per step, its advantage on the response tokens,
    and with a critic the value positions (each step's last prompt token), their values and returns."""

    steps: StepBatch
    advantages: torch.Tensor  # [N, L]
    value_mask: torch.Tensor | None = None  # [N, L]: 1 at each row's last prompt token
    values: torch.Tensor | None = None  # [N, L]: the critic's value there, 0 elsewhere
    returns: torch.Tensor | None = None  # [N, L]: the step's return there, 0 elsewhere


def value_positions(steps: StepBatch) -> torch.Tensor:
    """``[N, L]`` long: 1 at each step's last prompt token, where the critic reads V(state the step acts from)."""
    mask = torch.zeros_like(steps.attention_mask)
    return mask.scatter_(1, (steps.prompt_length - 1)[:, None], 1)


def step_samples(params: Params, batch: TrajectoryBatch, critic: Any = None) -> StepSamples:
    """The trajectories cut into one sample per step, and the step-level advantages of ``algorithm.name``
    (with ``critic``: one value per step, read at the step's last prompt token, for step-level GAE)."""
    alg = params.algorithm
    steps = steps_from_trajectories(batch)
    step_rewards, step_mask, group = episode_step_matrix(steps)
    value_mask = values = table = None
    if critic is not None:
        value_mask = value_positions(steps)
        values = batched_values(critic, steps.input_ids, steps.attention_mask, params.train.micro_batch_tokens) * value_mask
        table, _ = step_table(values.sum(-1), steps.episode, steps.turn, steps.n_episodes)
    advantages, returns = compute_step_advantages(
        alg.name, step_rewards=step_rewards, step_mask=step_mask, group_id=group, values=table, gamma=alg.gamma,
        lam=alg.lam, process_rewards=alg.process_rewards_in_advantage, norm_by_std=alg.norm_by_std,
    )
    step_returns = returns[steps.episode, steps.turn][:, None] * value_mask if critic is not None else None
    return StepSamples(steps, broadcast_to_actions(steps, advantages), value_mask, values, step_returns)


def step_rl_step(params: Params, engines: Engines, batch: TrajectoryBatch, world: int = 1) -> dict[str, float]:
    """:func:`rl_step` on step samples: each step one sequence, the loss on its response; the
    mini-batch schedule keeps flat's number of optimizer steps (``mini_batch_size`` counts episodes).
    With a critic, its clipped value loss is on each step's value position, against the step's return."""
    t0 = time.monotonic()
    samples = step_samples(params, batch, engines.critic)
    steps, advantages = samples.steps, samples.advantages
    per_episode = len(steps) / max(len(batch), 1)
    cfg = params.train.model_copy(update={"mini_batch_size": max(1, round(params.train.mini_batch_size * per_episode))})
    step_params = params.model_copy(update={"train": cfg})
    mask = steps.action_mask.float()

    def scored(engine: Any) -> torch.Tensor:
        return batched_token_logprobs(engine, steps.input_ids, steps.attention_mask, cfg.micro_batch_tokens,
                                      temperature=params.rollout.temperature, score_mask=mask)

    on_policy = cfg.ppo_epochs == 1 and math.ceil(len(steps) / cfg.mini_batch_size) == 1
    old_lp = None if on_policy else scored(engines.actor)
    ref_lp = scored(engines.reference) if engines.reference is not None else None
    logprobs_s = time.monotonic() - t0
    t0 = time.monotonic()
    metrics = update_actor(step_params, engines, steps, advantages, old_lp, ref_lp, mask, world)
    if engines.critic is not None:
        vmask = samples.value_mask.float()
        metrics |= update_critic(step_params, engines.critic, steps, samples.returns, samples.values, vmask, world)
        metrics["explained_variance"] = explained_variance(samples.values, samples.returns, vmask)
    metrics |= {"advantage_abs": masked_token_mean(advantages.abs(), mask), "time/update_s": time.monotonic() - t0,
                "time/logprobs_s": logprobs_s,
                "step_samples": float(len(steps)), "step_tokens": float(steps.attention_mask.sum())}
    return metrics


def rl_step(params: Params, engines: Engines, batch: TrajectoryBatch, world: int = 1) -> dict[str, float]:
    """Everything after the rollout: logprobs, advantages, updates. Returns metrics."""
    if params.algorithm.representation == "step":
        return step_rl_step(params, engines, batch, world)
    cfg = params.train
    budget = cfg.micro_batch_tokens
    ids, am = batch.input_ids, batch.attention_mask
    n_minibatches = math.ceil(len(batch) / cfg.mini_batch_size)
    on_policy = cfg.ppo_epochs == 1 and n_minibatches == 1
    metrics: dict[str, float] = {}

    # the loss reads logprobs only under this mask: score nothing else (see LogprobModel)
    mask = policy_loss_mask(params, batch)
    t0 = time.monotonic()
    temp = params.rollout.temperature
    old_lp = (
        None if on_policy
        else batched_token_logprobs(engines.actor, ids, am, budget, temperature=temp, score_mask=mask)
    )
    ref_lp = (
        batched_token_logprobs(engines.reference, ids, am, budget, temperature=temp, score_mask=mask)
        if engines.reference is not None else None
    )
    values = batched_values(engines.critic, ids, am, budget) if engines.critic is not None else None
    metrics["time/logprobs_s"] = time.monotonic() - t0

    advantages, returns = batch_advantages(params, batch, values)
    metrics["advantage_abs"] = masked_token_mean(advantages.abs(), mask)

    t0 = time.monotonic()
    metrics.update(update_actor(params, engines, batch, advantages, old_lp, ref_lp, mask, world))
    if engines.critic is not None:
        metrics.update(update_critic(params, engines.critic, batch, returns, values, mask, world))
        metrics["explained_variance"] = explained_variance(values, returns, mask)
    metrics["time/update_s"] = time.monotonic() - t0
    return metrics


def restore(
    engines: Engines, rollout_engine: Any, checkpoint_dir: Path, fingerprint: dict[str, str], cfg: Any
) -> tuple[int, list[dict[str, float]]]:
    """Resume from the checkpoint :func:`resume_step` picks: (its step, the metric history up to it).
    A checkpoint that may not be reused is deleted. Collective."""
    step = resume_step(checkpoint_dir, fingerprint, cfg.steps)
    if step is None:
        if read_latest(checkpoint_dir) is not None:
            barrier()  # every rank has read latest.json before it goes
            if is_rank0():
                shutil.rmtree(checkpoint_dir, ignore_errors=True)
            barrier()
        return 0, []
    extra = load_checkpoint(engines.checkpointed(), checkpoint_dir, step)
    sync_rollout_weights(engines.actor, rollout_engine)
    log.info("resuming at step %d", step)
    return step, scheduled(list(extra.get("history", []))[:step], cfg)


@dataclass
class Rollout:
    """The rollout engine with the env and tokenizer its episodes need."""

    engine: Any
    env: Any
    tokenizer: Any

    def play(self, records: list[dict], cfg: Any, greedy: bool = False) -> TrajectoryBatch:
        from agent_r1.rollout import run_episodes

        return run_episodes(self.engine, self.env, self.tokenizer, records, cfg, greedy=greedy)


def held_out_eval(rollout: Rollout, eval_questions: list[dict], params: Params) -> dict[str, float]:
    """Greedy episodes of the held-out questions with the rollout engine's current weights."""
    from agent_r1.evaluation.aggregate import aggregate as aggregate_episodes

    ev = aggregate_episodes(rollout.play(eval_questions, params.rollout, greedy=True).info, "eval")
    return {"eval/em": ev["em"], "eval/f1": ev["f1"], "eval/answer_rate": ev["answer_rate"],
            "eval/tool_calls": ev["mean_tool_calls"]}


def train_step(
    params: Params, engines: Engines, rollout: Rollout, questions: list[dict], step: int, rank: int, world: int
) -> dict[str, float]:
    """One RL step: the step's rollouts, the updates, the weight sync; metrics averaged over ranks."""
    cfg = params.train
    t_step = time.monotonic()
    records = shard(step_questions(questions, cfg.questions_per_step, step, cfg.seed), rank, world)
    rollout_cfg = params.rollout.model_copy(update={"seed": rollout_seed(params, step, rank)})
    t0 = time.monotonic()
    batch = rollout.play(records, rollout_cfg)
    metrics = rollout_metrics(batch)
    metrics["time/rollout_s"] = time.monotonic() - t0
    rollout.engine.sleep()  # vLLM on GPU: its memory goes to the update
    metrics.update(rl_step(params, engines, batch.to(device()), world))
    rollout.engine.wake_up()
    sync_rollout_weights(engines.actor, rollout.engine)
    metrics["time/step_s"] = time.monotonic() - t_step
    metrics["tokens_per_s"] = metrics["tokens"] / max(metrics["time/step_s"], 1e-9)
    return all_reduce_mean(metrics, world)


@dataclass
class Run:
    """One :func:`train_rl` call: what its steps need, and the metric history so far (one row a step)."""

    params: Params
    engines: Engines
    rollout: Rollout
    train_questions: list[dict]
    eval_questions: list[dict]
    checkpoint_dir: Path
    fingerprint: dict[str, str]
    rank: int
    world: int
    history: list[dict[str, float]] = field(default_factory=list)
    live: Any = None  # rank 0's dvclive


def evaluate_into(run: Run, metrics: dict[str, float]) -> None:
    """Add the held-out evaluation to ``metrics`` (rank 0 plays it; every rank waits). Collective."""
    if is_rank0():
        metrics.update(held_out_eval(run.rollout, run.eval_questions, run.params))
    barrier()


def resume(run: Run, live_dir: Path) -> int:
    """Restore the run's checkpoint if one may be reused (:func:`restore`) and open dvclive with
    its history; returns the first step to train. Collective."""
    cfg = run.params.train
    start_step, run.history = restore(
        run.engines, run.rollout.engine, run.checkpoint_dir, run.fingerprint, cfg
    )
    if run.history and len(run.history) == cfg.steps and "eval/em" not in run.history[-1]:
        evaluate_into(run, run.history[-1])  # this run's last step evaluates; the checkpoint's run had more steps
    run.live = open_live(live_dir, run.history) if is_rank0() else None
    if run.live is not None:
        run.live.step = start_step
    return start_step


def record(run: Run, step: int, metrics: dict[str, float]) -> None:
    """Log a finished step: dvclive (rank 0), the history, the log line."""
    if run.live is not None:
        log_metrics(run.live, metrics)
    run.history.append(metrics)
    log_step(step, run.params.train.steps, metrics)


def run_step(run: Run, step: int) -> None:
    """Train 0-based ``step``, evaluate and checkpoint when it is due, and record it."""
    cfg = run.params.train
    metrics = train_step(run.params, run.engines, run.rollout, run.train_questions, step, run.rank, run.world)
    if evaluates_at(step, cfg):
        evaluate_into(run, metrics)
    record(run, step, metrics)
    if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
        save_checkpoint(run.engines.checkpointed(), run.checkpoint_dir, step + 1, {"history": run.history},
                        fingerprint=run.fingerprint)


def finish(run: Run, out_model: Path) -> None:
    """Export the policy and close dvclive."""
    export_hf(run.engines.actor, run.rollout.tokenizer, out_model)
    if run.live is not None:
        run.live.end()


def train_rl(
    params: Params,
    *,
    init_model: Path,
    index_path: Path,
    train_questions: list[dict],
    eval_questions: list[dict],
    out_model: Path,
    checkpoint_dir: Path,
    live_dir: Path,
    rollout_engine: Any = None,
) -> dict[str, Any]:
    """Run ``params.train.steps`` RL steps from ``init_model``; export the policy to ``out_model``.

    ``rollout_engine``: one already built from ``init_model`` (e.g. to inspect it after the run);
    by default :func:`~agent_r1.rollout.make_rollout_engine` builds the one ``rollout`` names.
    Returns ``{"steps", "start_step", "last"}``: ``last`` is the final step's
    metrics, also when every step was restored from a checkpoint.
    """
    from agent_r1.env import make_env
    from agent_r1.rollout import make_rollout_engine

    rank, world = init_distributed()
    cfg = params.train
    torch.manual_seed(cfg.seed + rank)
    if cfg.questions_per_step % world:
        raise ValueError(f"train.questions_per_step ({cfg.questions_per_step}) must be divisible by train.num_procs ({world})")
    fingerprint = run_fingerprint(params, init_model, index_path, train_questions, eval_questions)

    engines = build_engines(params, init_model)
    if rollout_engine is None:
        rollout_engine = make_rollout_engine(init_model, params.rollout)
    env = make_env(params, index_path)
    rollout = Rollout(rollout_engine, env, rollout_engine.tokenizer)

    run = Run(params, engines, rollout, train_questions, eval_questions, checkpoint_dir, fingerprint, rank, world)
    start_step = resume(run, live_dir)
    for step in range(start_step, cfg.steps):
        run_step(run, step)
    finish(run, out_model)
    return {"steps": cfg.steps, "start_step": start_step, "last": run.history[-1] if run.history else {}}
