"""report stage: reports/results.md (Table-3-shaped) and its bar chart."""

from __future__ import annotations

import logging

from agent_r1 import paths
from agent_r1.config import Params
from agent_r1.stages.common import run_stage

log = logging.getLogger(__name__)


def report(params: Params) -> None:
    import pandas as pd

    from agent_r1.evaluation.report import write_report

    # In-domain = the sources the policy trains on; every other test source is out-of-domain.
    in_domain = sorted(pd.read_parquet(paths.TRAIN_QUESTIONS, columns=["source"])["source"].unique())
    text = write_report(paths.EVAL_METRICS_DIR, in_domain, paths.RESULTS_MD, paths.RESULTS_PNG)
    print(text)


if __name__ == "__main__":
    run_stage("report", report)
