"""The normalised record schemas every data source converts into.

Questions: ``id, question, answers (first canonical, rest aliases),
supporting_titles, type, source, split, sub_queries``. ``sub_queries`` holds
one gold search query per hop where the source provides one (the synthetic
world, MuSiQue's decomposition); otherwise the supporting titles stand in.
Corpus: ``doc_id, title, text``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_r1.data.answers import normalize_answer

if TYPE_CHECKING:  # pandas/pyarrow load inside the functions: stages import SchemaError before their params check
    import pandas as pd
    import pyarrow as pa

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

log = logging.getLogger(__name__)


class SchemaError(ValueError):
    """A record violates the normalised schema; the message names where."""


def questions_frame(records: Iterable[Mapping[str, Any]], where: str = "<questions>") -> pd.DataFrame:
    """Build and validate a questions DataFrame from dict records."""
    import pandas as pd

    df = pd.DataFrame(list(records), columns=list(QUESTION_COLUMNS))
    for col in _LIST_COLUMNS:
        df[col] = df[col].map(lambda v: [str(x) for x in v] if v is not None else [])
    kept = df["answers"].map(_scorable_aliases)
    if dropped := int((df["answers"].map(len) - kept.map(len)).sum()):
        log.warning("%s: dropped %d answer aliases that normalise to the empty string", where, dropped)
    df["answers"] = kept
    validate_questions(df, where)
    return df


def _scorable_aliases(answers: list[str]) -> list[str]:
    """The canonical answer and the aliases that are not empty once normalised for EM.

    An alias like ``"The"`` or ``"."`` normalises to ``""``, which an empty prediction
    matches exactly; the canonical answer is kept either way, for
    :func:`validate_questions` to reject by name.
    """
    return answers[:1] + [a for a in answers[1:] if normalize_answer(a)]


def corpus_frame(records: Iterable[Mapping[str, Any]], where: str = "<corpus>") -> pd.DataFrame:
    import pandas as pd

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
        if empty := [a for a in row.answers if not normalize_answer(str(a))]:
            raise SchemaError(
                f"{where}: question id {row.id!r}: answer {empty[0]!r} normalises to the empty string "
                "(an empty prediction would score EM 1); fix or drop the question"
            )


def validate_corpus(df: pd.DataFrame, where: str = "<corpus>") -> None:
    missing = [c for c in CORPUS_COLUMNS if c not in df.columns]
    if missing:
        raise SchemaError(f"{where}: missing columns {missing}")
    if df["doc_id"].duplicated().any():
        dup = df.loc[df["doc_id"].duplicated(), "doc_id"].iloc[0]
        raise SchemaError(f"{where}: duplicate doc_id {dup!r}")


# ------------------------------------------------------------- prepared files
def _string_type(t: pa.DataType) -> bool:
    import pyarrow as pa

    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _column_problem(table: pa.Table, column: str) -> str | None:
    """What is wrong with ``column`` of a prepared table (absent, wrong type, nulls), or None."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if column not in table.column_names:
        return f"missing column {column!r}"
    t = table.schema.field(column).type
    if column in _LIST_COLUMNS:
        ok, want = (pa.types.is_list(t) or pa.types.is_large_list(t)) and _string_type(t.value_type), "list<string>"
    else:
        ok, want = _string_type(t), "string"
    if not ok:
        return f"column {column!r} has type {t}, expected {want}"
    if nulls := table.column(column).null_count:
        return f"column {column!r} has {nulls} null values"
    if column in _LIST_COLUMNS and (nulls := pc.list_flatten(table.column(column)).null_count):
        return f"column {column!r} has {nulls} null list items"
    return None


def _read_prepared(path: str | Path, columns: tuple[str, ...]) -> pd.DataFrame:
    """A parquet file of ``data/prepared`` with every problem named with the file, not as an Arrow traceback."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise SchemaError(f"{path}: not found (run the prepare stage)")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise SchemaError(f"{path}: not a readable parquet file (corrupt or truncated?): {exc}") from None
    problems = [p for c in columns if (p := _column_problem(table, c))]
    if problems:
        raise SchemaError(f"{path}: " + "; ".join(problems) + " (written by another version? re-run the prepare stage)")
    return table.to_pandas()


def _write_prepared(df: pd.DataFrame, path: str | Path, columns: tuple[str, ...]) -> None:
    """``df``'s ``columns`` as parquet with the types readers check: an all-empty list column
    would otherwise be inferred as ``list<null>`` (a source without supporting titles)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    types = {c: pa.list_(pa.string()) if c in _LIST_COLUMNS else pa.string() for c in columns}
    schema = pa.schema([(c, types[c]) for c in columns])
    pq.write_table(pa.Table.from_pandas(df[list(columns)], schema=schema, preserve_index=False), path)


def write_questions(df: pd.DataFrame, path: str | Path) -> None:
    """A questions frame as a prepared file (:func:`read_questions` reads it back)."""
    _write_prepared(df, path, QUESTION_COLUMNS)


def write_corpus(df: pd.DataFrame, path: str | Path) -> None:
    """A corpus frame as a prepared file (:func:`read_corpus` reads it back)."""
    _write_prepared(df, path, CORPUS_COLUMNS)


def read_questions(path: str | Path) -> pd.DataFrame:
    """A prepared questions file (train/test), checked against the schema: columns, types, records."""
    df = _read_prepared(path, QUESTION_COLUMNS)
    validate_questions(df, str(path))
    return df


def read_corpus(path: str | Path) -> pd.DataFrame:
    """The prepared corpus, checked against the schema."""
    df = _read_prepared(path, CORPUS_COLUMNS)
    validate_corpus(df, str(path))
    return df
