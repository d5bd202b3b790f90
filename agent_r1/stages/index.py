"""index stage: BM25 and dense indexes over the corpus, plus retrieval metrics.

The metrics compare the whole question as the query with the gold per-hop
sub-queries: a large gap is what makes multi-turn search necessary.
"""

from __future__ import annotations

import logging
from pathlib import Path

from agent_r1 import paths
from agent_r1.config import Params
from agent_r1.io import write_json
from agent_r1.stages.common import run_stage

log = logging.getLogger(__name__)

KINDS = ("bm25", "dense")


def index(
    params: Params,
    *,
    corpus: Path = paths.CORPUS,
    test_questions: Path = paths.TEST_QUESTIONS,
    encoder: Path = paths.ENCODER_DIR,
    out: Path = paths.INDEX_DIR,
    metrics: Path = paths.RETRIEVAL_METRICS,
) -> None:
    """One folder per kind under ``out``; recall@k of each in ``metrics``."""
    # Imported here so that bad params are rejected before the heavy imports.
    from agent_r1.data.schema import read_corpus, read_questions
    from agent_r1.retrieval import build_index
    from agent_r1.retrieval.metrics import retrieval_metrics

    docs = read_corpus(corpus)
    test = read_questions(test_questions)
    top_k = params.retrieval.top_k
    scores: dict = {"top_k": top_k, "agent_index": params.retrieval.index}
    for kind in KINDS:
        log.info("building %s index over %d documents", kind, len(docs))
        idx = build_index(kind, docs, out / kind, params.retrieval, encoder_dir=encoder)
        log.info("retrieval metrics for %s on %d test questions (k=%d)", kind, len(test), top_k)
        scores[kind] = retrieval_metrics(idx, test, top_k)
    write_json(metrics, scores)


if __name__ == "__main__":
    run_stage("index", index, portable_numerics=True)  # downstream is keyed on its bytes
