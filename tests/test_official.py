"""Official HotpotQA / 2WikiMultihopQA / MuSiQue files -> normalised schema, and their download.

Fixtures are written here in the exact published layouts (a JSON list for
HotpotQA and 2Wiki, JSON Lines for MuSiQue, zips shaped like the official
ones), small but with the awkward details: paragraphs repeated across
questions, MuSiQue ``#k`` references, unanswerable MuSiQue-Full records,
2Wiki's extra fields, Google Drive's confirmation page.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import logging
import socket
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from agent_r1.cli import main as cli_main
from agent_r1.config import RealDataConfig
from agent_r1.data.official import (
    DownloadError,
    OfficialFormatError,
    convert_file,
    doc_id,
    download_official,
    read_official,
    resolve_hop,
)
from agent_r1.data.prepare import split_questions
from agent_r1.data.schema import CORPUS_COLUMNS, QUESTION_COLUMNS
from agent_r1.data.sources import get_source

REPO = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------- fixtures
ARTHUR = ["Arthur's Magazine", [
    "Arthur's Magazine (1844–1849) was an American literary periodical published in Philadelphia.",
    " Edited by T.S. Arthur, it featured work by Edgar A. Poe.",
]]
FIRST_FOR_WOMEN = ["First for Women", [
    "First for Women is a woman's magazine published by Bauer Media Group in the USA.",
    " The magazine was started in 1989.",
]]
OBEROI = ["Oberoi family", ["The Oberoi family is an Indian family famous for its hotels.", " They run The Oberoi Group."]]
OBEROI_GROUP = ["The Oberoi Group", ["The Oberoi Group is a hotel company with its head office in Delhi."]]
# same title as FIRST_FOR_WOMEN, different text: a different document
FIRST_FOR_WOMEN_V2 = ["First for Women", ["First for Women is a magazine."]]

HOTPOT = [
    {
        "_id": "5a7a06935542990198eaf050",
        "answer": "Arthur's Magazine",
        "question": "Which magazine was started first Arthur's Magazine or First for Women?",
        "supporting_facts": [["Arthur's Magazine", 0], ["First for Women", 1], ["Arthur's Magazine", 1]],
        "context": [ARTHUR, FIRST_FOR_WOMEN, OBEROI],
        "type": "comparison",
        "level": "medium",
    },
    {
        "_id": "5a879ab05542996e4f30887e",
        "answer": "Delhi",
        "question": "The Oberoi family is part of a hotel company that has a head office in what city?",
        "supporting_facts": [["Oberoi family", 0], ["The Oberoi Group", 0]],
        "context": [OBEROI, OBEROI_GROUP, FIRST_FOR_WOMEN, FIRST_FOR_WOMEN_V2],
        "type": "bridge",
        "level": "hard",
    },
]

TWOWIKI = [
    {
        "_id": "8813f87c0bdd11eba7f7acde48001122",
        "type": "compositional",
        "question": "Who is the mother of the director of film Polish-Russian War (Film)?",
        "context": [
            ["Polish-Russian War (film)", ["Polish-Russian War is a 2009 Polish film.", "It was directed by Xawery Żuławski."]],
            ["Xawery Żuławski", ["Xawery Żuławski is a Polish film director.", "His mother is Małgorzata Braunek."]],
            ["Maheen Khan", ["Maheen Khan is a Pakistani fashion designer."]],
        ],
        "supporting_facts": [["Polish-Russian War (film)", 1], ["Xawery Żuławski", 1]],
        "evidences": [["Polish-Russian War", "director", "Xawery Żuławski"], ["Xawery Żuławski", "mother", "Małgorzata Braunek"]],
        "answer": "Małgorzata Braunek",
        "entity_ids": "Q7320430_Q51759",
        "evidences_id": [["Q7320430", "P57", "Q8066425"]],
        "answer_id": "Q274493",
    },
    {
        "_id": "4bb5d2a0085d11ebb9d7ac1f6bf848b6",
        "type": "bridge_comparison",
        "question": "Which film has the director born later, Blind Shaft or The Mask Of Fu Manchu?",
        "context": [
            ["Blind Shaft", ["Blind Shaft is a 2003 film directed by Li Yang."]],
            ["The Mask of Fu Manchu", ["The Mask of Fu Manchu is a 1932 film directed by Charles Brabin."]],
            ["Li Yang (director)", ["Li Yang was born in 1959."]],
            ["Charles Brabin", ["Charles Brabin was born in 1882."]],
            ["Maheen Khan", ["Maheen Khan is a Pakistani fashion designer."]],
        ],
        "supporting_facts": [["Blind Shaft", 0], ["The Mask of Fu Manchu", 0], ["Li Yang (director)", 0], ["Charles Brabin", 0]],
        "evidences": [["Blind Shaft", "director", "Li Yang"]],
        "answer": "Blind Shaft",
        "aliases": ["Mang jing", "Blind Shaft"],
        "entity_ids": "Q1_Q2_Q3_Q4",
    },
]


def _para(idx: int, title: str, text: str, supporting: bool = False) -> dict:
    return {"idx": idx, "title": title, "paragraph_text": text, "is_supporting": supporting}


MUSIQUE = [
    {
        "id": "2hop__131818_161450",
        "paragraphs": [
            _para(0, "Blue", "Blue is a colour of the sky."),
            _para(1, "Miquette Giraudy", "Miquette Giraudy is the partner of Steve Hillage.", True),
            _para(2, "Green (Steve Hillage album)", "Green is the fourth studio album by Steve Hillage.", True),
        ],
        "question": "Who is the spouse of the Green performer?",
        "question_decomposition": [
            {"id": 131818, "question": "Green >> performer", "answer": "Steve Hillage", "paragraph_support_idx": 2},
            {"id": 161450, "question": "#1 >> spouse", "answer": "Miquette Giraudy", "paragraph_support_idx": 1},
        ],
        "answer": "Miquette Giraudy",
        "answer_aliases": ["Miquette"],
        "answerable": True,
    },
    {
        "id": "3hop1__9285_5188_23307",
        "paragraphs": [
            _para(0, "Miquette Giraudy", "Miquette Giraudy is the partner of Steve Hillage.", True),
            _para(1, "Steve Hillage", "Steve Hillage was born in Chingford.", True),
            _para(2, "Chingford", "Chingford is a town in the London Borough of Waltham Forest.", True),
        ],
        "question": "In which borough was the partner of Miquette Giraudy born?",
        "question_decomposition": [
            {"id": 9285, "question": "Who is the partner of Miquette Giraudy?", "answer": "Steve Hillage", "paragraph_support_idx": 0},
            {"id": 5188, "question": "Where was #1 born?", "answer": "Chingford", "paragraph_support_idx": 1},
            {"id": 23307, "question": "#2 >> located in the administrative territorial entity",
             "answer": "London Borough of Waltham Forest", "paragraph_support_idx": 2},
        ],
        "answer": "London Borough of Waltham Forest",
        "answer_aliases": [],
        "answerable": True,
    },
    {
        "id": "2hop__999_1000",
        "paragraphs": [_para(0, "Blue", "Blue is a colour of the sky.")],
        "question": "Who painted the blue that nobody painted?",
        "question_decomposition": [
            {"id": 999, "question": "Blue >> creator", "answer": "nobody", "paragraph_support_idx": None},
            {"id": 1000, "question": "#1 >> spouse", "answer": "nobody", "paragraph_support_idx": None},
        ],
        "answer": "nobody",
        "answer_aliases": [],
        "answerable": False,
    },
]


def _write_json(path: Path, records: list[dict]) -> Path:
    path.write_text(json.dumps(records, ensure_ascii=False, indent=1))
    return path


def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return path


def _row(df: pd.DataFrame, qid: str) -> pd.Series:
    return df.set_index("id").loc[qid]


# ------------------------------------------------------------------ readers
def test_hotpotqa_converts_with_dedup(tmp_path: Path) -> None:
    path = _write_json(tmp_path / "hotpot_dev_distractor_v1.json", HOTPOT)
    q, c = read_official("hotpotqa", path)
    assert list(q.columns) == list(QUESTION_COLUMNS) and list(c.columns) == list(CORPUS_COLUMNS)
    first = _row(q, "5a7a06935542990198eaf050")
    assert list(first["answers"]) == ["Arthur's Magazine"]
    assert list(first["supporting_titles"]) == ["Arthur's Magazine", "First for Women"]
    assert list(first["sub_queries"]) == ["Arthur's Magazine", "First for Women"]
    assert first["type"] == "comparison" and first["source"] == "hotpotqa" and first["split"] == "unsplit"
    assert _row(q, "5a879ab05542996e4f30887e")["type"] == "bridge"
    # 3 + 4 context paragraphs; OBEROI and FIRST_FOR_WOMEN repeat, FIRST_FOR_WOMEN_V2 differs in text
    assert len(c) == 5
    assert sorted(c["title"]).count("First for Women") == 2
    arthur = c.set_index("title").loc["Arthur's Magazine"]
    assert arthur["text"] == (
        "Arthur's Magazine (1844–1849) was an American literary periodical published in Philadelphia. "
        "Edited by T.S. Arthur, it featured work by Edgar A. Poe."
    )
    assert arthur["doc_id"] == doc_id("hotpotqa", "Arthur's Magazine", arthur["text"])
    assert arthur["doc_id"].startswith("hotpotqa-") and len(arthur["doc_id"]) == len("hotpotqa-") + 16
    q2, c2 = read_official("hotpotqa", path)  # deterministic
    pd.testing.assert_frame_equal(c, c2)
    pd.testing.assert_frame_equal(q, q2)


def test_2wiki_tolerates_extra_fields_and_reads_aliases(tmp_path: Path) -> None:
    q, c = read_official("2wikimultihopqa", _write_json(tmp_path / "dev.json", TWOWIKI))
    comp = _row(q, "8813f87c0bdd11eba7f7acde48001122")
    assert comp["type"] == "compositional" and comp["source"] == "2wikimultihopqa"
    assert list(comp["answers"]) == ["Małgorzata Braunek"]
    assert list(comp["supporting_titles"]) == ["Polish-Russian War (film)", "Xawery Żuławski"]
    bc = _row(q, "4bb5d2a0085d11ebb9d7ac1f6bf848b6")
    assert bc["type"] == "bridge_comparison"
    assert list(bc["answers"]) == ["Blind Shaft", "Mang jing"]  # alias equal to the answer dropped
    assert len(bc["supporting_titles"]) == 4
    assert len(c) == 7  # 3 + 5 paragraphs, "Maheen Khan" shared
    assert c["doc_id"].str.startswith("2wikimultihopqa-").all()
    # 2Wiki sentences carry no leading spaces; joined with exactly one
    assert c.set_index("title").loc["Xawery Żuławski", "text"] == (
        "Xawery Żuławski is a Polish film director. His mother is Małgorzata Braunek."
    )


def test_musique_hops_substituted_and_unanswerable_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _write_jsonl(tmp_path / "musique_full_v1.0_dev.jsonl", MUSIQUE)
    with caplog.at_level(logging.INFO, logger="agent_r1.data.official"):
        q, c = read_official("musique", path)
    assert list(q["id"]) == ["2hop__131818_161450", "3hop1__9285_5188_23307"]
    assert "skipped 1 unanswerable" in caplog.text
    two = _row(q, "2hop__131818_161450")
    assert list(two["sub_queries"]) == ["performer of Green", "spouse of Steve Hillage"]
    assert list(two["supporting_titles"]) == ["Green (Steve Hillage album)", "Miquette Giraudy"]  # hop order
    assert list(two["answers"]) == ["Miquette Giraudy", "Miquette"]
    assert two["type"] == "2hop"
    three = _row(q, "3hop1__9285_5188_23307")
    assert list(three["sub_queries"]) == [
        "Who is the partner of Miquette Giraudy?",
        "Where was Steve Hillage born?",
        "located in the administrative territorial entity of Chingford",
    ]
    assert three["type"] == "3hop"
    # "Miquette Giraudy" is in both answerable records; the unanswerable one's "Blue" is not read
    assert len(c) == 5
    assert sorted(c["title"]) == sorted(
        ["Blue", "Miquette Giraudy", "Green (Steve Hillage album)", "Steve Hillage", "Chingford"]
    )


def test_resolve_hop_only_replaces_earlier_hops() -> None:
    assert resolve_hop("#9 Dream >> performer", []) == "performer of #9 Dream"
    assert resolve_hop("#1 >> father", ["John Lennon"]) == "father of John Lennon"
    assert resolve_hop("When did #2 marry #1?", ["A", "B"]) == "When did B marry A?"
    assert resolve_hop("What is #3?", ["A", "B"]) == "What is #3?"


def test_max_questions_keeps_only_their_paragraphs(tmp_path: Path) -> None:
    q, c = read_official("hotpotqa", _write_json(tmp_path / "h.json", HOTPOT), max_questions=1)
    assert list(q["id"]) == ["5a7a06935542990198eaf050"] and len(c) == 3


# ------------------------------------------------------------------ errors
def test_truncated_json_names_file_and_line_and_writes_nothing(tmp_path: Path) -> None:
    full = json.dumps(HOTPOT, ensure_ascii=False, indent=1)
    path = tmp_path / "hotpot_dev_distractor_v1.json"
    path.write_text(full[: len(full) // 2])
    cut_line = full[: len(full) // 2].count("\n") + 1
    out = tmp_path / "out"
    with pytest.raises(OfficialFormatError) as err:
        convert_file("hotpotqa", path, out)
    msg = str(err.value)
    assert str(path) in msg and f"line {cut_line}" in msg and "truncated" in msg
    assert not out.exists() or not any(out.iterdir())


def test_truncated_jsonl_names_line(tmp_path: Path) -> None:
    text = "".join(json.dumps(r) + "\n" for r in MUSIQUE)
    path = tmp_path / "musique_ans_v1.0_dev.jsonl"
    path.write_text(text[: len(text) - 200])  # cut inside the third record
    out = tmp_path / "out"
    expected = r"musique_ans_v1\.0_dev\.jsonl: invalid JSON at line 3 .*truncated"
    with pytest.raises(OfficialFormatError, match=expected):
        convert_file("musique", path, out)
    assert not out.exists()


def test_cut_inside_multibyte_character(tmp_path: Path) -> None:
    raw = json.dumps(TWOWIKI, ensure_ascii=False).encode()
    cut = raw.index("Ż".encode()) + 1  # half of a two-byte character
    path = tmp_path / "dev.json"
    path.write_bytes(raw[:cut])
    with pytest.raises(OfficialFormatError, match=r"dev\.json: line 1: not valid UTF-8"):
        read_official("2wikimultihopqa", path)


def test_missing_field_names_record_id_and_field(tmp_path: Path) -> None:
    records = json.loads(json.dumps(HOTPOT))
    del records[1]["supporting_facts"]
    path = _write_json(tmp_path / "hotpot_dev.json", records)
    with pytest.raises(OfficialFormatError) as err:
        read_official("hotpotqa", path)
    assert str(err.value) == f"{path}: record 1 (id 5a879ab05542996e4f30887e): 'supporting_facts' missing"


def test_ill_typed_fields_are_named(tmp_path: Path) -> None:
    records = json.loads(json.dumps(HOTPOT))
    records[0]["context"][2] = ["Oberoi family", "not a list of sentences"]
    expected = r"record 0 \(id 5a7a06935542990198eaf050\): 'context'\[2\] must be"
    with pytest.raises(OfficialFormatError, match=expected):
        read_official("hotpotqa", _write_json(tmp_path / "h.json", records))
    rows = json.loads(json.dumps(MUSIQUE))
    rows[1]["question_decomposition"][1]["paragraph_support_idx"] = 7
    with pytest.raises(OfficialFormatError, match=r"line 2 \(record 1\) \(id 3hop1__9285_5188_23307\): "
                       r"'question_decomposition'\[1\]: 'paragraph_support_idx' 7 matches no paragraph"):
        read_official("musique", _write_jsonl(tmp_path / "m.jsonl", rows))
    rows = json.loads(json.dumps(MUSIQUE))
    rows[0]["answerable"] = "yes"
    with pytest.raises(OfficialFormatError, match=r"'answerable' must be true/false"):
        read_official("musique", _write_jsonl(tmp_path / "m.jsonl", rows))


def test_test_file_without_answers_is_refused(tmp_path: Path) -> None:
    test_style = [{"_id": r["_id"], "question": r["question"], "context": r["context"]} for r in HOTPOT]
    path = _write_json(tmp_path / "hotpot_test_fullwiki_v1.json", test_style)
    with pytest.raises(OfficialFormatError, match=r"record 0 .*'answer' missing.*test files .* carry no answers"):
        read_official("hotpotqa", path)


def test_wrong_source_and_duplicates_are_named(tmp_path: Path) -> None:
    jsonl = _write_jsonl(tmp_path / "musique.jsonl", MUSIQUE)
    with pytest.raises(OfficialFormatError, match=r"line 2 column 1: Extra data \(a JSON Lines file"):
        read_official("hotpotqa", jsonl)
    with pytest.raises(OfficialFormatError, match=r"line 1 column 2: Expecting value \(one JSON list\?"):
        read_official("musique", _write_json(tmp_path / "h.json", HOTPOT))
    (tmp_path / "one_line.json").write_text(json.dumps(HOTPOT))
    with pytest.raises(OfficialFormatError, match=r"line 1 \(record 0\): expected a JSON object, got \[\{"):
        read_official("musique", tmp_path / "one_line.json")
    expected = r"record 2: duplicate id '5a7a06935542990198eaf050' \(first at record 0\)"
    with pytest.raises(OfficialFormatError, match=expected):
        read_official("hotpotqa", _write_json(tmp_path / "d.json", HOTPOT + HOTPOT[:1]))
    with pytest.raises(OfficialFormatError, match="file not found"):
        read_official("hotpotqa", tmp_path / "nope.json")


# ------------------------------------------------------------------ convert
def test_convert_file_writes_both_tables(tmp_path: Path) -> None:
    out = tmp_path / "out"
    n_q, n_d = convert_file("2wikimultihopqa", _write_json(tmp_path / "dev.json", TWOWIKI), out)
    assert (n_q, n_d) == (2, 7)
    assert sorted(p.name for p in out.iterdir()) == ["corpus.parquet", "questions.parquet"]
    q = pd.read_parquet(out / "questions.parquet")
    assert list(q["answers"].iloc[1]) == ["Blind Shaft", "Mang jing"]
    assert len(pd.read_parquet(out / "corpus.parquet")) == 7


def test_convert_file_is_both_or_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = pd.DataFrame.to_parquet
    calls = []

    def second_write_fails(self: pd.DataFrame, path: object, **kw: object) -> None:
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full")
        real(self, path, **kw)

    monkeypatch.setattr(pd.DataFrame, "to_parquet", second_write_fails)
    out = tmp_path / "out"
    with pytest.raises(OSError, match="disk full"):
        convert_file("hotpotqa", _write_json(tmp_path / "h.json", HOTPOT), out)
    assert list(out.iterdir()) == []


def test_cli_data_convert_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = _write_jsonl(tmp_path / "musique_ans_v1.0_dev.jsonl", MUSIQUE)
    out = tmp_path / "converted"
    proc = subprocess.run(
        [sys.executable, "-m", "agent_r1.cli", "data", "convert",
         "--source", "musique", "--input", str(src), "--out", str(out)],
        cwd=REPO, capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"wrote 2 questions and 5 documents to {out}" in proc.stdout
    assert len(pd.read_parquet(out / "questions.parquet")) == 2
    bad = tmp_path / "bad.json"
    bad.write_text('[{"_id": "x", "question": "q?"')
    argv = ["data", "convert", "--source", "hotpotqa", "--input", str(bad), "--out", str(tmp_path / "o2")]
    assert cli_main(argv) == 2
    assert f"error: {bad}: invalid JSON at line 1" in capsys.readouterr().err
    assert not (tmp_path / "o2").exists()


# -------------------------------------------------------------------- split
def test_split_questions_is_deterministic_and_order_free() -> None:
    q = pd.DataFrame({"id": [f"q{i}" for i in range(2000)], "split": "unsplit"})
    a = split_questions(q, 0.2, seed=3)
    b = split_questions(q.iloc[::-1], 0.2, seed=3).sort_index()
    assert (a["split"] == b["split"]).all()
    assert 0.17 < (a["split"] == "test").mean() < 0.23
    assert set(a["split"]) == {"train", "test"} and (q["split"] == "unsplit").all()  # input untouched
    c = split_questions(q, 0.2, seed=4)
    assert (a["split"] != c["split"]).any()
    sub = split_questions(q.iloc[:500], 0.2, seed=3)  # a question keeps its side in a subset
    assert (sub["split"] == a["split"].iloc[:500]).all()
    tiny = split_questions(q.iloc[:2], 0.01, seed=0)
    assert sorted(tiny["split"]) == ["test", "train"]
    with pytest.raises(ValueError, match="test_fraction"):
        split_questions(q, 1.0, seed=0)


# ----------------------------------------------------------------- download
def _zip_bytes(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


@pytest.fixture
def server() -> Iterator[tuple[str, dict[str, tuple[str, bytes]]]]:
    """A local HTTP server on a free port: routes maps a path (with query) to (content type, body)."""
    routes: dict[str, tuple[str, bytes]] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path not in routes:
                self.send_error(404)
                return
            ctype, body = routes[self.path]
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", routes
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def test_download_file_url_writes_file_and_manifest(tmp_path: Path) -> None:
    src = _write_json(tmp_path / "mirror.json", HOTPOT)
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    dest = tmp_path / "raw"
    got = download_official(get_source("hotpotqa"), RealDataConfig(url=src.as_uri(), sha256=digest), dest)
    assert got == dest / "hotpot_dev_distractor_v1.json" and got.read_bytes() == src.read_bytes()
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["url"] == src.as_uri() and manifest["sha256"] == digest
    assert manifest["bytes"] == src.stat().st_size and manifest["source"] == "hotpotqa"
    assert sorted(p.name for p in dest.iterdir()) == ["hotpot_dev_distractor_v1.json", "manifest.json"]
    # a plain path works as a mirror too; train split -> train file name
    got = download_official(get_source("hotpotqa"), RealDataConfig(url=str(src), split="train"), dest)
    assert got.name == "hotpot_train_v1.1.json"
    assert len(read_official("hotpotqa", got)[0]) == 2


def test_download_2wiki_zip_over_http(tmp_path: Path, server: tuple[str, dict]) -> None:
    base, routes = server
    dev = json.dumps(TWOWIKI, ensure_ascii=False).encode()
    routes["/s/npidmtadreo6df2/data.zip?dl=1"] = ("application/zip", _zip_bytes(
        {"data/train.json": b"[]", "data/dev.json": dev, "data/test.json": b"[]", "__MACOSX/data/._dev.json": b"junk"}
    ))
    dest = tmp_path / "raw"
    got = download_official(get_source("2wikimultihopqa"), RealDataConfig(url=f"{base}/s/npidmtadreo6df2/data.zip?dl=1"), dest)
    assert got == dest / "dev.json" and got.read_bytes() == dev
    assert json.loads((dest / "manifest.json").read_text())["zip_member"] == "data/dev.json"
    assert sorted(p.name for p in dest.iterdir()) == ["dev.json", "manifest.json"]  # zip not kept
    assert len(read_official("2wikimultihopqa", got)[0]) == 2


def test_download_musique_through_drive_confirm_page(tmp_path: Path, server: tuple[str, dict]) -> None:
    base, routes = server
    dev = "".join(json.dumps(r) + "\n" for r in MUSIQUE).encode()
    archive = _zip_bytes({"data/musique_ans_v1.0_dev.jsonl": dev, "data/musique_full_v1.0_dev.jsonl": b"",
                          "__MACOSX/data/._musique_ans_v1.0_dev.jsonl": b"junk"})
    page = (
        '<!DOCTYPE html><html><body><p>Google Drive can&#39;t scan this file for viruses.</p>'
        '<form id="download-form" action="/download" method="get">'
        '<input type="submit" value="Download anyway"/>'
        '<input type="hidden" name="id" value="FILEID"><input type="hidden" name="export" value="download">'
        '<input type="hidden" name="confirm" value="t"><input type="hidden" name="uuid" value="u-1">'
        "</form></body></html>"
    ).encode()
    routes["/uc?export=download&id=FILEID"] = ("text/html; charset=utf-8", page)
    routes["/download?id=FILEID&export=download&confirm=t&uuid=u-1"] = ("application/octet-stream", archive)
    dest = tmp_path / "raw"
    cfg = RealDataConfig(url=f"{base}/uc?export=download&id=FILEID", sha256=hashlib.sha256(archive).hexdigest())
    got = download_official(get_source("musique"), cfg, dest)
    assert got == dest / "musique_ans_v1.0_dev.jsonl" and got.read_bytes() == dev
    assert json.loads((dest / "manifest.json").read_text())["bytes"] == len(archive)
    q, _ = read_official("musique", got)
    assert len(q) == 2
    # an HTML page that leads nowhere (quota exceeded) is an error, not a saved "dataset"
    routes["/uc?export=download&id=GONE"] = ("text/html", b"<html><body>Quota exceeded</body></html>")
    with pytest.raises(DownloadError, match=r"uc\?export=download&id=GONE: the server sent an HTML page"):
        download_official(get_source("musique"), RealDataConfig(url=f"{base}/uc?export=download&id=GONE"), tmp_path / "r2")
    assert list((tmp_path / "r2").iterdir()) == []


def test_sha256_mismatch_leaves_nothing(tmp_path: Path, server: tuple[str, dict]) -> None:
    base, routes = server
    body = json.dumps(HOTPOT).encode()
    routes["/hotpot.json"] = ("application/json", body)
    dest = tmp_path / "raw"
    wrong = "0" * 64
    with pytest.raises(DownloadError) as err:
        download_official(get_source("hotpotqa"), RealDataConfig(url=f"{base}/hotpot.json", sha256=wrong), dest)
    msg = str(err.value)
    assert f"expected {wrong}" in msg and f"got {hashlib.sha256(body).hexdigest()}" in msg
    assert list(dest.iterdir()) == []


def test_missing_zip_member_and_http_errors(tmp_path: Path, server: tuple[str, dict]) -> None:
    base, routes = server
    routes["/other.zip"] = ("application/zip", _zip_bytes({"data/readme.txt": b"hi"}))
    with pytest.raises(DownloadError, match=r"no 'dev.json'; it contains: data/readme.txt"):
        download_official(get_source("2wikimultihopqa"), RealDataConfig(url=f"{base}/other.zip"), tmp_path / "a")
    assert list((tmp_path / "a").iterdir()) == []
    with pytest.raises(DownloadError, match=rf"could not download {base}/missing.json: HTTP 404"):
        download_official(get_source("hotpotqa"), RealDataConfig(url=f"{base}/missing.json"), tmp_path / "b")
    expected = r"could not download file:///nonexistent/hotpot.json: .*data\.real\.url"
    with pytest.raises(DownloadError, match=expected):
        download_official(get_source("hotpotqa"), RealDataConfig(url="file:///nonexistent/hotpot.json"), tmp_path / "c")


def test_unreachable_url_names_url_and_mirror_setting(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/x"
    with pytest.raises(DownloadError) as err:
        download_official(get_source("hotpotqa"), RealDataConfig(url=url, timeout_s=5), tmp_path / "raw")
    assert f"could not download {url}" in str(err.value) and "data.real.url" in str(err.value)
    assert list((tmp_path / "raw").iterdir()) == []


def test_several_sources_download_and_prepare_together(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The paper's set-up: HotpotQA + 2Wiki in-domain (split train/test), MuSiQue test-only;
    the download and prepare stages over file:// mirrors, in a project folder of their own."""
    from agent_r1 import paths
    from agent_r1.config import parse_params
    from agent_r1.stages.download import download_data
    from agent_r1.data.prepare import load_questions_and_corpus

    shared = ["Maheen Khan", ["Maheen Khan is a Pakistani fashion designer."]]  # in 2Wiki too: kept once
    hotpot = [dict(HOTPOT[0], context=[*HOTPOT[0]["context"], shared]), HOTPOT[1]]
    files = {
        "hotpotqa": _write_json(tmp_path / "hotpot.json", hotpot),
        "2wikimultihopqa": _write_json(tmp_path / "2wiki.json", TWOWIKI),
        "musique": _write_jsonl(tmp_path / "musique.jsonl", MUSIQUE),
    }
    params = parse_params({"data": {
        "source": ["hotpotqa", "2wikimultihopqa"], "test_only": ["musique"], "seed": 0, "val_questions": 0,
        "real": {"test_fraction": 0.5, "mirrors": {s: {"url": f.as_uri()} for s, f in files.items()}},
    }})
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    download_data(params)
    manifest = json.loads(paths.RAW_SOURCE.read_text())
    assert manifest["test_only"] == ["musique"]
    assert set(manifest["sources"]) == {"hotpotqa", "2wikimultihopqa", "musique"}
    for rel in manifest["sources"].values():
        assert (paths.RAW_DIR / rel).exists()

    questions, corpus = load_questions_and_corpus(params.data, paths.RAW_DIR)
    by = questions.groupby(["source", "split"]).size().to_dict()
    assert by[("musique", "test")] == 2 and ("musique", "train") not in by  # unanswerable skipped, all test
    for source in ("hotpotqa", "2wikimultihopqa"):  # two questions each, split both ways (test_fraction 0.5)
        assert by.get((source, "train"), 0) + by.get((source, "test"), 0) == 2
        assert by.get((source, "train"), 0) >= 1 and by.get((source, "test"), 0) >= 1
    assert (corpus["title"] == "Maheen Khan").sum() == 1
    assert not corpus.duplicated(["title", "text"]).any() and corpus["doc_id"].is_unique

    # data/raw from another set of sources is refused, naming the fix
    other = parse_params({"data": {"source": "hotpotqa", "real": {"url": files["hotpotqa"].as_uri()}}})
    with pytest.raises(ValueError, match="run the download stage"):
        load_questions_and_corpus(other.data, paths.RAW_DIR)


# ------------------------------------------------------- empty answers (EM)
@pytest.mark.parametrize("answer", ["The", "a", "...", " an  "])
@pytest.mark.parametrize("source", ["hotpotqa", "2wikimultihopqa", "musique"])
def test_answer_normalising_to_empty_is_rejected_naming_question_and_file(
    tmp_path: Path, source: str, answer: str
) -> None:
    """An empty prediction matches an answer that normalises to "": such a question is refused at read time."""
    records = {"hotpotqa": HOTPOT, "2wikimultihopqa": TWOWIKI, "musique": MUSIQUE}[source]
    id_key = "id" if source == "musique" else "_id"
    bad = [dict(records[0], answer=answer), *records[1:]]
    write = _write_jsonl if source == "musique" else _write_json
    path = write(tmp_path / ("dev.jsonl" if source == "musique" else "dev.json"), bad)
    with pytest.raises(OfficialFormatError) as err:
        read_official(source, path)
    msg = str(err.value)
    assert str(path) in msg and repr(records[0][id_key]) in msg and "normalises to the empty string" in msg


@pytest.mark.parametrize("source", ["2wikimultihopqa", "musique"])
def test_empty_aliases_are_dropped_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, source: str
) -> None:
    if source == "musique":
        rec = dict(MUSIQUE[0], answer_aliases=["Miquette", "the", "?!"])
        path, qid, want = _write_jsonl(tmp_path / "dev.jsonl", [rec]), rec["id"], ["Miquette Giraudy", "Miquette"]
    else:
        rec = dict(TWOWIKI[1], aliases=["Mang jing", "", "An"])
        path, qid, want = _write_json(tmp_path / "dev.json", [rec]), rec["_id"], ["Blind Shaft", "Mang jing"]
    with caplog.at_level(logging.WARNING, logger="agent_r1.data.schema"):
        q, _ = read_official(source, path)
    assert list(_row(q, qid)["answers"]) == want
    assert f"{path}: dropped 2 answer aliases that normalise to the empty string" in caplog.text


def test_validation_split_is_carved_from_train_stably_and_named_when_too_large() -> None:
    from agent_r1.data.prepare import carve_validation

    q = pd.DataFrame({"id": [f"q{i}" for i in range(300)], "source": ["a"] * 200 + ["b"] * 100,
                      "split": ["train"] * 150 + ["test"] * 50 + ["train"] * 80 + ["test"] * 20})
    out = carve_validation(q, 10, seed=3)
    assert out.groupby(["source", "split"]).size().to_dict() == {
        ("a", "test"): 50, ("a", "train"): 140, ("a", "val"): 10, ("b", "test"): 20, ("b", "train"): 70, ("b", "val"): 10}
    assert (out.loc[q["split"] == "test", "split"] == "test").all()  # the test split is never touched
    shuffled = carve_validation(q.sample(frac=1, random_state=0), 10, seed=3).sort_index()
    assert (shuffled["split"] == out["split"]).all()  # order-free
    assert (carve_validation(q, 0, seed=3)["split"] == q["split"]).all()
    with pytest.raises(ValueError, match=r"data.val_questions=80: source 'b' has only 80 train questions"):
        carve_validation(q, 80, seed=3)
