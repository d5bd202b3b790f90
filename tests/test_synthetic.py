"""The synthetic multi-hop world: deterministic, well-formed, consistent, and search-hungry.

Checks read only the returned frames (questions, corpus), the way every consumer
sees them; consistency is checked by parsing the documents, not by trusting
the generator's internal structures.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from agent_r1.config import RetrievalConfig, SyntheticConfig
from agent_r1.data.schema import CORPUS_COLUMNS, QUESTION_COLUMNS, validate_corpus, validate_questions
from agent_r1.data.synthetic import generate

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"entities_per_type": 120, "n_train": 300, "n_test": 100, "n_test_ood": 60, "n_test_ood_2hop": 40, "n_test_paraphrase": 40}
SEED = 7
DIRECTIONS = {"older": min, "first": min, "earlier": min, "younger": max, "newer": max, "more recent": max}


def digest(questions: pd.DataFrame, corpus: pd.DataFrame) -> str:
    """A hash of both frames' full content, stable across processes."""
    h = hashlib.sha256()
    h.update(questions.to_json(orient="records").encode())
    h.update(corpus.to_json(orient="records").encode())
    return h.hexdigest()


def bare_name(title: str) -> str:
    """ "Veltrax (electronics company)" -> "Veltrax"."""
    return re.sub(r" \([^)]*\)$", "", title)


def mentions(text: str, phrase: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(phrase.lower())}(?!\w)", text.lower()) is not None


def roots(row: pd.Series) -> list[str]:
    """Titles of the entities a question names: both options of a comparison, else the first hop."""
    titles = list(row["supporting_titles"])
    return titles if row["type"] == "comparison" else titles[:1]


@pytest.fixture(scope="module")
def world() -> tuple[pd.DataFrame, pd.DataFrame]:
    return generate(SyntheticConfig(**SMALL), SEED)


@pytest.fixture(scope="module")
def texts(world: tuple[pd.DataFrame, pd.DataFrame]) -> dict[str, str]:
    _, corpus = world
    return dict(zip(corpus["title"], corpus["text"]))


# ---------------------------------------------------------------- determinism
def test_same_seed_gives_identical_frames(world: tuple[pd.DataFrame, pd.DataFrame]) -> None:
    again = generate(SyntheticConfig(**SMALL), SEED)
    pd.testing.assert_frame_equal(world[0], again[0])
    pd.testing.assert_frame_equal(world[1], again[1])
    assert digest(*world) == digest(*again)


def test_identical_under_other_hash_seeds(world: tuple[pd.DataFrame, pd.DataFrame]) -> None:
    """str hashing differs per process; no set or hash order may leak into the output."""
    script = (
        "import sys; sys.path.insert(0, 'tests'); from test_synthetic import SMALL, SEED, digest; "
        "from agent_r1.config import SyntheticConfig; from agent_r1.data.synthetic import generate; "
        "print(digest(*generate(SyntheticConfig(**SMALL), SEED)))"
    )
    for hash_seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == digest(*world), f"PYTHONHASHSEED={hash_seed} changed the world"


def test_different_seeds_give_different_worlds(world: tuple[pd.DataFrame, pd.DataFrame]) -> None:
    other_q, other_c = generate(SyntheticConfig(**SMALL), SEED + 1)
    shared_titles = set(other_c["title"]) & set(world[1]["title"])
    shared_questions = set(other_q["question"]) & set(world[0]["question"])
    assert len(shared_titles) < 0.1 * len(other_c), sorted(shared_titles)[:5]
    assert len(shared_questions) < 0.05 * len(other_q), sorted(shared_questions)[:5]


# --------------------------------------------------------------------- schema
def test_schema_sizes_types_and_ids(world: tuple[pd.DataFrame, pd.DataFrame]) -> None:
    questions, corpus = world
    assert tuple(questions.columns) == QUESTION_COLUMNS and tuple(corpus.columns) == CORPUS_COLUMNS
    validate_questions(questions)
    validate_corpus(corpus)
    train, test = questions[questions["split"] == "train"], questions[questions["split"] == "test"]
    assert len(train) == SMALL["n_train"]
    assert len(test) == SMALL["n_test"] + SMALL["n_test_ood"] + SMALL["n_test_ood_2hop"] + SMALL["n_test_paraphrase"]
    assert set(questions["split"]) == {"train", "test"}
    assert set(train["type"]) == {"bridge", "comparison"}
    assert Counter(test["type"])["compositional"] == SMALL["n_test_ood"]
    assert Counter(test["type"])["unseen_relation"] == SMALL["n_test_ood_2hop"]
    assert Counter(test["type"])["paraphrase"] == SMALL["n_test_paraphrase"]
    assert set(test["type"]) == {"bridge", "comparison", "compositional", "unseen_relation", "paraphrase"}
    sources = {"compositional": "synthetic_3hop", "unseen_relation": "synthetic_2hop_ood",
               "paraphrase": "synthetic_2hop_paraphrase"}
    for row in questions.itertuples():
        assert re.fullmatch(rf"syn-{row.split}-\d{{6}}", row.id), row.id
        assert row.source == sources.get(row.type, "synthetic"), row.id
        assert len(row.supporting_titles) == (3 if row.type == "compositional" else 2), row.id
        assert len(row.sub_queries) == len(row.supporting_titles), row.id
        assert len(row.answers) >= 1 and all(a.strip() for a in row.answers), row.id
    assert questions["question"].is_unique, "a question appears twice"
    assert corpus["title"].is_unique, "two documents share a title: supporting titles would be ambiguous"
    assert corpus["doc_id"].str.fullmatch(r"(country|city|person|company|product|film|note)-\d{5}").all()
    # several templates per type, so a policy cannot learn one phrasing
    for qtype, n_min in (("bridge", 8), ("comparison", 6), ("compositional", 3), ("unseen_relation", 5),
                         ("paraphrase", 8)):
        openings = {" ".join(q.split()[:3]) for q in questions.loc[questions["type"] == qtype, "question"]}
        assert len(openings) >= n_min, (qtype, openings)


def _four_grams(template: str) -> set[tuple[str, ...]]:
    words = re.sub(r"\{\w\}", " ", template.lower()).replace("?", " ").replace(".", " ").split()
    return {tuple(words[i : i + 4]) for i in range(len(words) - 3)}


def _assert_reachable_in_two_searches(world: tuple[pd.DataFrame, pd.DataFrame], qtype: str, source: str) -> None:
    """Each question's first document names its second hop, whose own document states the
    answer, so two searches reach it as in training."""
    questions, corpus = world
    text = dict(zip(corpus["title"], corpus["text"]))
    ood = questions[questions["type"] == qtype]
    assert set(ood["source"]) == {source}
    for row in ood.itertuples():
        first, second = row.supporting_titles
        assert mentions(text[first], bare_name(second)), row.id
        assert mentions(text[second], row.answers[0]) and not mentions(row.question, row.answers[0]), row.id


def test_out_of_domain_2hop_questions_follow_unseen_relations_and_are_answerable(
    world: tuple[pd.DataFrame, pd.DataFrame],
) -> None:
    """Each 2-hop OOD template uses a relation no training template uses, in words no training
    template shares 4 in a row with."""
    from agent_r1.data.synthetic import BRIDGES, COMPARISONS, UNSEEN_RELATIONS

    seen = {r for t in BRIDGES for r in (*t.path, t.answer)} | {r for t in COMPARISONS for r in (t.key, t.answer)}
    trained = set().union(*(_four_grams(x) for t in (*BRIDGES, *COMPARISONS) for x in t.texts))
    for t in UNSEEN_RELATIONS:
        assert len(t.path) == 1 and {*t.path, t.answer} - seen, t.name
        assert all(not _four_grams(x) & trained for x in t.texts), t.name
    _assert_reachable_in_two_searches(world, "unseen_relation", "synthetic_2hop_ood")


def test_paraphrases_ask_every_trained_relation_in_untrained_words(world: tuple[pd.DataFrame, pd.DataFrame]) -> None:
    """One paraphrase per training bridge: the same relations, no 4 words in a row shared with
    any training template."""
    from agent_r1.data.synthetic import BRIDGES, COMPARISONS, PARAPHRASES

    trained = set().union(*(_four_grams(x) for t in (*BRIDGES, *COMPARISONS) for x in t.texts))
    assert [(t.name, t.root_kind, t.path, t.answer) for t in PARAPHRASES] == [
        (t.name, t.root_kind, t.path, t.answer) for t in BRIDGES]
    for t in PARAPHRASES:
        assert all(_four_grams(x) and not _four_grams(x) & trained for x in t.texts), t.name
    _assert_reachable_in_two_searches(world, "paraphrase", "synthetic_2hop_paraphrase")


def test_adding_the_2hop_ood_sets_leaves_every_other_question_and_the_corpus_as_they_were() -> None:
    with_2hop, corpus = generate(SyntheticConfig(**SMALL), SEED)
    without, corpus_without = generate(SyntheticConfig(**{**SMALL, "n_test_ood_2hop": 0, "n_test_paraphrase": 0}), SEED)
    assert corpus.equals(corpus_without)
    assert with_2hop.iloc[: len(without)].reset_index(drop=True).equals(without.reset_index(drop=True))


def test_train_and_test_name_disjoint_entities(world: tuple[pd.DataFrame, pd.DataFrame]) -> None:
    questions, _ = world
    train_roots = {t for _, row in questions[questions["split"] == "train"].iterrows() for t in roots(row)}
    test_roots = {t for _, row in questions[questions["split"] == "test"].iterrows() for t in roots(row)}
    assert train_roots and test_roots
    assert not train_roots & test_roots, sorted(train_roots & test_roots)[:5]


def test_answer_never_in_question(world: tuple[pd.DataFrame, pd.DataFrame]) -> None:
    questions, _ = world
    for row in questions.itertuples():
        for answer in row.answers:
            assert not mentions(row.question, answer), (row.id, row.question, answer)


def test_supporting_documents_exist_and_chain(world: tuple[pd.DataFrame, pd.DataFrame], texts: dict[str, str]) -> None:
    """Every hop's document exists; a bridge hop names the next entity; the last hop states the answer."""
    questions, _ = world
    for row in questions.itertuples():
        titles = list(row.supporting_titles)
        assert all(t in texts for t in titles), (row.id, titles)
        answer = row.answers[0]
        if row.type == "comparison":
            assert any(mentions(texts[t], answer) for t in titles), (row.id, answer)
            continue
        for here, nxt in zip(titles, titles[1:]):
            assert mentions(texts[here], bare_name(nxt)), (row.id, here, nxt)
        assert mentions(texts[titles[-1]], answer), (row.id, titles[-1], answer)


def test_later_hops_do_not_name_the_root(world: tuple[pd.DataFrame, pd.DataFrame], texts: dict[str, str]) -> None:
    """Search must be iterative: the hop-2 document never names the entity the question names."""
    questions, _ = world
    for row in questions[questions["type"] != "comparison"].itertuples():
        root = bare_name(row.supporting_titles[0])
        for later in row.supporting_titles[1:]:
            assert not mentions(texts[later], root), (row.id, root, later)


def test_comparison_answers_follow_the_documents(
    world: tuple[pd.DataFrame, pd.DataFrame], texts: dict[str, str]
) -> None:
    """Parse each option's single year, pick the older/newer one, and find the answer in its document."""
    questions, _ = world
    comparisons = questions[questions["type"] == "comparison"]
    assert len(comparisons) >= 0.3 * (SMALL["n_train"] + SMALL["n_test"])
    for row in comparisons.itertuples():
        words = [w for w in DIRECTIONS if mentions(row.question, w)]
        assert len(words) == 1, (row.id, row.question, words)
        years = []
        for title in row.supporting_titles:
            found = re.findall(r"(?<![\d,])\d{4}(?!\d|,\d)", texts[title])  # not "3,400"
            assert len(found) == 1, (row.id, title, found)
            years.append(int(found[0]))
        assert years[0] != years[1], (row.id, years)
        chosen = row.supporting_titles[years.index(DIRECTIONS[words[0]](years))]
        assert mentions(texts[chosen], row.answers[0]), (row.id, row.question, chosen, row.answers[0])


# ----------------------------------------------------------------- collisions
def entity_names(corpus: pd.DataFrame) -> pd.Series:
    ents = corpus[~corpus["doc_id"].str.startswith(("note-", "country-"))]
    return ents["title"].map(bare_name)


def test_name_collisions_at_configured_rate(world: tuple[pd.DataFrame, pd.DataFrame]) -> None:
    questions, corpus = world
    names = entity_names(corpus)
    counts = names.value_counts()
    shared = names.map(counts) > 1
    rate = SyntheticConfig().name_collision_rate
    assert abs(shared.mean() - rate) <= 2 / len(names), (shared.mean(), rate)
    assert counts.max() == 2
    ents = corpus[~corpus["doc_id"].str.startswith(("note-", "country-"))]
    has_paren = ents["title"].str.endswith(")")
    assert (has_paren.to_numpy() == shared.to_numpy()).all(), "disambiguated titles exactly for shared names"
    kinds_by_name = ents.assign(name=names, kind=ents["doc_id"].str.split("-").str[0])[shared].groupby("name")["kind"]
    assert (kinds_by_name.nunique() == 1).any() and (kinds_by_name.nunique() == 2).any(), "same- and cross-kind"
    # collisions reach the questions: some hops need the disambiguated query
    refined = [q for qs, ts in zip(questions["sub_queries"], questions["supporting_titles"])
               for q, t in zip(qs, ts) if t.endswith(")")]
    assert len(refined) >= 0.05 * len(questions)
    # and the referring document carries the descriptor the refined query uses
    for row in questions.itertuples():
        for here, nxt, query in zip(row.supporting_titles, row.supporting_titles[1:], row.sub_queries[1:]):
            if nxt.endswith(")") and row.type != "comparison":
                descriptor = nxt[nxt.rindex("(") + 1 : -1]
                assert query == f"{bare_name(nxt)} {descriptor}", (row.id, query)


def test_no_collisions_when_rate_is_zero() -> None:
    _, corpus = generate(SyntheticConfig(**SMALL, name_collision_rate=0.0, distractors_per_entity=0.0), SEED)
    assert entity_names(corpus).is_unique
    assert not corpus["title"].str.endswith(")").any()
    assert not corpus["doc_id"].str.startswith("note-").any()


@pytest.mark.parametrize("density", [0.5, 3.0])
def test_distractor_count_follows_config(density: float) -> None:
    _, corpus = generate(SyntheticConfig(**SMALL, distractors_per_entity=density), SEED)
    n_entities = int((~corpus["doc_id"].str.startswith("note-")).sum())
    assert int(corpus["doc_id"].str.startswith("note-").sum()) == round(density * n_entities)


# ------------------------------------------------------------------ retrieval
def test_search_is_necessary_and_sub_queries_suffice(
    world: tuple[pd.DataFrame, pd.DataFrame], tmp_path: Path
) -> None:
    """BM25 top-3: the whole question misses a hop for most questions; gold hop queries find them."""
    from agent_r1.retrieval import build_index, retrieval_metrics

    questions, corpus = world
    index = build_index("bm25", corpus, tmp_path / "bm25", RetrievalConfig())
    m = retrieval_metrics(index, questions, top_k=3)
    print("\nretrieval@3", json.dumps({k: m[k] for k in ("question", "sub_queries")}))
    for qtype, v in m["by_type"].items():
        print(f"  {qtype}: {json.dumps(v)}")
    assert m["question"]["all_found"] <= 0.35
    assert m["sub_queries"]["all_found"] >= 0.9
    assert m["sub_queries"]["recall"] >= 0.95
    assert m["by_type"]["bridge"]["question"]["all_found"] <= 0.1
    assert m["by_type"]["compositional"]["question"]["all_found"] <= 0.1

    # stricter than the union above: each hop's own query puts that hop's document in its top 3
    rows = [(q, t) for qs, ts in zip(questions["sub_queries"], questions["supporting_titles"]) for q, t in zip(qs, ts)]
    hits = index.search([q for q, _ in rows], 3)
    per_hop = sum(t in {h.title for h in hs} for (_, t), hs in zip(rows, hits)) / len(rows)
    print(f"  per-hop sub-query hit@3: {per_hop:.3f}")
    assert per_hop >= 0.95


# ------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("overrides", "field_name"),
    [
        ({"n_train": 100_000}, "n_train"),
        ({"n_test": 10_000}, "n_test"),
        ({"entities_per_type": 40, "n_train": 50, "n_test": 20, "n_test_ood": 500}, "n_test_ood"),
    ],
)
def test_infeasible_sizes_name_the_field(overrides: dict, field_name: str) -> None:
    cfg = SyntheticConfig(**{**SMALL, **overrides})
    with pytest.raises(ValueError, match=rf"SyntheticConfig\.{field_name}={getattr(cfg, field_name)} "):
        generate(cfg, SEED)


def test_generated_answer_normalising_to_empty_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    """The synthetic world goes through the same check: a punctuation-only answer fails, naming the question."""
    from agent_r1.config import SyntheticConfig
    from agent_r1.data import synthetic
    from agent_r1.data.schema import SchemaError

    real, calls = synthetic._record, []

    def first_answer_is_punctuation(question, answer, *rest):  # fault injection: one answer becomes "!!"
        calls.append(answer)
        return real(question, "!!" if len(calls) == 1 else answer, *rest)

    monkeypatch.setattr(synthetic, "_record", first_answer_is_punctuation)
    cfg = SyntheticConfig(n_train=40, n_test=20, n_test_ood=10, n_test_ood_2hop=10, n_test_paraphrase=10, entities_per_type=40)
    with pytest.raises(SchemaError, match=r"synthetic\(seed=3\): question id 'syn-\w+-\d+': answer '!!' normalises to the empty string"):
        synthetic.generate(cfg, seed=3)
