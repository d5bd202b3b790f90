"""The normalised record schemas every data source converts into (DESIGN.md, "Contracts").

Questions: ``id, question, answers (first canonical, rest aliases),
supporting_titles, type, source, split, sub_queries``. ``sub_queries`` holds
one gold search query per hop where the source provides one (the synthetic
world, MuSiQue's decomposition); otherwise the supporting titles stand in.
Corpus: ``doc_id, title, text``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

QUESTION_COLUMNS: tuple[str, ...] = (
    "id",
    "question",
    "answers",
    "supporting_titles",
    "type",
    "source",
    "split",
    "sub_queries",
)
CORPUS_COLUMNS: tuple[str, ...] = ("doc_id", "title", "text")
_LIST_COLUMNS = ("answers", "supporting_titles", "sub_queries")


class SchemaError(ValueError):
    """A record violates the normalised schema; the message names where."""


def questions_frame(records: Iterable[Mapping[str, Any]], where: str = "<questions>") -> pd.DataFrame:
    """Build and validate a questions DataFrame from dict records."""
    df = pd.DataFrame(list(records), columns=list(QUESTION_COLUMNS))
    for col in _LIST_COLUMNS:
        df[col] = df[col].map(lambda v: [str(x) for x in v] if v is not None else [])
    validate_questions(df, where)
    return df


def corpus_frame(records: Iterable[Mapping[str, Any]], where: str = "<corpus>") -> pd.DataFrame:
    df = pd.DataFrame(list(records), columns=list(CORPUS_COLUMNS))
    validate_corpus(df, where)
    return df


def validate_questions(df: pd.DataFrame, where: str = "<questions>") -> None:
    missing = [c for c in QUESTION_COLUMNS if c not in df.columns]
    if missing:
        raise SchemaError(f"{where}: missing columns {missing}")
    if df["id"].duplicated().any():
        dup = df.loc[df["id"].duplicated(), "id"].iloc[0]
        raise SchemaError(f"{where}: duplicate question id {dup!r}")
    for i, row in enumerate(df.itertuples(index=False)):
        if not isinstance(row.question, str) or not row.question.strip():
            raise SchemaError(f"{where}: record {i} (id {row.id!r}) has an empty question")
        if len(row.answers) == 0:
            raise SchemaError(f"{where}: record {i} (id {row.id!r}) has no answers")


def validate_corpus(df: pd.DataFrame, where: str = "<corpus>") -> None:
    missing = [c for c in CORPUS_COLUMNS if c not in df.columns]
    if missing:
        raise SchemaError(f"{where}: missing columns {missing}")
    if df["doc_id"].duplicated().any():
        dup = df.loc[df["doc_id"].duplicated(), "doc_id"].iloc[0]
        raise SchemaError(f"{where}: duplicate doc_id {dup!r}")
