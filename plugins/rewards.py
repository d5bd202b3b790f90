"""An outcome reward with a setting of its own, configured from ``params.yaml`` alone::

    env:
      reward:
        scheme: plugins.rewards:em_f1_reward
        options: {weight: 0.5}
"""

from __future__ import annotations

from pydantic import Field

from agent_r1.config import PluginOptions, RewardConfig
from agent_r1.env import exact_match, f1_score


class EmF1Options(PluginOptions):
    """``env.reward.options`` of :func:`em_f1_reward`."""

    weight: float = Field(0.5, ge=0.0, le=1.0, description="share of exact match in the answer score; the rest is F1")


def em_f1_reward(
    answer: str | None, golds: list[str], format_valid: bool, cfg: RewardConfig, options: EmF1Options
) -> float:
    """``weight * EM + (1 - weight) * F1`` of a valid answer, else ``format_score - 1`` (as ``paper``):
    full reward only for the exact answer, partial credit for overlapping tokens.
    ``env.reward.answer_metric`` is not read: the weight sets the mix of both."""
    if not format_valid or answer is None:
        return cfg.format_score - 1.0
    return options.weight * exact_match(answer, golds) + (1.0 - options.weight) * f1_score(answer, golds)


em_f1_reward.Options = EmF1Options  # type: ignore[attr-defined]  # what the registry reads (see agent_r1.registry)
