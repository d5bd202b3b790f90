"""Readers for the official HotpotQA, 2WikiMultihopQA and MuSiQue files.

Each reader takes the file exactly as its authors publish it and yields the
normalised schema (:mod:`agent_r1.data.schema`): one question record per
answerable question and one corpus document per distinct context paragraph.
Why this shape:

- The retrieval corpus is the union of all context paragraphs (gold and
  distractors). Paragraphs repeat across questions, so identical
  ``(title, text)`` pairs are stored once, under a ``doc_id`` that is a hash of
  the pair: the same paragraph gets the same id in every run and every file.
- Paragraph text is the sentences stripped and joined with one space
  (HotpotQA keeps a leading space on most sentences; 2Wiki does not), so the
  same paragraph from either source reads and hashes alike.
- ``supporting_titles`` follow the order of the supporting facts (MuSiQue:
  the order of the decomposition hops), which is the order an agent should
  find them in. ``sub_queries`` are one gold search query per hop: MuSiQue's
  decomposition with ``#k`` replaced by hop k's answer and its Wikidata-style
  ``"Green >> performer"`` rewritten as ``"performer of Green"``; for HotpotQA
  and 2Wiki the supporting titles stand in.
- ``type``: HotpotQA and 2Wiki keep their own (bridge / comparison;
  comparison / inference / compositional / bridge_comparison). MuSiQue gets
  its hop count from the id prefix (``"2hop__..."`` -> ``"2hop"``, also
  ``3hop1__`` / ``4hop3__`` ...), falling back to ``"compositional"``.
- MuSiQue-Full's unanswerable records (``answerable: false``) are skipped and
  counted in the log; an agent cannot be rewarded on them.

Every problem raises :class:`OfficialFormatError` naming the file, the
line/column (JSON syntax) or line (JSON Lines), and the record index, id and
field, so a truncated download or a wrong ``--source`` reads as one clear
sentence rather than a traceback.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from abc import abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
from tqdm import tqdm

from agent_r1.data.download import DownloadError, download_official  # noqa: F401  (re-exported)
from agent_r1.data.schema import SchemaError, corpus_frame, questions_frame
from agent_r1.data.sources import DataSource, get_source
from agent_r1.io import atomic_path

log = logging.getLogger(__name__)

QUESTIONS_FILE = "questions.parquet"
CORPUS_FILE = "corpus.parquet"
_MISSING = object()


class OfficialFormatError(SchemaError):
    """An official dataset file is not in the published format; the message names file, line/record and field."""


# ------------------------------------------------------------------ file level
def _read_text(path: Path) -> str:
    """The file as text; decoding problems name the line, since they usually mean a cut-off download."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise OfficialFormatError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise OfficialFormatError(f"{path}: is a directory, expected the official JSON / JSONL file") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise OfficialFormatError(
            f"{path}: line {line}: not valid UTF-8 at byte {exc.start} (truncated or not a text file?)"
        ) from None
    if not text.strip():
        raise OfficialFormatError(f"{path}: file is empty")
    return text


def _json_error(
    path: Path, exc: json.JSONDecodeError, line: int, ends_early: bool, hint: str = ""
) -> OfficialFormatError:
    """One message for a JSON syntax error: file, line, column, and a truncation hint when the text stops short."""
    msg = "Unterminated string" if exc.msg.startswith("Unterminated string") else exc.msg
    if ends_early:
        hint = "; the text ends early: truncated or incomplete download?"
    return OfficialFormatError(f"{path}: invalid JSON at line {line} column {exc.colno}: {msg}{hint}")


def _json_limit_error(path: Path, exc: Exception, where: str = "") -> OfficialFormatError:
    """Valid JSON syntax past Python's limits: a number over 4300 digits, nesting deeper than the stack."""
    what = "nesting too deep" if isinstance(exc, RecursionError) else str(exc).split(";")[0]
    return OfficialFormatError(f"{path}: {where}JSON the parser cannot hold ({what})")


def _json_records(path: Path) -> Iterator[tuple[str, Any]]:
    """``(label, record)`` for a file holding one JSON list (HotpotQA, 2Wiki); label = "record i"."""
    text = _read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        hint = " (a JSON Lines file? that is MuSiQue's format)" if exc.msg == "Extra data" else ""
        ends_early = exc.msg.startswith("Unterminated") or exc.pos >= len(text.rstrip())
        raise _json_error(path, exc, exc.lineno, ends_early, hint) from None
    except (ValueError, RecursionError) as exc:
        raise _json_limit_error(path, exc) from None
    if not isinstance(data, list):
        raise OfficialFormatError(f"{path}: expected a JSON list of records, got a JSON {type(data).__name__}")
    for i, rec in enumerate(data):
        yield f"record {i}", rec


def _jsonl_records(path: Path) -> Iterator[tuple[str, Any]]:
    """``(label, record)`` for a JSON Lines file (MuSiQue); label = "line n (record i)"; blank lines pass."""
    text = _read_text(path)
    lines = text.split("\n")  # not splitlines(): JSON strings may hold a raw U+2028
    i = 0
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            last = lineno == len(lines)  # no newline after it: the file stops mid-record
            hint = ""
            if lineno == 1 and line.lstrip().startswith("["):
                hint = " (one JSON list? that is HotpotQA's and 2Wiki's format, not MuSiQue's JSON Lines)"
            raise _json_error(path, exc, lineno, last, hint) from None
        except (ValueError, RecursionError) as exc:
            raise _json_limit_error(path, exc, f"line {lineno}: ") from None
        yield f"line {lineno} (record {i})", rec
        i += 1


# ---------------------------------------------------------------- field level
_KIND_NAMES = {str: "a string", int: "an integer", list: "a list", dict: "an object", bool: "true/false"}


def _get(rec: dict, key: str, kind: type | tuple[type, ...], where: str, default: Any = _MISSING) -> Any:
    """``rec[key]`` checked against ``kind``; a missing or ill-typed field names record and key."""
    if key not in rec:
        if default is not _MISSING:
            return default
        raise OfficialFormatError(f"{where}: {key!r} missing")
    value = rec[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        want = " or ".join(_KIND_NAMES.get(k, "null" if k is type(None) else k.__name__) for k in kinds)
        raise OfficialFormatError(f"{where}: {key!r} must be {want}, got {_preview(value)}")
    return value


def _preview(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def _surrogate_at(value: Any, path: str = "") -> str | None:
    """Where in ``value`` a string holds an unpaired UTF-16 surrogate (a lone ``\\ud800``-style JSON escape).

    Such a string is no text: it cannot be encoded, hashed into a doc id, written to parquet or printed.
    """
    if isinstance(value, str):
        return path if any("\ud800" <= ch <= "\udfff" for ch in value) else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        sub = f"{path}[{key!r}]"
        found = _surrogate_at(key, f"{sub} (the key)") or _surrogate_at(item, sub)
        if found is not None:
            return found
    return None


def _record(rec: Any, where: str, id_key: str) -> tuple[dict, str]:
    """Check that the record is an object with an id; return it and ``where`` extended by the id."""
    try:
        json.dumps(rec, ensure_ascii=False).encode()  # fast path: the walk below only runs on a failure
    except UnicodeEncodeError:
        raise OfficialFormatError(
            f"{where}: record{_surrogate_at(rec)} holds an unpaired UTF-16 surrogate escape, not valid text"
        ) from None
    if not isinstance(rec, dict):
        raise OfficialFormatError(f"{where}: expected a JSON object, got {_preview(rec)}")
    qid = _get(rec, id_key, str, where)
    return rec, f"{where} (id {qid})"


def _answer(rec: dict, where: str) -> str:
    if "answer" not in rec:
        raise OfficialFormatError(
            f"{where}: 'answer' missing. Official test files (HotpotQA hotpot_test_*.json, 2Wiki test.json, "
            "MuSiQue *_test.jsonl) carry no answers and cannot be converted: use the train or dev file"
        )
    answer = _get(rec, "answer", str, where)
    if not answer.strip():
        raise OfficialFormatError(f"{where}: 'answer' is empty")
    return answer


def _question(rec: dict, where: str) -> str:
    question = _get(rec, "question", str, where)
    if not question.strip():
        raise OfficialFormatError(f"{where}: 'question' is empty")
    return question


def _dedup(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _join(sentences: list[str]) -> str:
    return " ".join(s.strip() for s in sentences if s.strip())


def doc_id(source: str, title: str, text: str) -> str:
    """Deterministic corpus id: the same paragraph gets the same id in every run."""
    return f"{source}-" + hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()[:16]


# --------------------------------------------------------------- HotpotQA, 2Wiki
def _context(rec: dict, where: str) -> list[tuple[str, str]]:
    """``context: [[title, [sentence, ...]], ...]`` -> ``[(title, text), ...]``."""
    out = []
    for j, item in enumerate(_get(rec, "context", list, where)):
        ok = (
            isinstance(item, list)
            and len(item) == 2
            and isinstance(item[0], str)
            and isinstance(item[1], list)
            and all(isinstance(s, str) for s in item[1])
        )
        if not ok:
            raise OfficialFormatError(
                f"{where}: 'context'[{j}] must be [title, [sentence, ...]], got {_preview(item)}"
            )
        out.append((item[0], _join(item[1])))
    return out


def _supporting_titles(rec: dict, where: str) -> list[str]:
    """Titles of ``supporting_facts: [[title, sent_id], ...]`` in order, deduplicated."""
    titles = []
    for j, item in enumerate(_get(rec, "supporting_facts", list, where)):
        ok = (
            isinstance(item, list)
            and len(item) == 2
            and isinstance(item[0], str)
            and isinstance(item[1], int)
            and not isinstance(item[1], bool)
        )
        if not ok:
            raise OfficialFormatError(
                f"{where}: 'supporting_facts'[{j}] must be [title, sentence index], got {_preview(item)}"
            )
        titles.append(item[0])
    return _dedup(titles)


def _hotpot_like(
    source: str, rec: Any, where: str, alias_keys: tuple[str, ...] = ()
) -> tuple[dict, list[tuple[str, str]]]:
    """One HotpotQA / 2Wiki record -> (question record, its paragraphs). Both share HotpotQA's layout;
    ``alias_keys`` are the optional fields holding answer aliases."""
    rec, where = _record(rec, where, "_id")
    answer = _answer(rec, where)
    question = _question(rec, where)
    qtype = _get(rec, "type", str, where)
    paragraphs = _context(rec, where)
    titles = _supporting_titles(rec, where)
    aliases: list[str] = []
    for key in alias_keys:
        value = _get(rec, key, list, where, default=[])
        if not all(isinstance(a, str) for a in value):
            raise OfficialFormatError(f"{where}: {key!r} must be a list of strings, got {_preview(value)}")
        aliases += value
    q = {
        "id": rec["_id"],
        "question": question,
        "answers": _dedup([answer, *aliases]),
        "supporting_titles": titles,
        "type": qtype,
        "source": source,
        "split": "unsplit",
        "sub_queries": titles,
    }
    return q, paragraphs


# ---------------------------------------------------------------------- MuSiQue
_HOP_REF = re.compile(r"#(\d+)\b")
_HOP_PREFIX = re.compile(r"^(\d+)hop")


def resolve_hop(question: str, previous_answers: list[str]) -> str:
    """A decomposition step as a search query: ``#k`` -> hop k's answer, ``"X >> rel"`` -> ``"rel of X"``.

    Only references to earlier hops are replaced, so titles such as ``"#9 Dream"``
    in a first hop stay literal.
    """

    def sub(m: re.Match) -> str:
        k = int(m.group(1))
        return previous_answers[k - 1] if 1 <= k <= len(previous_answers) else m.group(0)

    query = _HOP_REF.sub(sub, question)
    if query.count(" >> ") == 1:
        subject, relation = query.split(" >> ")
        query = f"{relation.strip()} of {subject.strip()}"
    return query


def _musique_type(qid: str) -> str:
    m = _HOP_PREFIX.match(qid)
    return f"{m.group(1)}hop" if m else "compositional"


def _musique(rec: Any, where: str) -> tuple[dict, list[tuple[str, str]]] | None:
    """One MuSiQue record -> (question record, its paragraphs), or None when it is unanswerable."""
    rec, where = _record(rec, where, "id")
    if not _get(rec, "answerable", bool, where, default=True):
        return None
    answer = _answer(rec, where)
    question = _question(rec, where)
    aliases = _get(rec, "answer_aliases", list, where, default=[])
    if not all(isinstance(a, str) for a in aliases):
        raise OfficialFormatError(f"{where}: 'answer_aliases' must be a list of strings, got {_preview(aliases)}")

    by_idx: dict[int, str] = {}
    paragraphs, supporting = [], []
    for j, p in enumerate(_get(rec, "paragraphs", list, where)):
        pw = f"{where}: 'paragraphs'[{j}]"
        if not isinstance(p, dict):
            raise OfficialFormatError(f"{pw} must be an object, got {_preview(p)}")
        idx = _get(p, "idx", int, pw)
        title = _get(p, "title", str, pw)
        paragraphs.append((title, _join([_get(p, "paragraph_text", str, pw)])))
        by_idx[idx] = title
        if _get(p, "is_supporting", bool, pw, default=False):
            supporting.append(title)

    hop_titles, sub_queries, hop_answers = [], [], []
    for k, step in enumerate(_get(rec, "question_decomposition", list, where)):
        sw = f"{where}: 'question_decomposition'[{k}]"
        if not isinstance(step, dict):
            raise OfficialFormatError(f"{sw} must be an object, got {_preview(step)}")
        sub_queries.append(resolve_hop(_get(step, "question", str, sw), hop_answers))
        hop_answers.append(_get(step, "answer", str, sw))
        support = _get(step, "paragraph_support_idx", (int, type(None)), sw, default=None)
        if support is not None:
            if support not in by_idx:
                raise OfficialFormatError(f"{sw}: 'paragraph_support_idx' {support} matches no paragraph 'idx'")
            hop_titles.append(by_idx[support])
    q = {
        "id": rec["id"],
        "question": question,
        "answers": _dedup([answer, *aliases]),
        "supporting_titles": _dedup(hop_titles + supporting),
        "type": _musique_type(rec["id"]),
        "source": "musique",
        "split": "unsplit",
        "sub_queries": sub_queries,
    }
    return q, paragraphs


# ------------------------------------------------------------------ the sources
class OfficialSource(DataSource):
    """A published multi-hop QA file: the read loop the three built-ins share; each says how to
    iterate its file (:meth:`_records`) and parse one record (:meth:`_parse`)."""

    downloads = True
    tag: ClassVar[str]  # the ``source`` column and the doc-id prefix

    def _records(self, path: Path) -> Iterator[tuple[str, Any]]:
        return _json_records(path)

    @abstractmethod
    def _parse(self, rec: Any, where: str) -> tuple[dict, list[tuple[str, str]]] | None:
        """One record -> (question record, its ``(title, text)`` paragraphs), or None to skip it."""

    def read(self, path: Path, max_questions: int | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Parse one official file into ``(questions, corpus)`` in the normalised schema.

        ``max_questions`` keeps the first N answerable questions and only their
        paragraphs (the whole file is still validated up to that point).
        ``split`` is ``"unsplit"``; the prepare stage assigns it.
        """
        path = Path(path)
        records = self._records(path)
        questions: list[dict] = []
        docs: dict[tuple[str, str], str] = {}  # (title, text) -> doc_id, in first-seen order
        first_seen: dict[str, str] = {}  # question id -> where, to name both duplicates
        skipped = missing_gold = 0
        for label, rec in tqdm(records, desc=f"reading {path.name}", unit="rec", disable=None, leave=False):
            where = f"{path}: {label}"
            parsed = self._parse(rec, where)
            if parsed is None:
                skipped += 1
                continue
            q, paragraphs = parsed
            if q["id"] in first_seen:
                raise OfficialFormatError(f"{where}: duplicate id {q['id']!r} (first at {first_seen[q['id']]})")
            first_seen[q["id"]] = label
            missing_gold += not set(q["supporting_titles"]) <= {t for t, _ in paragraphs}
            for title, text in paragraphs:
                docs.setdefault((title, text), doc_id(self.tag, title, text))
            questions.append(q)
            if max_questions is not None and len(questions) >= max_questions:
                break
        if not questions:
            raise OfficialFormatError(f"{path}: no answerable questions ({skipped} unanswerable skipped)")
        if skipped:
            log.info("%s: skipped %d unanswerable MuSiQue records (answerable: false)", path, skipped)
        if missing_gold:
            log.warning("%s: %d questions cite supporting titles absent from their own context", path, missing_gold)
        log.info("%s: %d questions, %d distinct paragraphs", path, len(questions), len(docs))
        try:
            qdf = questions_frame(questions, where=str(path))
            cdf = corpus_frame(({"doc_id": d, "title": t, "text": x} for (t, x), d in docs.items()), where=str(path))
        except SchemaError as exc:  # e.g. a sha1 prefix collision; reported in the converter's terms
            raise OfficialFormatError(str(exc)) from None
        return qdf, cdf


class HotpotQA(OfficialSource):
    """HotpotQA (distractor setting): plain JSON files on the authors' CMU server."""

    tag = "hotpotqa"
    urls = {
        "train": "http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_train_v1.1.json",
        "dev": "http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_dev_distractor_v1.json",
    }
    files = {"train": "hotpot_train_v1.1.json", "dev": "hotpot_dev_distractor_v1.json"}

    def _parse(self, rec: Any, where: str) -> tuple[dict, list[tuple[str, str]]]:
        return _hotpot_like(self.tag, rec, where)


_TWOWIKI_ZIP = "https://www.dropbox.com/s/npidmtadreo6df2/data.zip?dl=1"


class TwoWikiMultihopQA(OfficialSource):
    """2WikiMultihopQA: one Dropbox zip (the "full dataset" link in the README of
    github.com/Alab-NII/2wikimultihop) holding ``train.json`` / ``dev.json`` / ``test.json``."""

    tag = "2wikimultihopqa"
    urls = {"train": _TWOWIKI_ZIP, "dev": _TWOWIKI_ZIP}
    files = {"train": "train.json", "dev": "dev.json"}

    def _parse(self, rec: Any, where: str) -> tuple[dict, list[tuple[str, str]]]:
        # some re-releases add aliases; the original has none
        return _hotpot_like(self.tag, rec, where, alias_keys=("aliases", "answer_aliases"))


_MUSIQUE_ZIP = "https://drive.google.com/uc?export=download&id=1tGdADlNjWFaHLeZZGShh2IRcpO6Lv24h"


class MuSiQue(OfficialSource):
    """MuSiQue-Answerable: ``musique_v1.0.zip`` on Google Drive (the file id used by
    StonyBrookNLP/musique's ``download_data.sh``), holding ``data/musique_ans_v1.0_{train,dev}.jsonl``."""

    tag = "musique"
    urls = {"train": _MUSIQUE_ZIP, "dev": _MUSIQUE_ZIP}
    files = {"train": "musique_ans_v1.0_train.jsonl", "dev": "musique_ans_v1.0_dev.jsonl"}

    def _records(self, path: Path) -> Iterator[tuple[str, Any]]:
        return _jsonl_records(path)

    def _parse(self, rec: Any, where: str) -> tuple[dict, list[tuple[str, str]]] | None:
        return _musique(rec, where)


# ------------------------------------------------------------------ public API
def read_official(source: str, path: Path, max_questions: int | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(questions, corpus)`` of one downloaded file of ``source`` (a registered name or a plugin reference)."""
    reader = get_source(source)
    if not reader.downloads:
        raise ValueError(f"{source!r} generates its data: it has no file to read")
    return reader.read(Path(path), max_questions)


def convert_file(source: str, input_path: Path, out_dir: Path) -> tuple[int, int]:
    """Official file -> ``out_dir/questions.parquet`` + ``out_dir/corpus.parquet``; returns (n_questions, n_docs).

    The input is parsed completely before anything is written, and both files
    are written to temporaries and moved into place together, so a bad input
    or a failed write leaves neither file behind.
    """
    questions, corpus = read_official(source, Path(input_path))
    out_dir = Path(out_dir)
    with atomic_path(out_dir / QUESTIONS_FILE) as q_tmp, atomic_path(out_dir / CORPUS_FILE) as c_tmp:
        questions.to_parquet(q_tmp, index=False)
        corpus.to_parquet(c_tmp, index=False)
    return len(questions), len(corpus)
