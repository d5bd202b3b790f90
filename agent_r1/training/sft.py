"""Warm start: supervised fine-tuning on scripted expert trajectories.

The demonstrations come from :class:`~agent_r1.training.expert.ExpertEngine`
played through the real rollout loop and environment, so they carry the exact
token layout, action mask and search observations the RL policy will see. The
loss is the token-mean negative log-likelihood of the expert's action tokens
(observations and prompt masked out), on the same DeepSpeed engine as RL.

It is deliberately partial by default (few demonstrations, bridge questions
only): a full warm start was seen to saturate a simple world, leaving RL
nothing to show.
"""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path
from typing import Any

import torch

from agent_r1.accelerator import device
from agent_r1.algorithms.losses import aggregate_loss
from agent_r1.config import Params
from agent_r1.rollout.trajectory import TrajectoryBatch
from agent_r1.training.checkpoint import export_hf
from agent_r1.training.models import make_trainable
from agent_r1.training.expert import ExpertEngine, plan_of
from agent_r1.training.batching import micro_batches, select_rows
from agent_r1.training.models import load_policy

log = logging.getLogger(__name__)


def select_demo_questions(train: list[dict], params: Params) -> list[dict]:
    """A seeded sample of ``sft.n_demos`` training questions of the allowed types."""
    cfg = params.sft
    pool = [r for r in train if r["type"] in cfg.question_types]
    if not pool:
        raise ValueError(f"sft.question_types {cfg.question_types} match no training question")
    return random.Random(cfg.seed).sample(pool, min(cfg.n_demos, len(pool)))


def expert_demonstrations(params: Params, tokenizer: Any, env: Any, records: list[dict]) -> TrajectoryBatch:
    """Play the expert on ``records`` (one episode each) through the real env."""
    from agent_r1.rollout import run_episodes

    plan = plan_of(env)
    engine = ExpertEngine(tokenizer, records, plan)
    # The expert's actions are never cut short: a truncated demonstration would teach truncation.
    longest = max(len(tokenizer.encode(a, add_special_tokens=False)) for r in records for a in plan(r))
    cfg = params.rollout.model_copy(update={"n": 1, "max_new_tokens": max(params.rollout.max_new_tokens, longest)})
    return run_episodes(engine, env, tokenizer, records, cfg)


def keep_grounded(batch: TrajectoryBatch) -> list[int]:
    """Rows whose searches surfaced every supporting document and whose answer was right:
    the answer is then really in what the agent read, so imitation teaches search, not recall."""
    return [
        i for i, info in enumerate(batch.info)
        if info["em"] == 1.0 and info.get("support_docs_found", 0) >= info.get("support_docs_total", 0)
    ]


def train_sft(
    params: Params, *, init_model: Path, index_path: Path | str | None, train_questions: list[dict], out_model: Path
) -> dict[str, Any]:
    from agent_r1.env import make_env
    from transformers import AutoTokenizer

    cfg = params.sft
    torch.manual_seed(cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(init_model)
    env = make_env(params, index_path)
    demos = expert_demonstrations(params, tokenizer, env, select_demo_questions(train_questions, params))
    rows = keep_grounded(demos)
    log.info("%d of %d expert demonstrations are grounded; training on them", len(rows), len(demos))
    if not rows:
        raise RuntimeError("no grounded expert demonstration: check retrieval (metrics/retrieval.json)")

    engine = make_trainable(load_policy(init_model, "float32", params.train.gradient_checkpointing), params.train, cfg.lr)
    tensors = {"input_ids": demos.input_ids, "attention_mask": demos.attention_mask, "mask": demos.action_mask.float()}
    tensors = {k: v.to(device()) for k, v in tensors.items()}  # where the engine computes (cuda:LOCAL_RANK on GPUs)
    rng = random.Random(cfg.seed)
    losses: list[float] = []
    t0 = time.monotonic()
    tokens = 0
    for epoch in range(cfg.epochs):
        order = rows[:]
        rng.shuffle(order)
        for start in range(0, len(order), cfg.batch_size):
            mb_rows = order[start : start + cfg.batch_size]
            denom = float(tensors["mask"][mb_rows].sum().clamp(min=1))
            step_loss = 0.0
            for local in micro_batches(tensors["attention_mask"][mb_rows].sum(-1).tolist(), params.train.micro_batch_tokens):
                t = select_rows(tensors, [mb_rows[i] for i in local])
                lp, _ = engine(t["input_ids"], t["attention_mask"], score_mask=t["mask"])
                loss = -aggregate_loss(lp, t["mask"], "token-mean", denominator=denom)
                engine.backward(loss)
                step_loss += loss.item()
                tokens += int(t["attention_mask"].sum())
            engine.step()
            losses.append(step_loss)
            log.info("sft epoch %d step %d: nll %.4f", epoch + 1, len(losses), step_loss)
    seconds = time.monotonic() - t0
    export_hf(engine, tokenizer, out_model)
    return {
        "demos": len(demos),
        "grounded_demos": len(rows),
        "optimizer_steps": len(losses),
        "first_nll": losses[0],
        "final_nll": losses[-1],
        "nll": losses,
        "seconds": round(seconds, 1),
        "tokens_per_s": round(tokens / max(seconds, 1e-9), 1),
    }
