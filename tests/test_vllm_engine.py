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


def test_vllm_engine_logprobs_stops_and_in_memory_weight_sync() -> None:
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_VARS}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "tests/isolated/check_vllm_engine.py")],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]
