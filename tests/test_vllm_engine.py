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


def test_vllm_engine_logprobs_stops_and_in_memory_weight_sync() -> None:
    run_isolated("check_vllm_engine.py")


@pytest.mark.slow
def test_train_rl_with_the_vllm_engine_rolls_out_and_syncs_weights() -> None:
    """A one-step train_rl with rollout.engine: vllm (deepspeed, env, BM25 and vLLM in one process)."""
    run_isolated("check_vllm_train_rl.py")
