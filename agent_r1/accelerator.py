"""Which accelerator this process computes on: CUDA when there is a device, the CPU otherwise.

DeepSpeed picks its accelerator once, when it is first imported, from ``DS_ACCELERATOR``
(and guesses when it is unset). So every ``import deepspeed`` in agent_r1 is inside the
function that needs it, right after :func:`select_accelerator`; importing any agent_r1
module leaves the environment alone. Bottom layer: imports only torch and the standard
library, so rollout, evaluation and training alike can ask for :func:`device`.
"""

from __future__ import annotations

import os

import torch


def select_accelerator() -> str:
    """Set ``DS_ACCELERATOR=cpu`` when there is no CUDA device; return the accelerator name.

    An explicit ``DS_ACCELERATOR`` from the user wins. Call it before ``import deepspeed``
    (and before starting the ``deepspeed`` launcher, whose ranks inherit the environment).
    """
    if "DS_ACCELERATOR" not in os.environ and not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"
    return os.environ.get("DS_ACCELERATOR", "cuda")


def on_cpu() -> bool:
    """True when this process computes on the CPU (see :func:`select_accelerator`)."""
    return select_accelerator() == "cpu"


def device() -> torch.device:
    """The device this rank computes on (``cpu``, or ``cuda:LOCAL_RANK``)."""
    if on_cpu():
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
