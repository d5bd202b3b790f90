"""The RL run, top to bottom. One iteration, per rank (whole GRPO/RLOO groups stay on one rank):

1. rollout: ``questions_per_step / world`` questions x ``rollout.n`` episodes played by the
   inference engine with the actor's current weights (:func:`agent_r1.rollout.run_episodes`);
2. samples: the trajectories as the update consumes them, flat or one per turn
   (:func:`~agent_r1.training.samples.make_samples`);
3. update: score, assign credit, update actor and critic (:func:`~agent_r1.training.update.rl_update`);
4. weight sync: the actor's new weights into the inference engine
   (:func:`~agent_r1.training.weight_sync.sync_rollout_weights`).

Metrics go to dvclive every iteration (:mod:`.live`); a greedy evaluation on
held-out questions (the stage passes the validation split, never the test
split) every ``eval_every`` iterations; DeepSpeed checkpoints every
``save_every``, from which a killed run resumes.

A checkpoint is reused only by a run that would have produced it (same params
but for ``train.steps`` and the logging cadence, same init model content,
training code and data: :func:`~agent_r1.training.checkpoint.run_fingerprint`);
otherwise the run starts afresh and logs what changed. A run resumes from the
newest kept checkpoint at or below ``train.steps`` and ends with the same
weights, metrics and dvclive history as an uninterrupted one: the metric
history travels in the checkpoint and dvclive is rebuilt from it.
"""

from __future__ import annotations

import logging
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agent_r1.accelerator import device
from agent_r1.config import Params
from agent_r1.registry import ESTIMATORS
from agent_r1.rollout.trajectory import TrajectoryBatch
from agent_r1.training.checkpoint import (
    evaluates_at, export_hf, load_checkpoint, read_latest, resume_step, run_fingerprint, save_checkpoint, scheduled,
)
from agent_r1.training.distributed import barrier, init_distributed, is_rank0
from agent_r1.training.live import all_reduce_mean, log_iteration, log_metrics, open_live, rollout_metrics
from agent_r1.training.lora import add_lora
from agent_r1.training.models import ValueModel, load_policy, make_frozen, make_trainable
from agent_r1.training.samples import EstimatorSettings, make_samples
from agent_r1.training.update import Models, UpdateSettings, rl_update
from agent_r1.training.weight_sync import sync_rollout_weights

log = logging.getLogger(__name__)


# ------------------------------------------------------------------ params -> the parts
def update_settings(params: Params) -> UpdateSettings:
    alg, cfg = params.algorithm, params.train
    return UpdateSettings(
        temperature=params.rollout.temperature, clip_ratio=alg.clip_ratio, clip_ratio_high=alg.clip_ratio_high,
        dual_clip=alg.dual_clip, value_clip=alg.value_clip, kl_coef=alg.kl_coef, kl_kind=alg.kl_kind,
        entropy_coef=alg.entropy_coef, loss_agg=alg.loss_agg, ppo_epochs=cfg.ppo_epochs,
        mini_batch_size=cfg.mini_batch_size, micro_batch_tokens=cfg.micro_batch_tokens, pack=cfg.pack, share_prefix=cfg.share_prefix and cfg.pack,
        skip_zero_signal=cfg.skip_zero_signal, seed=cfg.seed,
    )


def estimator_settings(params: Params) -> EstimatorSettings:
    alg = params.algorithm
    return EstimatorSettings(
        name=alg.name, gamma=alg.gamma, lam=alg.lam, advantage_mask=alg.advantage_mask,
        process_rewards=alg.process_rewards_in_advantage, norm_by_std=alg.norm_by_std, options=alg.options,
    )


def build_models(params: Params, init_model: Path) -> Models:
    """The actor from ``init_model`` (with LoRA adapters when ``train.lora``); the reference only when
    ``kl_coef > 0`` (with LoRA: the actor without its adapters); a critic when the estimator needs one."""
    cfg, alg = params.train, params.algorithm
    policy = load_policy(init_model, "float32", cfg.gradient_checkpointing)
    if cfg.lora is not None:
        policy = add_lora(policy, cfg.lora.rank, cfg.lora.alpha, cfg.lora.target_modules)
    actor = make_trainable(policy, cfg, cfg.actor_lr)
    separate_reference = alg.kl_coef > 0 and cfg.lora is None
    reference = make_frozen(load_policy(init_model, "float32", False), cfg) if separate_reference else None
    critic = None
    if ESTIMATORS.meta(alg.name, "needs_critic", False):
        value_model = ValueModel.from_pretrained(init_model, "float32", cfg.gradient_checkpointing)
        critic = make_trainable(value_model, cfg, cfg.critic_lr)
    return Models(actor, reference, critic, reference_is_base=alg.kl_coef > 0 and cfg.lora is not None)


# ------------------------------------------------------------------ one iteration
@dataclass
class Rollout:
    """The inference engine with the env and tokenizer its episodes need."""

    engine: Any
    env: Any
    tokenizer: Any

    def play(self, records: list[dict], cfg: Any, greedy: bool = False) -> TrajectoryBatch:
        from agent_r1.rollout import run_episodes

        return run_episodes(self.engine, self.env, self.tokenizer, records, cfg, greedy=greedy)


def iteration_questions(questions: list[dict], n: int, step: int, seed: int) -> list[dict]:
    """The iteration's questions: a seeded sample, the same on every rank and on resume."""
    rng = random.Random(seed * 1_000_003 + step)
    return rng.sample(questions, min(n, len(questions)))


def rollout_seed(params: Params, step: int, rank: int) -> int:
    """The sampling seed of an iteration's rollouts on ``rank``: a training seed (``train.seed``) changes
    what is sampled as well as which questions, so runs of several seeds differ in both."""
    return (params.rollout.seed + 7919 * step + rank + 1_000_003 * params.train.seed) % 2**32


def shard(records: list[dict], rank: int, world: int) -> list[dict]:
    """Whole questions (so whole groups) per rank."""
    return records[rank::world]


def update_from_rollout(params: Params, models: Models, batch: TrajectoryBatch, world: int = 1) -> dict[str, float]:
    """The iteration's update: the rollout's samples (``algorithm.representation``) through :func:`rl_update`."""
    alg = params.algorithm
    samples = make_samples(batch, alg.representation, alg.loss_mask)
    return rl_update(models, samples, estimator_settings(params), update_settings(params), world)


def train_iteration(
    params: Params, models: Models, rollout: Rollout, questions: list[dict], step: int, rank: int, world: int
) -> dict[str, float]:
    """One RL iteration: rollouts, samples, the update, the weight sync; metrics averaged over ranks."""
    cfg = params.train
    t_start = time.monotonic()
    records = shard(iteration_questions(questions, cfg.questions_per_step, step, cfg.seed), rank, world)
    t0 = time.monotonic()
    batch = rollout.play(records, params.rollout.model_copy(update={"seed": rollout_seed(params, step, rank)}))
    metrics = rollout_metrics(batch)
    metrics["time/rollout_s"] = time.monotonic() - t0
    rollout.engine.sleep()  # vLLM on GPU: its memory goes to the update
    metrics |= update_from_rollout(params, models, batch.to(device()), world)
    rollout.engine.wake_up()
    sync_rollout_weights(models.actor, rollout.engine)
    metrics["time/step_s"] = time.monotonic() - t_start
    metrics["tokens_per_s"] = metrics["tokens"] / max(metrics["time/step_s"], 1e-9)
    return all_reduce_mean(metrics, world)


def held_out_eval(rollout: Rollout, eval_questions: list[dict], params: Params) -> dict[str, float]:
    """Greedy episodes of the held-out questions with the inference engine's current weights."""
    from agent_r1.evaluation.summary import summarize_episodes

    ev = summarize_episodes(rollout.play(eval_questions, params.rollout, greedy=True).info, "eval")
    return {"eval/em": ev["em"], "eval/f1": ev["f1"], "eval/answer_rate": ev["answer_rate"],
            "eval/tool_calls": ev["mean_tool_calls"]}


# ------------------------------------------------------------------ the run
@dataclass
class Run:
    """One :func:`train_rl` call: what its iterations need, and the metric history so far (one row each)."""

    params: Params
    models: Models
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


def restore(run: Run) -> int:
    """Load the checkpoint :func:`~agent_r1.training.checkpoint.resume_step` picks into the models and
    the inference engine, and its history into the run; returns its step (0: none). A checkpoint that
    may not be reused is deleted. Collective."""
    cfg = run.params.train
    step = resume_step(run.checkpoint_dir, run.fingerprint, cfg.steps)
    if step is None:
        if read_latest(run.checkpoint_dir) is not None:
            barrier()  # every rank has read latest.json before it goes
            if is_rank0():
                shutil.rmtree(run.checkpoint_dir, ignore_errors=True)
            barrier()
        return 0
    extra = load_checkpoint(run.models.checkpointed(), run.checkpoint_dir, step)
    sync_rollout_weights(run.models.actor, run.rollout.engine)
    log.info("resuming at step %d", step)
    run.history = scheduled(list(extra.get("history", []))[:step], cfg)
    return step


def resume(run: Run, live_dir: Path) -> int:
    """Restore the run's checkpoint if one may be reused and open dvclive with its history;
    returns the first iteration to train. Collective."""
    cfg = run.params.train
    start = restore(run)
    if run.history and len(run.history) == cfg.steps and "eval/em" not in run.history[-1]:
        evaluate_into(run, run.history[-1])  # this run's last iteration evaluates; the checkpoint's run had more
    run.live = open_live(live_dir, run.history) if is_rank0() else None
    if run.live is not None:
        run.live.step = start
    return start


def run_iteration(run: Run, step: int) -> None:
    """Train 0-based iteration ``step``, evaluate and checkpoint when due, and record it."""
    cfg = run.params.train
    metrics = train_iteration(run.params, run.models, run.rollout, run.train_questions, step, run.rank, run.world)
    if evaluates_at(step, cfg):
        evaluate_into(run, metrics)
    if run.live is not None:
        log_metrics(run.live, metrics)
    run.history.append(metrics)
    log_iteration(step, cfg.steps, metrics)
    if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
        save_checkpoint(run.models.checkpointed(), run.checkpoint_dir, step + 1, {"history": run.history},
                        fingerprint=run.fingerprint)


def train_rl(
    params: Params,
    *,
    init_model: Path,
    index_path: Path | str | None,
    train_questions: list[dict],
    eval_questions: list[dict],
    out_model: Path,
    checkpoint_dir: Path,
    live_dir: Path,
    inference_engine: Any = None,
) -> dict[str, Any]:
    """Run ``params.train.steps`` RL iterations from ``init_model``; export the policy to ``out_model``.

    ``inference_engine``: one already built from ``init_model`` (e.g. to inspect it after the run);
    by default :func:`~agent_r1.rollout.make_rollout_engine` builds the one ``rollout.engine`` names.
    Returns ``{"steps", "start_step", "last"}``: ``last`` is the final iteration's
    metrics, also when every iteration was restored from a checkpoint.
    """
    from agent_r1.env import make_env
    from agent_r1.rollout import make_rollout_engine

    rank, world = init_distributed()
    cfg = params.train
    torch.manual_seed(cfg.seed + rank)
    if cfg.questions_per_step % world:
        raise ValueError(f"train.questions_per_step ({cfg.questions_per_step}) must be divisible by train.num_procs ({world})")
    fingerprint = run_fingerprint(params, init_model, index_path, train_questions, eval_questions)
    models = build_models(params, init_model)
    engine = inference_engine if inference_engine is not None else make_rollout_engine(init_model, params.rollout)
    rollout = Rollout(engine, make_env(params, index_path), engine.tokenizer)
    run = Run(params, models, rollout, train_questions, eval_questions, checkpoint_dir, fingerprint, rank, world)
    start = resume(run, live_dir)
    for step in range(start, cfg.steps):
        run_iteration(run, step)
    export_hf(run.models.actor, rollout.tokenizer, out_model)
    if run.live is not None:
        run.live.end()
    return {"steps": cfg.steps, "start_step": start, "last": run.history[-1] if run.history else {}}
