"""index stage: BM25 and dense indexes over the corpus, plus retrieval metrics.

The metrics compare the whole question as the query with the gold per-hop
sub-queries: a large gap is what makes multi-turn search necessary.
"""

from __future__ import annotations

import logging

from agent_r1 import paths
from agent_r1.config import Params
from agent_r1.io import write_json
from agent_r1.stages.common import run_stage

log = logging.getLogger(__name__)

KINDS = ("bm25", "dense")


def index(params: Params) -> None:
    # Imported here so that bad params are rejected before the heavy imports.
    from agent_r1.data.schema import read_corpus, read_questions
    from agent_r1.retrieval import build_index
    from agent_r1.retrieval.metrics import retrieval_metrics

    corpus = read_corpus(paths.CORPUS)
    test = read_questions(paths.TEST_QUESTIONS)
    top_k = params.retrieval.top_k
    metrics: dict = {"top_k": top_k, "agent_index": params.retrieval.index}
    for kind in KINDS:
        log.info("building %s index over %d documents", kind, len(corpus))
        idx = build_index(kind, corpus, paths.INDEX_DIR / kind, params.retrieval, encoder_dir=paths.ENCODER_DIR)
        log.info("retrieval metrics for %s on %d test questions (k=%d)", kind, len(test), top_k)
        metrics[kind] = retrieval_metrics(idx, test, top_k)
    write_json(paths.RETRIEVAL_METRICS, metrics)


if __name__ == "__main__":
    run_stage("index", index)
