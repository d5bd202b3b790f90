"""The gradient norm DeepSpeed's ZeRO-1/2 clips by, with a square root every CPU agrees on.

DeepSpeed takes the norm's root with ``Tensor.pow(0.5)``. On CPU, PyTorch computes that
(as ``torch.sqrt``) with MKL's vector math, whose square root is not correctly rounded:
its last bit depends on the CPU it runs on, and clipping scales every gradient by the
norm. Warm-start steps are all clipped, so one such bit was enough to give ``models/sft``
other bytes on an AMD EPYC than on an Intel Xeon. Here the root is ``math.sqrt``, which
IEEE 754 fixes to the correctly rounded value on every CPU; everything else is
DeepSpeed's computation (the per-tensor norms, their sum in float32, the all-reduce).

ZeRO-3's optimizer keeps DeepSpeed's own norm: it is not what the CPU pipeline runs.
"""

from __future__ import annotations

import math
from types import MethodType
from typing import Any

import torch

from agent_r1.accelerator import select_accelerator


def correctly_rounded_grad_norm(optimizer: Any, gradients: list[torch.Tensor], params: list[torch.Tensor],
                                norm_type: float = 2.0) -> torch.Tensor:
    """``DeepSpeedZeroOptimizer.get_grad_norm_direct`` with an exact root (L2 only)::

        ||g||_2 = sqrt( allreduce_sum( float32( sum_i ||g_i||_2^2 ) ) ),   sqrt correctly rounded

    A norm that is inf or NaN comes back as -1, DeepSpeed's sentinel for "skip this step".
    """
    if float(norm_type) != 2.0:
        return type(optimizer).get_grad_norm_direct(optimizer, gradients, params, norm_type)
    select_accelerator()  # deepspeed is imported after it (an engine exists: it is already set)
    from deepspeed import comm as dist
    from deepspeed.runtime.zero.utils import get_norm_dtype

    norms = [
        torch.linalg.vector_norm(g.detach().to(get_norm_dtype()))
        for g in gradients if not getattr(g, "_zero_padding", False)
    ]
    squares = torch.stack(norms).pow(2).sum().float() if norms else torch.zeros((), dtype=torch.float32)
    squares = squares.to(optimizer.device)
    dist.all_reduce(squares, op=dist.ReduceOp.SUM, group=optimizer.dp_process_group)
    total = float(squares)
    root = math.sqrt(total) if math.isfinite(total) else -1.0
    return torch.tensor(root, dtype=torch.float32, device=optimizer.device)


def use_correctly_rounded_grad_norm(engine: Any) -> None:
    """Make a ZeRO-1/2 engine clip by :func:`correctly_rounded_grad_norm`; others are left as they are."""
    select_accelerator()
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    optimizer = engine.optimizer
    if isinstance(optimizer, DeepSpeedZeroOptimizer) and optimizer.model_parallel_world_size == 1:
        optimizer.get_grad_norm_direct = MethodType(correctly_rounded_grad_norm, optimizer)
