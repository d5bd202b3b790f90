"""Pure RL math over [B, T] trajectory tensors: advantage estimators, losses, KL, masks.

Knows nothing of models, engines or configs; the trainer wires params.yaml's
``algorithm`` group to :func:`compute_advantages` (``algorithm.options``, a plugin
estimator's own settings, as ``options``) and the losses here. The estimators'
names live in :data:`agent_r1.registry.ESTIMATORS`.
"""

from agent_r1.algorithms.advantages import (
    compute_advantages,
    gae,
    grpo,
    reinforce_pp,
    reinforce_pp_baseline,
    rloo,
)
from agent_r1.algorithms.losses import aggregate_loss, entropy_from_logits, kl, policy_loss, value_loss
from agent_r1.algorithms.masking import advantage_mask, loss_mask, masked_mean, masked_whiten, response_mask

__all__ = [
    "advantage_mask",
    "aggregate_loss",
    "compute_advantages",
    "entropy_from_logits",
    "gae",
    "grpo",
    "kl",
    "loss_mask",
    "masked_mean",
    "masked_whiten",
    "policy_loss",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "response_mask",
    "rloo",
    "value_loss",
]
