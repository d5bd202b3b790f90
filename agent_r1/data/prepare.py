"""The prepare stage's data layer: the configured sources' questions (``split`` set) and one corpus.

Dispatches on the source objects (:mod:`agent_r1.data.sources`), never on names:
a generated source's frames are used as it gives them; each downloaded source
reads its file from ``data/raw`` (``source.json`` names it), and its questions
are split into train/test by a hash of the question id, or are all test
questions for a ``data.test_only`` source. The corpus is the union, a
paragraph shared by two sources kept once. What a source returns is checked
against the normalised schema here, so a plugin's mistake is an error naming
``data.source`` instead of a crash in a later stage.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd

from agent_r1.config import DataConfig
from agent_r1.data.schema import SchemaError, validate_corpus, validate_questions
from agent_r1.data.sources import get_source
from agent_r1.paths import RAW_SOURCE

SPLITS: tuple[str, ...] = ("train", "test")  # what a source assigns; prepare then carves "val" out of train
PREPARED_SPLITS: tuple[str, ...] = ("train", "val", "test")


def load_questions_and_corpus(
    data: DataConfig, raw_dir: Path, files_into: Path | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Questions (``split``: train / val / test) and corpus for ``data.source`` (+ ``data.test_only``);
    with ``files_into``, the files the questions refer to (a game per record) are written there."""
    questions, corpus = _source_questions_and_corpus(data, raw_dir, files_into)
    return carve_validation(questions, data.val_questions, data.seed), corpus


def carve_validation(questions: pd.DataFrame, per_source: int, seed: int) -> pd.DataFrame:
    """Move ``per_source`` train questions of each source to split "val": those with the smallest hash of
    (seed, id), so the choice is stable under reordering and subsetting, like the test split's."""
    out = questions.copy()
    if per_source == 0:
        return out
    for source, group in out[out["split"] == "train"].groupby("source", sort=True):
        if len(group) <= per_source:
            raise ValueError(
                f"data.val_questions={per_source}: source {source!r} has only {len(group)} train questions, which "
                "would leave none to train on; lower data.val_questions or add questions"
            )
        u = pd.Series([_unit_hash(seed + 1, qid) for qid in group["id"]], index=group.index)
        out.loc[u.nsmallest(per_source).index, "split"] = "val"
    return out


def _source_questions_and_corpus(
    data: DataConfig, raw_dir: Path, files_into: Path | None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Questions (split train / test) and corpus, as the sources give them (and their files)."""
    downloaded = data.downloaded_sources
    if not downloaded:
        source = get_source(data.source, data.options)
        questions, corpus = source.generate(data)
        _check(questions, corpus, f"data.source {data.source!r}")
        if bad := sorted(set(questions["split"]) - set(SPLITS)):
            raise SchemaError(f"data.source {data.source!r}: generated questions with split {bad}; use train / test")
        if files_into is not None:
            source.write_files(questions, files_into)
        return questions, corpus
    files = _raw_files(Path(raw_dir), downloaded)
    questions, corpora = [], []
    for name in downloaded:
        source = get_source(name, data.options)
        q, c = source.read(Path(raw_dir) / files[name], data.real.max_questions)
        _check(q, c, f"data.source {name!r}")
        if files_into is not None:
            source.write_files(q, files_into)
        if name in data.test_only:
            q = q.assign(split="test")
        else:
            q = split_questions(q, data.real.test_fraction, data.seed)
        questions.append(q)
        corpora.append(c)
    corpus = pd.concat(corpora, ignore_index=True).drop_duplicates(["title", "text"], ignore_index=True)
    questions_all = pd.concat(questions, ignore_index=True)
    if len(downloaded) > 1:  # ids and doc ids must not collide across sources either
        _check(questions_all, corpus, f"data.source + data.test_only {downloaded}")
    return questions_all, corpus


def _check(questions: pd.DataFrame, corpus: pd.DataFrame, where: str) -> None:
    """What a source returned is in the normalised schema and the corpus is not empty (an index needs a document)."""
    if not isinstance(questions, pd.DataFrame) or not isinstance(corpus, pd.DataFrame):
        raise SchemaError(f"{where}: must return (questions, corpus) DataFrames, got "
                          f"({type(questions).__name__}, {type(corpus).__name__})")
    validate_questions(questions, f"{where} questions")
    validate_corpus(corpus, f"{where} corpus")
    if corpus.empty:
        raise SchemaError(f"{where}: the corpus is empty; the search index needs at least one document")


def _raw_files(raw_dir: Path, downloaded: list[str]) -> dict[str, str]:
    """``source.json``'s file of each source, relative to ``raw_dir``; it must hold exactly the sources params name."""
    manifest_path = raw_dir / RAW_SOURCE.name
    manifest = json.loads(manifest_path.read_text())
    held = sorted(manifest.get("sources", {}))
    if held != sorted(downloaded):
        raise ValueError(
            f"{manifest_path} holds {held} but data.source + data.test_only name {downloaded}: "
            "run the download stage"
        )
    return manifest["sources"]


def split_questions(questions: pd.DataFrame, test_fraction: float, seed: int) -> pd.DataFrame:
    """Assign ``split`` = "train" / "test" from a hash of (seed, id): stable under reordering and subsetting.

    A question keeps its side whatever else is in the file, and no global RNG
    is touched. When a set of two or more questions would land entirely on
    one side, the question whose hash is nearest the cut moves over, so both
    splits are non-empty.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    u = np.array([_unit_hash(seed, qid) for qid in questions["id"]])
    is_test = u < test_fraction
    if len(u) >= 2 and (is_test.all() or not is_test.any()):
        nearest = int(np.argmin(np.abs(u - test_fraction)))
        is_test[nearest] = not is_test[nearest]
    out = questions.copy()
    out["split"] = np.where(is_test, "test", "train")
    return out


def _unit_hash(seed: int, qid: str) -> float:
    """A uniform number in [0, 1) fixed by (seed, id)."""
    return int.from_bytes(hashlib.sha256(f"{seed}\n{qid}".encode()).digest()[:8], "big") / 2**64
