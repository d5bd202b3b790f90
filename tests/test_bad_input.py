"""Bad input is named before work starts: prepared parquet files, answers, params at the flow's start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from agent_r1.data.schema import SchemaError, corpus_frame, questions_frame, read_corpus, read_questions

ROOT = Path(__file__).resolve().parents[1]

QUESTION = {
    "id": "q1", "question": "Who founded Acme?", "answers": ["Ann Lee", "Ann"], "supporting_titles": ["Acme"],
    "type": "bridge", "source": "synthetic", "split": "test", "sub_queries": ["founder of Acme"],
}
DOC = {"doc_id": "d1", "title": "Acme", "text": "Acme was founded by Ann Lee."}


def _prepared(folder: Path) -> Path:
    """A valid data/prepared/ folder: one test question and one document."""
    prepared = folder / "data" / "prepared"
    prepared.mkdir(parents=True)
    for split in ("train", "test"):
        questions_frame([dict(QUESTION, split=split)]).to_parquet(prepared / f"{split}.parquet", index=False)
    corpus_frame([DOC]).to_parquet(prepared / "corpus.parquet", index=False)
    return prepared


def test_valid_prepared_files_read_back(tmp_path: Path) -> None:
    prepared = _prepared(tmp_path)
    q = read_questions(prepared / "test.parquet")
    assert q.loc[0, "id"] == "q1" and list(q.loc[0, "answers"]) == ["Ann Lee", "Ann"]
    assert read_corpus(prepared / "corpus.parquet").loc[0, "text"] == DOC["text"]


def _break(path: Path, how: str) -> None:
    df = pd.read_parquet(path)
    if how == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif how == "not parquet":
        path.write_text("id,question\nq1,Who?\n")
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "missing column":
        df.drop(columns=["answers"]).to_parquet(path, index=False)
    elif how == "wrong type":
        df.assign(answers=df["answers"].map(lambda a: a[0])).to_parquet(path, index=False)
    elif how == "null":  # a second row whose question is missing
        two = pd.concat([df, df.assign(id="q2")], ignore_index=True)
        two.loc[1, "question"] = None
        two.to_parquet(path, index=False)
    elif how == "null alias":
        df.assign(answers=[["Ann Lee", None]]).to_parquet(path, index=False)
    elif how == "empty answer":
        df.assign(answers=[["The"]]).to_parquet(path, index=False)


@pytest.mark.parametrize(
    ("how", "needle"),
    [
        ("truncated", "not a readable parquet file (corrupt or truncated?)"),
        ("not parquet", "not a readable parquet file"),
        ("empty", "not a readable parquet file"),
        ("missing column", "missing column 'answers'"),
        ("wrong type", "column 'answers' has type large_string, expected list<string>"),
        ("null", "column 'question' has 1 null values"),
        ("null alias", "column 'answers' has 1 null list items"),
        ("empty answer", "question id 'q1': answer 'The' normalises to the empty string"),
    ],
)
def test_broken_prepared_questions_are_named(tmp_path: Path, how: str, needle: str) -> None:
    path = _prepared(tmp_path) / "test.parquet"
    _break(path, how)
    with pytest.raises(SchemaError) as err:
        read_questions(path)
    assert str(err.value).startswith(f"{path}: ") and needle in str(err.value)


def test_broken_prepared_corpus_is_named(tmp_path: Path) -> None:
    path = _prepared(tmp_path) / "corpus.parquet"
    pd.read_parquet(path).assign(text=[3]).to_parquet(path, index=False)
    with pytest.raises(SchemaError, match=r"corpus.parquet: column 'text' has type int64, expected string"):
        read_corpus(path)
    path.unlink()
    with pytest.raises(SchemaError, match=r"corpus.parquet: not found \(run the prepare stage\)"):
        read_corpus(path)


def _stage(module: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(ROOT), "PATH": os.environ["PATH"], "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", module], cwd=cwd, capture_output=True, text=True, env=env)


def test_index_stage_names_a_truncated_test_file_without_traceback(tmp_path: Path) -> None:
    path = _prepared(tmp_path) / "test.parquet"
    _break(path, "truncated")
    (tmp_path / "params.yaml").write_text("")
    proc = _stage("agent_r1.stages.index", tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "error: data/prepared/test.parquet: not a readable parquet file" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "indexes").exists()


def test_prepare_stage_rejects_an_empty_answer_naming_question_and_file(tmp_path: Path) -> None:
    """The prepare stage on an official HotpotQA file whose answer is "The": exit 2, nothing prepared."""
    raw = tmp_path / "data" / "raw"
    (raw / "hotpotqa").mkdir(parents=True)
    record = {
        "_id": "abc123", "answer": "The", "question": "Which article?", "type": "bridge",
        "supporting_facts": [["Acme", 0]], "context": [["Acme", ["Acme was founded by Ann Lee."]]],
    }
    fine = dict(record, _id="def456", answer="Ann Lee", question="Who founded Acme?")  # both splits get one
    (raw / "hotpotqa" / "dev.json").write_text(json.dumps([fine, record]))
    (raw / "source.json").write_text(json.dumps({"sources": {"hotpotqa": "hotpotqa/dev.json"}, "test_only": []}))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"data": {"source": "hotpotqa"}}))
    proc = _stage("agent_r1.stages.prepare", tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "data/raw/hotpotqa/dev.json: question id 'abc123': answer 'The' normalises to the empty string" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "data" / "prepared").exists()


def test_flow_start_rejects_a_missing_local_model_path(tmp_path: Path) -> None:
    """The Prefect flow validates params before any stage (no DVC call, no download)."""
    from flows.pipeline import pipeline

    (tmp_path / "params.yaml").write_text("model:\n  path: ./models/my-policy\n")
    from agent_r1.config import ParamsError

    with pytest.raises(ParamsError, match=r"model.path: local path './models/my-policy' does not exist"):
        pipeline.fn(repo=str(tmp_path))
