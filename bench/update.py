"""One actor update on synthetic trajectories, in this process: ours or a plain torch loop (a worker of bench/train.py).

Ours: ``loop.build_models`` + ``loop.update_from_rollout`` exactly as ``train_rl``
calls them (DeepSpeed ZeRO-2 engine, bf16, token-budget micro-batches, chunked
log-probs); the times are the update's own ``time/update_s`` and
``time/actor_step_s`` (its optimizer steps). Plain torch: the same model in
fp32 under ``torch.autocast(bf16)``, fixed micro-batches of ``micro_rows``
rows in batch order padded to their longest row, full-vocabulary float32
log-softmax, the same advantages and PPO loss (the trainer's), grad clipping
and torch AdamW.

Mode ``throughput``: a warm-up update, then ``reps`` timed ones (medians);
mode ``memory``: one update, with its peak above the loaded model (VmHWM reset
just before it).

    python bench/update.py --spec SPEC.json     (bench/train.py writes the spec)
"""

from __future__ import annotations

import inspect
import resource
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.batches import batch_stats, plan_stats, synthetic_batch  # noqa: E402
from bench.flops import model_shape  # noqa: E402
from bench.harness import bench_params, status_kib, worker_main  # noqa: E402

# run(batch) -> (update seconds, of which optimizer step seconds)
Update = Callable[[Any], tuple[float, float]]


def update_params(spec: dict, rows: int) -> Any:
    """The actor-only update config: one on-policy mini-batch of ``rows`` trajectories
    (``spec['train']``: further ``train`` overrides, e.g. the padded path's ``pack: false``)."""
    over = {"algorithm": {"name": "grpo", "kl_coef": 0.0, "entropy_coef": 0.0},
            "train": {"mini_batch_size": rows, "ppo_epochs": 1, **spec.get("train", {})}}  # fmt: skip
    return bench_params({**spec, "overrides": over})


def make_ours(spec: dict, rows: int) -> tuple[Update, Any, Any]:
    """``(run, the model, the params)`` with the trainer's models and update."""
    from agent_r1.training.models import unwrap
    from agent_r1.training.loop import build_models, update_from_rollout

    params = update_params(spec, rows)
    models = build_models(params, Path(spec["model"]))

    def run(batch: Any) -> tuple[float, float]:
        metrics = update_from_rollout(params, models, batch, world=1)
        return float(metrics["time/update_s"]), float(metrics["time/actor_step_s"])

    return run, unwrap(models.actor), params


def naive_update(model: Any, opt: Any, params: Any, micro_rows: int, batch: Any) -> tuple[float, float]:
    """One update of the plain torch loop; ``(seconds, of which optimizer step seconds)``."""
    import torch

    from agent_r1.algorithms import policy_loss
    from agent_r1.training.loop import estimator_settings
    from agent_r1.training.samples import flat_samples

    cfg, alg = params.train, params.algorithm
    start = time.perf_counter()
    samples = flat_samples(batch, alg.loss_mask)
    adv, _ = samples.credit.advantages(None, estimator_settings(params))
    mask = samples.loss_mask
    denom = max(float(mask.sum()), 1.0)
    lengths = batch.attention_mask.sum(-1)
    for first in range(0, len(batch), micro_rows):
        rows = list(range(first, min(first + micro_rows, len(batch))))
        width = int(lengths[rows].max())
        ids, am = batch.input_ids[rows, :width], batch.attention_mask[rows, :width]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            logits = model(input_ids=ids, attention_mask=am).logits
        logp = torch.log_softmax(logits.float(), dim=-1)
        picked = logp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
        lp = torch.cat([picked.new_zeros(len(rows), 1), picked], dim=1)
        loss, _ = policy_loss(
            lp, lp.detach(), adv[rows, :width], mask[rows, :width], clip_ratio=alg.clip_ratio,
            clip_ratio_high=alg.clip_ratio_high, dual_clip=alg.dual_clip, agg="token-mean", denominator=denom,
        )  # fmt: skip
        loss.backward()
        del logits, logp, picked, lp, loss
    step_start = time.perf_counter()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    end = time.perf_counter()
    return end - start, end - step_start


def make_naive(spec: dict, rows: int, micro_rows: int) -> tuple[Update, Any, Any]:
    """The plain torch loop: fp32 weights under bf16 autocast, full-vocabulary float32 log-softmax."""
    import torch
    from transformers import AutoModelForCausalLM

    from agent_r1.training.models import optimizer_groups

    params = update_params(spec, rows)
    cfg = params.train
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    model.config.use_cache = False
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = torch.optim.AdamW(optimizer_groups(model, cfg.weight_decay), lr=cfg.actor_lr, betas=(0.9, 0.999), eps=1e-8)
    return partial(naive_update, model, opt, params, micro_rows), model, params


def head_scores_loss_tokens_only() -> bool:
    """Whether our engine runs the LM head only under the loss mask (``LogprobModel(score_mask=)``)."""
    from agent_r1.training.logprobs import LogprobModel

    return "score_mask" in inspect.signature(LogprobModel.forward).parameters


def reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        return True
    except OSError:
        return False


def memory_fields(rss_before: int | None, reset: bool) -> dict:
    hwm = status_kib("VmHWM")
    return {
        "ru_maxrss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "rss_before_update_mib": round(rss_before / 1024) if rss_before else None,
        "update_peak_above_loaded_mib": round((hwm - rss_before) / 1024) if reset and hwm and rss_before else None,
    }


def describe(spec: dict, model: Any, params: Any, batch: Any) -> dict:
    """The measurement's setting: model shape, batch, the forwards' plan (micro-batches, padding)."""
    import torch

    from agent_r1.training.batching import micro_batches
    from agent_r1.training.samples import flat_samples

    ours, rows = spec["method"] == "ours", spec["rows"]
    out: dict[str, Any] = {"method": spec["method"], "shape": model_shape(model), "batch": batch_stats(batch),
                           "threads": torch.get_num_threads(),
                           "gradient_checkpointing": params.train.gradient_checkpointing,
                           "bf16": params.train.bf16, "micro_batch_tokens": params.train.micro_batch_tokens,
                           "pack": ours and params.train.pack}  # fmt: skip
    lengths = batch.attention_mask.sum(-1).tolist()
    out["batch"]["loss_tokens"] = int(flat_samples(batch, params.algorithm.loss_mask).loss_mask[:, 1:].sum())  # column 0 is never read
    if ours:
        packed = params.train.pack
        out["plan"] = plan_stats(lengths, micro_batches(lengths, params.train.micro_batch_tokens, packed), packed)
        out["head_on_loss_tokens_only"] = head_scores_loss_tokens_only()
    else:
        out["micro_rows"] = micro = spec.get("micro_rows") or rows
        out["plan"] = plan_stats(lengths, [list(range(i, min(i + micro, rows))) for i in range(0, rows, micro)])
    return out


def timed_updates(run: Update, spec: dict, warmup: Any, batch: Any) -> dict:
    """A warm-up update (when ``warmup``), then ``spec['reps']`` timed ones: their times and medians."""
    out: dict[str, Any] = {}
    if warmup is not None:
        out["warmup_s"] = run(warmup)[0]
    reps = [run(batch) for _ in range(spec["reps"])]
    out["update_s_reps"] = [r[0] for r in reps]
    out["optimizer_step_s_reps"] = [r[1] for r in reps]
    out["update_s"] = statistics.median(out["update_s_reps"])
    out["optimizer_step_s"] = statistics.median(out["optimizer_step_s_reps"])
    return out


def worker_update(spec: dict) -> dict:
    """Throughput (``spec['warmup_rows']`` warm-up update, then ``reps`` timed) or memory (one update)."""
    import torch

    from agent_r1.training.distributed import init_distributed

    torch.manual_seed(spec["seed"])
    rows = spec["rows"]
    if spec["method"] == "ours":
        init_distributed()
        run, model, params = make_ours(spec, rows)
    else:
        run, model, params = make_naive(spec, rows, spec.get("micro_rows") or rows)
    vocab = model.get_input_embeddings().weight.shape[0]
    make = partial(synthetic_batch, min_len=spec["min_len"], max_len=spec["max_len"], action_frac=spec["action_frac"],
                   vocab=vocab, group_size=spec["group_size"])
    batch = make(rows, seed=spec["seed"])
    out = describe(spec, model, params, batch)
    if spec["mode"] == "memory":
        rss_before = status_kib("VmRSS")
        reset = reset_peak()
        out["update_s"], out["optimizer_step_s"] = run(batch)
        return {**out, **memory_fields(rss_before, reset)}
    warmup = make(spec["warmup_rows"], seed=spec["seed"] + 1) if spec["warmup_rows"] else None
    out.update(timed_updates(run, spec, warmup, batch))
    out["tokens_per_s"] = out["batch"]["tokens"] / out["update_s"]
    return {**out, **memory_fields(None, False)}


if __name__ == "__main__":
    worker_main(worker_update, __doc__)
