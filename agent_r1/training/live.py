"""What a training run reports: per-iteration metrics of the rollout, averaged over ranks, to
dvclive (one row per iteration, rebuilt from the history on resume) and the log."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from agent_r1.rollout.trajectory import TrajectoryBatch

log = logging.getLogger(__name__)


def rollout_metrics(batch: TrajectoryBatch) -> dict[str, float]:
    """Means over the iteration's episodes: rewards, EM/F1, behaviour, lengths."""
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
    """Every metric averaged over the ranks (collective when ``world > 1``)."""
    if world == 1:
        return metrics
    import torch.distributed as dist

    keys = sorted(metrics)
    t = torch.tensor([metrics[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    return {k: float(v) / world for k, v in zip(keys, t.tolist())}


def log_iteration(step: int, steps: int, metrics: dict[str, float]) -> None:
    log.info(
        "step %d/%d reward %.3f em %.3f answer %.2f calls %.2f | rollout %.0fs update %.0fs%s",
        step + 1, steps, metrics["reward"], metrics["em"], metrics["answer_rate"], metrics["tool_calls"],
        metrics["time/rollout_s"], metrics["time/update_s"],
        f" | eval em {metrics['eval/em']:.3f}" if "eval/em" in metrics else "",
    )


def log_metrics(live: Any, metrics: dict[str, float]) -> None:
    """One dvclive row: ``train/<name>`` unless the name has its own prefix (``eval/``, ``time/``)."""
    for k, v in metrics.items():
        live.log_metric(f"train/{k}" if "/" not in k else k, v)
    live.next_step()


def open_live(live_dir: Path, history: list[dict[str, float]]) -> Any:
    """A fresh dvclive folder holding exactly ``history`` (one row per iteration), so a resumed
    run's plots and summary are those of an uninterrupted run, whatever a killed one left."""
    from dvclive import Live

    live = Live(str(live_dir), resume=False, save_dvc_exp=False, dvcyaml=None)
    for metrics in history:
        log_metrics(live, metrics)
    return live
