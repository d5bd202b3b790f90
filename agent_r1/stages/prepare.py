"""prepare stage: normalised train/val/test questions and the retrieval corpus (parquet)."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from agent_r1 import paths
from agent_r1.config import Params
from agent_r1.data.schema import write_corpus, write_questions
from agent_r1.io import atomic_dir, write_json
from agent_r1.stages.common import run_stage

log = logging.getLogger(__name__)


def summary(questions: pd.DataFrame, corpus: pd.DataFrame) -> dict:
    out: dict = {"corpus_docs": len(corpus)}
    for split, group in questions.groupby("split", sort=True):
        out[split] = {
            "n": len(group),
            "by_type": {k: int(v) for k, v in group["type"].value_counts().sort_index().items()},
            "by_source": {k: int(v) for k, v in group["source"].value_counts().sort_index().items()},
        }
    return out


def prepare(
    params: Params, *, raw: Path = paths.RAW_DIR, out: Path = paths.PREPARED_DIR, metrics: Path = paths.PREPARE_METRICS
) -> None:
    from agent_r1.data.prepare import PREPARED_SPLITS, load_questions_and_corpus

    with atomic_dir(out) as tmp:
        questions, corpus = load_questions_and_corpus(params.data, raw, files_into=tmp)
        log.info("%d questions, %d documents", len(questions), len(corpus))
        for split in PREPARED_SPLITS:
            part = questions[questions["split"] == split].reset_index(drop=True)
            if part.empty and not (split == "val" and params.data.val_questions == 0):
                raise ValueError(f"data.source {params.data.source!r} produced no {split} questions")
            write_questions(part, tmp / f"{split}.parquet")
        write_corpus(corpus, tmp / paths.CORPUS.name)
    write_json(metrics, summary(questions, corpus))


if __name__ == "__main__":
    run_stage("prepare", prepare)
