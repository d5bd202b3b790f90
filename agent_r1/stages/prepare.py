"""prepare stage: normalised train/test questions and the retrieval corpus (parquet)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pandas as pd

from agent_r1 import paths
from agent_r1.config import Params
from agent_r1.io import atomic_dir, write_json
from agent_r1.stages.common import run_stage

log = logging.getLogger(__name__)


def load_source(params: Params, raw: Path = paths.RAW_DIR) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Questions (with ``split`` set) and corpus for the configured source(s).

    Real sources: each in-domain source is split into train/test by a hash of the
    question id; every question of a ``data.test_only`` source is a test question.
    The corpus is the union, a paragraph shared by two sources kept once.
    """
    data = params.data
    if data.source == "synthetic":
        from agent_r1.data.synthetic import generate

        return generate(data.synthetic, data.seed)

    from agent_r1.data.official import read_official, split_questions

    manifest_file = raw / paths.RAW_SOURCE.name
    manifest = json.loads(manifest_file.read_text())
    held = sorted(manifest.get("sources", {}))
    if held != sorted(data.real_sources):
        raise ValueError(
            f"{manifest_file} holds {held} but data.source + data.test_only name {data.real_sources}: "
            "run the download stage"
        )
    questions, corpora = [], []
    for source in data.real_sources:
        q, c = read_official(source, raw / manifest["sources"][source], data.real.max_questions)
        if source in data.test_only:
            q = q.assign(split="test")
        else:
            q = split_questions(q, data.real.test_fraction, data.seed)
        questions.append(q)
        corpora.append(c)
    corpus = pd.concat(corpora, ignore_index=True).drop_duplicates(["title", "text"], ignore_index=True)
    return pd.concat(questions, ignore_index=True), corpus


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
    questions, corpus = load_source(params, raw)
    log.info("%d questions, %d documents", len(questions), len(corpus))
    with atomic_dir(out) as tmp:
        for split in ("train", "test"):
            part = questions[questions["split"] == split].reset_index(drop=True)
            if part.empty:
                raise ValueError(f"data.source {params.data.source!r} produced no {split} questions")
            part.to_parquet(tmp / f"{split}.parquet", index=False)
        corpus.to_parquet(tmp / paths.CORPUS.name, index=False)
    write_json(metrics, summary(questions, corpus))


if __name__ == "__main__":
    run_stage("prepare", prepare)
