"""ZeRO's bucket sizes: plain arithmetic, importable without DeepSpeed.

:mod:`agent_r1.training.models` configures DeepSpeed with them, and ``agent-r1 plan``
(:mod:`agent_r1.memory_plan`) counts the buffers they size without importing DeepSpeed
(seconds of import for a command that answers in a few).
"""

from __future__ import annotations

# DeepSpeed's default ZeRO bucket sizes (elements); ours are never larger.
DEFAULT_BUCKET = 500_000_000
DEFAULT_PREFETCH_BUCKET = 50_000_000
BUCKET_ALIGN = 1 << 20  # DeepSpeed wants allgather buckets a multiple of its NCCL alignment factor


def bucket_elements(n_params: int | None, largest_param: int | None = None) -> int:
    """ZeRO's reduce / all-gather bucket size for a model of ``n_params`` parameters.

    Why: DeepSpeed's default is 5e8 elements whatever the model, and ZeRO-2
    allocates its gradient staging buffer (``contiguous_gradients``) at that
    size on every micro-batch: 2 GB of fp32 for a model a tenth as large. A
    quarter of the model (at least its largest tensor, so no parameter is
    split) keeps the number of reductions per backward small (4-5) while the
    buffer stays a fraction of the gradients' own size. Rounded up to
    :data:`BUCKET_ALIGN`; never above DeepSpeed's default. ``None``: the default.
    """
    if not n_params:
        return DEFAULT_BUCKET
    size = max(-(-n_params // 4), largest_param or 0, 1)
    return min(DEFAULT_BUCKET, -(-size // BUCKET_ALIGN) * BUCKET_ALIGN)
