"""A user's own data source, named in params as ``package.module:Name``, through the download and prepare stages.

The plugins are real modules written into ``tmp_path`` and put on ``sys.path``, as a user's
project folder is when the stages run from it. Each test uses its own module name: the
registry keeps a loaded plugin for the rest of the session.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from agent_r1.config import ParamsError, parse_params

GENERATED = '''
from agent_r1.config import PluginOptions
from agent_r1.data.schema import corpus_frame, questions_frame
from agent_r1.data.sources import DataSource

CAPITALS = {"Arnor": "Annuminas", "Gondor": "Minas Tirith", "Rohan": "Edoras", "Eriador": "Bree", "Harad": "Umbar"}


class Capitals(DataSource):
    """Five documents; one question per country, the first ``test`` of them test questions."""

    class Options(PluginOptions):
        test: int

    def generate(self, data):
        n_test = self.options.test
        docs = [{"doc_id": f"cap-{i}", "title": c, "text": f"The capital of {c} is {t}."}
                for i, (c, t) in enumerate(CAPITALS.items())]
        questions = [{"id": f"q{i}", "question": f"What is the capital of {c}?", "answers": [t],
                      "supporting_titles": [c], "type": "lookup", "source": "capitals",
                      "split": "test" if i < n_test else "train", "sub_queries": [f"capital of {c}"]}
                     for i, (c, t) in enumerate(CAPITALS.items())]
        return questions_frame(questions), corpus_frame(docs)


class Empty(Capitals):
    def generate(self, data):
        questions, corpus = super().generate(data)
        return questions, corpus.iloc[:0]
'''

# A published file in a format of its own (tab-separated: id, question, answer, title, text), one split only.
DOWNLOADED = '''
from pathlib import Path

from agent_r1.data.schema import corpus_frame, questions_frame
from agent_r1.data.sources import DataSource


class TabQA(DataSource):
    downloads = True
    urls = {{"dev": {url!r}}}
    files = {{"dev": "tabqa.tsv"}}

    def read(self, path, max_questions=None):
        rows = [line.split("\\t") for line in Path(path).read_text().splitlines() if line.strip()]
        rows = rows[:max_questions]
        questions = [{{"id": i, "question": q, "answers": [a], "supporting_titles": [t], "type": "tab",
                       "source": "tabqa", "split": "unsplit", "sub_queries": [t]}} for i, q, a, t, _ in rows]
        docs = [{{"doc_id": f"tab-{{i}}", "title": t, "text": x}} for i, _, _, t, x in rows]
        return questions_frame(questions), corpus_frame(docs)
'''

TSV = "".join(
    f"t{i}\tWho wrote book {i}?\tAuthor {i}\tBook {i}\tBook {i} was written by Author {i}.\n" for i in range(6)
)


def _plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, code: str) -> None:
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(code))
    monkeypatch.syspath_prepend(str(tmp_path))


def _project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    return project


def test_generated_plugin_source_is_prepared_and_indexed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agent_r1 import paths
    from agent_r1.data.schema import read_corpus, read_questions
    from agent_r1.retrieval import build_index
    from agent_r1.retrieval.metrics import retrieval_metrics
    from agent_r1.stages.download import download_data
    from agent_r1.stages.prepare import prepare

    _plugin(tmp_path, monkeypatch, "capitals_gen", GENERATED)
    params = parse_params({"data": {"source": "capitals_gen:Capitals", "options": {"test": 2}, "val_questions": 1}})
    _project(tmp_path, monkeypatch)
    download_data(params)  # downloads nothing; records the source
    assert json.loads(paths.RAW_SOURCE.read_text()) == {"source": "capitals_gen:Capitals", "file": None}
    prepare(params)
    train, test = read_questions(paths.TRAIN_QUESTIONS), read_questions(paths.TEST_QUESTIONS)
    val = read_questions(paths.VAL_QUESTIONS)
    assert list(test["id"]) == ["q0", "q1"] and sorted([*train["id"], *val["id"]]) == ["q2", "q3", "q4"]  # test = 2
    assert len(val) == 1  # data.val_questions, carved out of train
    corpus = read_corpus(paths.CORPUS)
    assert len(corpus) == 5
    # the index stage's BM25 over a five-document corpus: the capital question finds its country's document
    index = build_index("bm25", corpus, tmp_path / "bm25", params.retrieval)
    assert index.search(["capital of Rohan"], 1)[0][0].title == "Rohan"
    assert retrieval_metrics(index, test, 3)["question"]["recall"] == 1.0


def test_generated_plugin_with_an_empty_corpus_names_the_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agent_r1.data.prepare import load_questions_and_corpus
    from agent_r1.data.schema import SchemaError

    _plugin(tmp_path, monkeypatch, "capitals_empty", GENERATED)
    params = parse_params({"data": {"source": "capitals_empty:Empty", "options": {"test": 2}}})
    with pytest.raises(SchemaError, match=r"data.source 'capitals_empty:Empty': the corpus is empty"):
        load_questions_and_corpus(params.data, tmp_path / "raw")


def test_downloaded_plugin_source_goes_through_download_and_prepare(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent_r1 import paths
    from agent_r1.data.schema import read_corpus, read_questions
    from agent_r1.stages.download import download_data
    from agent_r1.stages.prepare import prepare

    published = tmp_path / "published.tsv"
    published.write_text(TSV)
    _plugin(tmp_path, monkeypatch, "tabqa_src", DOWNLOADED.format(url=published.as_uri()))
    params = parse_params({"data": {"source": "tabqa_src:TabQA", "val_questions": 1,
                                    "real": {"max_questions": 5, "test_fraction": 0.4}}})
    _project(tmp_path, monkeypatch)
    download_data(params)
    assert json.loads(paths.RAW_SOURCE.read_text()) == {"sources": {"tabqa_src:TabQA": "tabqa_src.TabQA/tabqa.tsv"},
                                                        "test_only": []}
    manifest = json.loads((paths.RAW_DIR / "tabqa_src.TabQA" / "manifest.json").read_text())
    assert manifest["source"] == "tabqa_src:TabQA" and manifest["url"] == published.as_uri()
    assert (paths.RAW_DIR / "tabqa_src.TabQA" / "tabqa.tsv").read_text() == TSV
    prepare(params)
    train, test = read_questions(paths.TRAIN_QUESTIONS), read_questions(paths.TEST_QUESTIONS)
    val = read_questions(paths.VAL_QUESTIONS)
    assert sorted([*train["id"], *val["id"], *test["id"]]) == [f"t{i}" for i in range(5)]  # max_questions, by hash
    assert len(val) == 1
    assert len(train) and len(test) and set(test["source"]) == {"tabqa"}
    assert list(read_corpus(paths.CORPUS)["title"]) == [f"Book {i}" for i in range(5)]


def test_downloaded_plugin_as_test_only_beside_a_built_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plugin mixes with the built-ins: HotpotQA in-domain, the plugin out-of-domain, one corpus."""
    from test_official import HOTPOT, _write_json

    from agent_r1.data.download import download_sources
    from agent_r1.data.prepare import load_questions_and_corpus

    published = tmp_path / "published.tsv"
    published.write_text(TSV)
    _plugin(tmp_path, monkeypatch, "tabqa_ood", DOWNLOADED.format(url=published.as_uri()))
    hotpot = _write_json(tmp_path / "hotpot.json", HOTPOT)
    params = parse_params({"data": {"source": ["hotpotqa"], "test_only": ["tabqa_ood:TabQA"], "val_questions": 0,
                                    "real": {"mirrors": {"hotpotqa": {"url": hotpot.as_uri()}}}}})
    download_sources(params.data, tmp_path / "raw")
    questions, corpus = load_questions_and_corpus(params.data, tmp_path / "raw")
    by = questions.groupby(["source", "split"]).size().to_dict()
    assert by[("tabqa", "test")] == 6 and ("tabqa", "train") not in by
    assert by.get(("hotpotqa", "train"), 0) + by.get(("hotpotqa", "test"), 0) == len(HOTPOT)
    assert corpus["doc_id"].is_unique and {f"Book {i}" for i in range(6)} <= set(corpus["title"])


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"source": "no_such_module_xyz:Source"}, "data.source: plugin 'no_such_module_xyz:Source' could not be "
                                                   "imported: ModuleNotFoundError"),
        ({"source": "bad_sources:Missing"}, "data.source: plugin 'bad_sources:Missing' could not be imported: "
                                            "ImportError: module 'bad_sources' has no attribute 'Missing'"),
        ({"source": "bad_sources:NotASource"}, "data.source: plugin 'bad_sources:NotASource' is no data source: "
                                               "must be a subclass of agent_r1.data.sources.DataSource"),
        ({"source": "bad_sources:NoGenerate"}, "data.source: plugin 'bad_sources:NoGenerate' is no data source: "
                                               "must implement generate(data)"),
        ({"source": "bad_sources:NoRead"}, "data.source: plugin 'bad_sources:NoRead' is no data source: "
                                           "has downloads = True but does not implement read"),
        ({"source": ["hotpotqa", "bad_sources:Generated"]}, "data.source: a list holds downloaded sources only; "
                                                           "['bad_sources:Generated'] generate"),
        ({"source": "hotpotqa", "test_only": ["bad_sources:Generated"]}, "data.test_only: a list holds downloaded"),
        ({"source": "bad_sources:DevOnly", "real": {"split": "train"}},
         "data.real.split: 'bad_sources:DevOnly' publishes the splits ['dev'], not 'train'"),
        ({"source": "synthetic", "options": {"n": 1}}, "data.options: none of the sources ['synthetic'] takes options"),
        ({"source": "bad_sources:Generated", "options": {"n": 1}},
         "data.options: none of the sources ['bad_sources:Generated'] takes options"),
        ({"source": "bad_sources:Sized"}, "data.options.n: required key is missing"),
        ({"source": "bad_sources:Sized", "options": {"n": "x"}}, "data.options.n: Input should be a valid integer"),
        ({"source": "bad_sources:Sized", "options": {"n": 1, "m": 2}}, "data.options.m: unknown key"),
        ({"source": "bad_sources:LooseOptions"}, "data.source: plugin 'bad_sources:LooseOptions' is no data source: "
                                                 "its Options must be a pydantic model that forbids unknown keys"),
    ],
)
def test_a_bad_plugin_source_fails_the_params_check_naming_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: dict, expected: str
) -> None:
    _plugin(tmp_path, monkeypatch, "bad_sources", '''
        from pydantic import BaseModel

        from agent_r1.config import PluginOptions
        from agent_r1.data.sources import DataSource

        class NotASource:
            def generate(self, data):
                return None

        class NoGenerate(DataSource):
            pass

        class NoRead(DataSource):
            downloads = True
            urls = {"dev": "file:///x"}
            files = {"dev": "x"}

        class Generated(DataSource):
            def generate(self, data):
                return None

        class DevOnly(NoRead):
            def read(self, path, max_questions=None):
                return None

        class Sized(Generated):
            class Options(PluginOptions):
                n: int

        class LooseOptions(Generated):
            class Options(BaseModel):  # ignores unknown keys: a misspelt option would pass unnoticed
                n: int = 1
    ''')
    with pytest.raises(ParamsError) as err:
        parse_params({"data": data})
    assert expected in str(err.value)


def test_registered_sources_pass_their_own_interface_check() -> None:
    """Each built-in is the kind its registry line says (``downloads``), and a complete one."""
    from agent_r1.data.sources import interface_problem
    from agent_r1.registry import DATA_SOURCES

    for name in DATA_SOURCES.names():
        cls = DATA_SOURCES.load(name)
        assert interface_problem(cls) is None, name
        assert cls.downloads == DATA_SOURCES.meta(name, "downloads", False), name
