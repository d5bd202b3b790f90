"""VLLMEngine checks (tests/isolated/check_vllm_engine.py) in a fresh interpreter.

Why a subprocess: vLLM scans every loaded module when it starts, and in a
process that has already imported the rest of the suite's libraries that scan
fails (``'_lib_fn_wrapper' object has no attribute 'get'``). Alone it passes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.dvc_stage import DISTRIBUTED_VARS

pytest.importorskip("vllm")

ROOT = Path(__file__).resolve().parents[1]


def run_isolated(check: str) -> None:
    """pytest on one tests/isolated file in a fresh interpreter; it must pass, none of it skipped."""
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_VARS}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "tests/isolated" / check)],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


# Slow suite: about 2 minutes of a 2-core machine (vLLM's start-up twice), and rollout.engine: vllm
# is not the CPU default; `make test` had grown past its 15 minutes on a 2-core AMD EPYC.
@pytest.mark.slow
def test_vllm_engine_logprobs_stops_and_in_memory_weight_sync() -> None:
    run_isolated("check_vllm_engine.py")


@pytest.mark.slow
def test_train_rl_with_the_vllm_engine_rolls_out_and_syncs_weights() -> None:
    """A one-step train_rl with rollout.engine: vllm (deepspeed, env, BM25 and vLLM in one process)."""
    run_isolated("check_vllm_train_rl.py")


def test_vllm_params_are_checked_with_the_key_named() -> None:
    """Threads beyond the usable cores, or a KV cache smaller than one episode, fail before vLLM loads."""
    from types import SimpleNamespace

    from agent_r1.config import Params
    from agent_r1.rollout.vllm_setup import check_kv_cache, resolve_num_threads, usable_cores

    assert resolve_num_threads(None) == usable_cores() == len(os.sched_getaffinity(0))
    assert resolve_num_threads(1) == 1
    with pytest.raises(ValueError, match=r"rollout\.vllm\.num_threads"):
        resolve_num_threads(usable_cores() + 1)
    # SmolLM2-135M: 30 layers x 3 KV heads x 64 dims, K and V: 46,080 bytes a token in float32
    smol = SimpleNamespace(num_attention_heads=9, num_key_value_heads=3, hidden_size=576, num_hidden_layers=30)
    assert check_kv_cache(smol, "float32", 1.0, 2048) == (1 << 30) // 46_080
    assert check_kv_cache(smol, "bfloat16", 1.0, 2048) == (1 << 30) // 23_040
    with pytest.raises(ValueError, match=r"rollout\.vllm\.kv_cache_gib.*rollout\.max_total_tokens \(2048\)"):
        check_kv_cache(smol, "float32", 0.05, 2048)
    with pytest.raises(ValueError, match=r"rollout\.vllm\.kv_cache_gib"):
        Params.model_validate({"rollout": {"vllm": {"kv_cache_gib": 0}}})
    with pytest.raises(ValueError, match=r"rollout\.vllm\.gpu_memory_utilization"):
        Params.model_validate({"rollout": {"vllm": {"gpu_memory_utilization": 1.5}}})
