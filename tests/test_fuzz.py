"""Property-based fuzzing of every boundary that text from a policy or a user crosses.

Each property runs twice from one function: ``test_NAME`` in the fast suite, under the
active Hypothesis profile (``ci``: derandomised, 100 examples), and
``test_NAME_fuzz``, marked slow, under the ``fuzz`` profile (10,000 examples) for
``make test-slow``. Both profiles are registered in ``tests/conftest.py``.

The boundaries: the two action parsers, ``ToolEnv.step_batch`` over a real BM25 index,
the params loader, and the official HotpotQA / 2Wiki / MuSiQue readers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from agent_r1.config import EnvConfig, Params, ParamsError, RetrievalConfig, SyntheticConfig, load_params, parse_params
from agent_r1.data.official import OfficialFormatError, convert_file, doc_id
from agent_r1.data.schema import CORPUS_COLUMNS, QUESTION_COLUMNS, validate_corpus, validate_questions
from agent_r1.data.synthetic import generate
from agent_r1.env import (
    MAX_CALLS_PER_TURN,
    TERMINATIONS,
    Episode,
    ParsedAction,
    SearchTool,
    ToolCall,
    ToolEnv,
    get_format,
)
from agent_r1.env.rewards import answer_score
from agent_r1.retrieval import build_index

FUZZ = settings.get_profile("fuzz")
_NO_FIXTURE_CHECK = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large]


def fuzz_twins(
    found: list[dict[str, Any]] | None = None, **strategies: st.SearchStrategy
) -> Callable[[Callable[..., None]], tuple[Any, Any]]:
    """``test_x, test_x_fuzz = fuzz_twins(...)(check_x)``: the fast test and its slow 10k-example twin.

    ``found``: inputs the fuzzer once falsified (each a bug since fixed), tried first on every run.
    """

    def make(check: Callable[..., None]) -> tuple[Any, Any]:
        twins = []
        for profile in (settings(), FUZZ):
            test = given(**strategies)(check)
            for kwargs in found or []:
                test = example(**kwargs)(test)
            # fixtures here are read-only (a module's index) or overwritten by every example (tmp_path's files)
            twins.append(settings(profile, suppress_health_check=_NO_FIXTURE_CHECK)(test))
        return twins[0], pytest.mark.slow(twins[1])

    return make


# Any character, lone UTF-16 surrogates included: JSON escapes ("\ud800") produce them.
any_text = st.text(st.characters(), max_size=60)
# Pieces that matter to the parsers and to JSON: tags, JSON punctuation, number and nesting bombs.
_FRAGMENTS = [
    "<search>", "</search>", "<answer>", "</answer>", "<tool_call>", "</tool_call>", "<think>", "</think>",
    "<information>", "<", ">", "</", '{"name": "search", "arguments": {"query": "x"}}', '{"name": ',
    '"arguments": ', '"query"', "{", "}", "[", "]", '"', "\\", ":", ",", "null", "1e999", "NaN", "-Infinity",
    "Velmora", " ", "\n", "\r", "\t", "\x00", "\ud800", "\ufeff", "\u2028", "🙂", "ä", "9" * 5000, "[" * 3000,
]
fragment_text = st.lists(st.one_of(st.sampled_from(_FRAGMENTS), any_text), max_size=30).map("".join)
long_text = st.one_of(any_text, st.builds(lambda c, n: c * n, st.characters(), st.integers(0, 3000)))
# JSON values as a policy would write them: no NaN (NaN != NaN would fail the comparison, not the parser)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | any_text,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(any_text, kids, max_size=3),
    max_leaves=10,
)
# a tool call's JSON object with right, wrong, missing or very long keys and values
tool_call_json = st.dictionaries(
    st.one_of(st.sampled_from(["name", "arguments"]), long_text), st.one_of(json_value, long_text), max_size=4
).map(lambda obj: f"<tool_call>{json.dumps(obj)}</tool_call>")
action_text = st.one_of(
    any_text,
    fragment_text,
    st.builds(lambda s, n: s * n, st.sampled_from(_FRAGMENTS[:20]), st.integers(0, 20_000)),
    tool_call_json,
)


# ===================================================================== action parsers
FORMAT_TAGS = {"tags": ("search", "answer"), "tool_call": ("tool_call", "answer")}
_ERROR_CHARS = 300  # error observations quote a fragment, never the whole turn back to the model


def tag_count(text: str, fmt: str) -> int:
    """Occurrences of the format's own opening and closing tags in ``text``."""
    return sum(text.count(f"<{t}>") + text.count(f"</{t}>") for t in FORMAT_TAGS[fmt])


def classify(parsed: ParsedAction) -> str:
    """The one class of a parse: invalid, answer, calls or no action; fails on a mixture."""
    assert isinstance(parsed, ParsedAction)
    flags = {"invalid": parsed.error is not None, "answer": parsed.answer is not None, "calls": bool(parsed.calls)}
    kinds = [name for name, on in flags.items() if on]
    assert len(kinds) <= 1, parsed
    return kinds[0] if kinds else "no_action"


def check_parse_classifies_every_text(fmt: str, text: str) -> None:
    """The raw parser (not the exception-catching wrapper) never raises and puts every text in one class."""
    parsed = get_format(fmt)._parse(text)
    kind = classify(parsed)
    # plain text (no tag of the format) is "no action"; any tag of the format makes it something else
    assert (kind == "no_action") == (tag_count(text, fmt) == 0), (kind, parsed)
    if kind == "invalid":
        assert isinstance(parsed.error, str) and 0 < len(parsed.error) <= _ERROR_CHARS, parsed.error
    if kind == "answer":
        assert parsed.answer and parsed.answer == parsed.answer.strip() and "<answer>" in text
    if kind == "calls":
        assert 1 <= len(parsed.calls) <= MAX_CALLS_PER_TURN
        for call in parsed.calls:
            assert isinstance(call.name, str) and call.name and call.name == call.name.strip()
            if fmt == "tags":
                assert call.name == "search" and set(call.arguments) == {"query"}
                assert call.arguments["query"] == call.arguments["query"].strip()


test_parse_classifies_every_text, test_parse_classifies_every_text_fuzz = fuzz_twins(
    found=[  # each quoted a 5000-character name or key back to the model in full
        {"fmt": "tool_call", "text": "<tool_call>" + json.dumps({"name": "x" * 5000, "arguments": "{"})
         + "</tool_call>"},  # fmt: skip
        {"fmt": "tool_call", "text": "<tool_call>" + json.dumps({"name": "x", "y" * 5000: 1}) + "</tool_call>"},
        # 60 characters cut before escaping: 61 ESCs became 240 characters of quote
        {"fmt": "tool_call", "text": "<tool_call>" + json.dumps({"name": "\x1b" * 61, "arguments": "\x1b" * 61})
         + "</tool_call>"},  # fmt: skip
    ],
    fmt=st.sampled_from(["tags", "tool_call"]),
    text=action_text,
)(check_parse_classifies_every_text)


@st.composite
def well_formed_turn(draw: st.DrawFn, fmt: str) -> tuple[str, ParsedAction]:
    """A turn that follows the format, with free text around it, and the parse it must give."""
    prefix, suffix = draw(any_text), draw(any_text)
    if draw(st.booleans()):
        answer = draw(any_text)
        body = f"<answer>{answer}</answer>"
        expected = ParsedAction(answer=answer.strip()) if answer.strip() else ParsedAction(error="empty <answer>")
        return prefix + body + suffix, expected
    fmt_obj = get_format(fmt)
    if fmt == "tags":
        calls = [ToolCall("search", {"query": q}) for q in draw(st.lists(any_text, min_size=1, max_size=3))]
        expected = ParsedAction(calls=[ToolCall("search", {"query": c.arguments["query"].strip()}) for c in calls])
    else:
        names = draw(st.lists(any_text.filter(lambda s: s.strip()), min_size=1, max_size=3))
        calls = [ToolCall(n, draw(st.dictionaries(any_text, json_value, max_size=3))) for n in names]
        expected = ParsedAction(calls=[ToolCall(c.name.strip(), c.arguments) for c in calls])
    gaps = [draw(any_text) for _ in calls]
    body = "".join(g + fmt_obj.render_call(c) for g, c in zip(gaps, calls))
    return prefix + body + suffix, expected


def check_parse_round_trips_well_formed_turns(fmt: str, data: st.DataObject) -> None:
    """What the format's own rendering writes parses back to exactly the call or answer written."""
    text, expected = data.draw(well_formed_turn(fmt))
    # the free text and arguments must not themselves hold a tag of the format (that is a malformed turn)
    n_tags = 2 * (len(expected.calls) or 1)
    assume(tag_count(text, fmt) == n_tags)
    assert get_format(fmt)._parse(text) == expected


test_parse_round_trips_well_formed_turns, test_parse_round_trips_well_formed_turns_fuzz = fuzz_twins(
    fmt=st.sampled_from(["tags", "tool_call"]), data=st.data()
)(check_parse_round_trips_well_formed_turns)


# ================================================================ ToolEnv.step_batch
@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], Any, set[str]]:
    """Questions of a tiny synthetic world, a real BM25 index over its corpus, and the corpus's doc ids."""
    questions, corpus = generate(SyntheticConfig(entities_per_type=20, n_train=12, n_test=4, n_test_ood=2, n_test_ood_2hop=2, n_test_paraphrase=2), seed=3)
    index = build_index("bm25", corpus, tmp_path_factory.mktemp("fuzz") / "bm25", RetrievalConfig())
    records = [{k: list(v) if k in ("answers", "supporting_titles", "sub_queries") else v for k, v in r.items()}
               for r in questions.to_dict("records")]  # fmt: skip
    return records, index, set(corpus["doc_id"])


unit = st.floats(0.0, 1.0)
env_config = st.fixed_dictionaries({
    "format": st.sampled_from(["tags", "tool_call"]),
    "max_turns": st.integers(1, 5),
    "top_k": st.integers(1, 4),
    "one_shot": st.booleans(),
    "doc_chars": st.integers(20, 400),
    # huge and infinite timeouts are values a params file can hold: the env must cope or params refuse them
    "tool_timeout_s": st.sampled_from([10.0, 10.0, 10.0, 3600.0, 1e12, float("inf")]),
    "reward": st.fixed_dictionaries({
        "scheme": st.sampled_from(["paper", "answer_only", "answer_plus_format"]),
        "answer_metric": st.sampled_from(["em", "f1"]),
        "format_score": unit,
        "process": st.fixed_dictionaries({
            "enabled": st.booleans(), "valid_call": st.floats(-1.0, 1.0), "new_support_doc": st.floats(-1.0, 1.0),
            "invalid_call": st.floats(-1.0, 1.0), "cap": unit, "only_if_answered": st.booleans(),
        }),
    }),
})  # fmt: skip


def env_from_params(raw: dict) -> EnvConfig | None:
    """The env config the params loader makes of ``raw``, or None when it refuses it (naming a key)."""
    try:
        return parse_params({"env": raw}).env
    except ParamsError as exc:
        assert all(p.startswith("env.") for p in exc.problems), exc
        return None


@st.composite
def turn_for(draw: st.DrawFn, fmt: str, record: dict, titles: list[str]) -> str:
    """One turn: a search for a title or a word, the gold or another answer, or anything at all."""
    fmt_obj = get_format(fmt)
    kind = draw(st.sampled_from(["search", "search", "answer", "raw"]))
    if kind == "search":
        query = draw(st.one_of(st.sampled_from(titles), any_text, st.sampled_from(["the", "a of", "!!", "  "])))
        return draw(any_text) + fmt_obj.render_call(ToolCall("search", {"query": query}))
    if kind == "answer":
        return "<answer>" + draw(st.one_of(st.sampled_from(record["answers"]), any_text)) + "</answer>"
    return draw(action_text)


def check_step_batch_invariants(world: tuple[list[dict], Any, set[str]], raw_cfg: dict, data: st.DataObject) -> None:
    """Any turns through a real index: no exception, one result each, bounded rewards, consistent ends."""
    records, index, doc_ids = world
    cfg = env_from_params(raw_cfg)
    assume(cfg is not None)
    env = ToolEnv([SearchTool(index, cfg.top_k)], cfg)
    picked = data.draw(st.lists(st.sampled_from(records), min_size=1, max_size=3))
    episodes = [env.reset(r) for r in picked]
    n_start = len(episodes[0].messages)
    titles = sorted({t for r in records for t in r["supporting_titles"]})
    for _ in range(cfg.max_turns + 1):
        active = [e for e in episodes if not e.done]
        if not active:
            break
        texts = [data.draw(turn_for(cfg.format, e.record, titles)) for e in active]
        results = env.step_batch(active, texts)
        assert len(results) == len(active)
        for ep, res in zip(active, results):
            assert res.done == ep.done and (res.observation is None) == res.done
            assert res.observation_role == env.format.observation_role
            # a valid search of an in-process index always runs: never a tool failure or a timeout
            assert res.done or "Error: tool 'search'" not in res.observation, res.observation
            assert ep.turn <= cfg.max_turns and (ep.done or ep.turn < cfg.max_turns)
            assert len(ep.turn_rewards) == ep.turn and all(math.isfinite(r) for r in ep.turn_rewards)
    for ep in episodes:
        if not ep.done:
            env.finish(ep, "max_length")
        check_finished_episode(ep, cfg, doc_ids, n_start)


def check_finished_episode(ep: Episode, cfg: EnvConfig, doc_ids: set[str], n_start: int) -> None:
    """Rewards within the scheme's bounds, process rewards capped, metrics and messages consistent."""
    reward, process = cfg.reward, cfg.reward.process
    answered = ep.termination == "answer"
    assert ep.termination in TERMINATIONS and ep.metrics["answered"] == answered
    assert (ep.termination == "max_turns") <= (ep.turn == cfg.max_turns)
    s = answer_score(ep.answer, list(ep.record["answers"]), reward.answer_metric) if answered else 0.0
    expected = {"paper": s if answered else reward.format_score - 1.0, "answer_only": s,
                "answer_plus_format": s + (reward.format_score if answered else 0.0)}[reward.scheme]  # fmt: skip
    assert 0.0 <= s <= 1.0 and ep.outcome_reward == pytest.approx(expected)
    final = ep.final_turn_rewards
    assert len(final) == ep.turn and all(math.isfinite(r) for r in final)
    positive = sum(r for r in final if r > 0)
    # capped, so process rewards never out-pay a right answer (1.0 under every scheme)
    assert positive <= process.cap + 1e-9 and process.cap <= 1.0
    if not process.enabled:
        assert final == [0.0] * ep.turn
    elif process.only_if_answered and not answered:
        assert positive == 0.0  # a non-answering episode can only lose by its process rewards
    if process.enabled:  # finalising only scales positive rewards down: penalties are never waived
        assert all(out == raw if raw <= 0 else 0.0 <= out <= raw for raw, out in zip(ep.turn_rewards, final))
    m = ep.metrics
    assert 0.0 <= m["em"] <= 1.0 and 0.0 <= m["f1"] <= 1.0
    assert 0 <= m["invalid_calls"] <= m["tool_calls"] <= MAX_CALLS_PER_TURN * ep.turn
    assert m["support_docs_found"] <= m["support_docs_total"] and ep.seen_doc_ids <= doc_ids
    assert m["process_reward"] == pytest.approx(sum(final))
    # each turn: the assistant's text, then its observation, except for the turn that ended the episode
    ended_by_step = ep.termination != "max_length"
    expected_roles = ["assistant", get_format(cfg.format).observation_role] * ep.turn
    assert [msg["role"] for msg in ep.messages[n_start:]] == expected_roles[: len(expected_roles) - ended_by_step]


test_step_batch_invariants, test_step_batch_invariants_fuzz = fuzz_twins(raw_cfg=env_config, data=st.data())(
    check_step_batch_invariants
)


@pytest.mark.parametrize("timeout", [3600.0, 1e12, float("inf")])
def test_tool_timeouts_the_params_accept_work(world: tuple[list[dict], Any, set[str]], timeout: float) -> None:
    """Found by fuzzing: ``tool_timeout_s: 1e12`` (or ``.inf``) was accepted, then every step raised OverflowError."""
    records, index, _ = world
    cfg = env_from_params({"tool_timeout_s": timeout})
    if cfg is None:  # refused, naming env.tool_timeout_s: fine, as long as a sane hour is accepted
        assert timeout > 3600.0
        return
    env = ToolEnv([SearchTool(index, 1)], cfg)
    episode = env.reset(records[0])
    [res] = env.step_batch([episode], [f"<search>{records[0]['supporting_titles'][0]}</search>"])
    assert res.observation.startswith("<information>Doc 1 (")


# ===================================================================== params loader
PARAM_GROUPS = tuple(Params.model_fields)
_DEFAULTS = Params().model_dump(mode="json")
yaml_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | any_text
    | st.sampled_from([10**400, "2020-13-45", "", "sft", "tags"]),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.one_of(any_text, st.integers()), kids, max_size=3),
    max_leaves=8,
)  # fmt: skip


def key_paths(tree: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path of a nested mapping, so mutations land on real keys most of the time."""
    if not isinstance(tree, dict):
        return []
    return [p for k, v in tree.items() for p in [(*prefix, k), *key_paths(v, (*prefix, k))]]


@st.composite
def mutated_params(draw: st.DrawFn) -> Any:
    """The defaults with a few keys set to anything, deleted or misspelt; sometimes not a mapping at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(yaml_value)
    raw = json.loads(json.dumps(_DEFAULTS))
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(key_paths(raw) or [("data",)]))
        parent = raw
        for k in path[:-1]:
            parent = parent.get(k) if isinstance(parent, dict) else None
        if not isinstance(parent, dict):
            continue
        action = draw(st.sampled_from(["set", "set", "delete", "add"]))
        if action == "set":
            parent[path[-1]] = draw(yaml_value)
        elif action == "delete":
            parent.pop(path[-1], None)
        else:
            parent[draw(st.one_of(any_text, st.integers()))] = draw(yaml_value)
    return raw


def check_params_error_names_keys(exc: ParamsError, raw: Any) -> None:
    """Every problem line starts with the key it is about (or ``<root>`` / ``<yaml>``)."""
    assert exc.problems and all(isinstance(p, str) for p in exc.problems)
    str(exc).encode()  # the message itself can be printed
    keys = {str(k) for k in (raw if isinstance(raw, dict) else {})} | set(PARAM_GROUPS) | {"<root>", "<yaml>"}
    for problem in exc.problems:
        assert problem.startswith(tuple(k for k in keys if k)), problem


def check_params_accepted_are_usable(params: Params) -> None:
    """A config the loader accepts holds no NaN or infinity (a timeout of inf crashes the env),
    and every seed seeds numpy (pandas' random_state; the strictest of the seeded libraries)."""
    leaves = _leaves(params.model_dump())
    floats = [v for _, v in leaves if isinstance(v, float)]
    assert all(math.isfinite(v) for v in floats), floats
    for key, value in leaves:
        if key == "seed":
            np.random.RandomState(value)


def _leaves(tree: Any, key: Any = None) -> list[tuple[Any, Any]]:
    """``(key, value)`` of every leaf of a nested mapping (list items keep their list's key)."""
    if isinstance(tree, dict):
        return [x for k, v in tree.items() for x in _leaves(v, k)]
    if isinstance(tree, list):
        return [x for v in tree for x in _leaves(v, key)]
    return [(key, tree)]


def check_parse_params_only_raises_params_error(raw: Any) -> None:
    """Any mapping (or non-mapping): a valid Params, or ParamsError naming each bad key."""
    try:
        params = parse_params(raw, "<fuzz>")
    except ParamsError as exc:
        check_params_error_names_keys(exc, raw)
        return
    check_params_accepted_are_usable(params)


test_parse_params_only_raises_params_error, test_parse_params_only_raises_params_error_fuzz = fuzz_twins(
    found=[
        {"raw": {"env": {"tool_timeout_s": float("inf")}}},  # was accepted; then every rollout step crashed
        {"raw": {"rollout": {"temperature": float("inf")}}},
        {"raw": {True: 1}},  # was named "1: Keys should be strings"
        {"raw": {"eval": {"seed": -1}}},  # was accepted; the evaluate stage's pandas sample then raised
        {"raw": {"train": {"seed": 2**70}}},  # was accepted; torch.manual_seed then raised
    ],
    raw=mutated_params(),
)(check_parse_params_only_raises_params_error)

_YAML_FRAGMENTS = [
    "data:\n", "env:\n", "  ", "seed: ", "tool_timeout_s: ", "experiments:\n  x:\n    overrides:\n      ",
    "2020-13-45", "2001-02-30 10:00:00", "!!int x", "!!float y", "!!timestamp z", "!!binary =", "!!set ",
    "!!omap ", "!!str ", "!!python/name:os.system", ".inf", "-.inf", ".nan", "0x", "0o9", "1_000", "1e999",
    "&a ", "*a", "*b", "<<: *a\n", "[", "]", "{", "}", "? ", "- ", ": ", "\t", "\n", '"\\ud800"', "'", '"',
    "#", "%YAML 1.1\n", "---\n", "...\n", "~", "null", "true", "|\n", ">\n", "\x00", "\ufeff", "\x85",
    "[" * 700, "- " * 2000,  # two of them pass the recursion limit; PyYAML takes seconds on longer "[" runs
]  # fmt: skip
yaml_bytes = st.lists(
    st.one_of(st.sampled_from(_YAML_FRAGMENTS).map(str.encode), any_text.map(lambda s: s.encode("utf-8", "replace")),
              st.binary(max_size=4)),
    max_size=30,
).map(b"".join)  # fmt: skip


def check_load_params_only_raises_params_error(tmp_path: Path, content: bytes) -> None:
    """Any bytes in a params file: a valid Params, or ParamsError naming the file and a key or the YAML line."""
    path = tmp_path / "params.yaml"
    path.write_bytes(content)
    try:
        raw = yaml.safe_load(content.decode())  # the keys a problem may name
    except Exception:
        raw = {}
    try:
        params = load_params(path)
    except ParamsError as exc:
        assert exc.source == str(path) and str(path) in str(exc)
        check_params_error_names_keys(exc, raw)
        return
    check_params_accepted_are_usable(params)


test_load_params_only_raises_params_error, test_load_params_only_raises_params_error_fuzz = fuzz_twins(
    found=[  # each raised a raw UnicodeDecodeError / ValueError / AttributeError / RecursionError
        {"content": b"data:\n  seed: 0\x80\n"},
        {"content": b"data:\n  seed: 2020-13-45\n"},
        {"content": b"data:\n  seed: !!int x\n"},
        {"content": b"env:\n  tool_timeout_s: !!float y\n"},
        {"content": b"data: !!timestamp z\n"},
        {"content": b"[" * 1000},  # deep enough under Hypothesis, which raises the recursion limit
        {"content": b"env:\n  tool_timeout_s: .inf\n"},
    ],
    content=yaml_bytes,
)(check_load_params_only_raises_params_error)


# ============================================================ official-format readers
short = st.text(max_size=12)  # printable-ish text; any_text (with surrogates) comes in through mutations
some = st.text(min_size=1, max_size=12).filter(str.strip)


@st.composite
def hotpot_record(draw: st.DrawFn, source: str) -> dict:
    """A record in the published HotpotQA / 2Wiki layout."""
    context = draw(st.lists(st.tuples(some, st.lists(short, max_size=3)).map(list), min_size=1, max_size=4))
    facts = draw(st.lists(st.tuples(st.sampled_from([c[0] for c in context]), st.integers(0, 3)).map(list), max_size=3))
    rec = {"_id": draw(some), "answer": draw(some), "question": draw(some), "type": draw(st.sampled_from(
        ["bridge", "comparison"])), "context": context, "supporting_facts": facts}  # fmt: skip
    if source == "2wikimultihopqa" and draw(st.booleans()):
        rec["aliases"] = draw(st.lists(some, max_size=2))
    return rec


@st.composite
def musique_record(draw: st.DrawFn) -> dict:
    """A record in the published MuSiQue layout (``#k`` references, supporting idx, answerable)."""
    n = draw(st.integers(1, 4))
    paragraphs = [{"idx": i, "title": draw(some), "paragraph_text": draw(short), "is_supporting": draw(st.booleans())}
                  for i in range(n)]  # fmt: skip
    hop = st.sampled_from(["#1 >> spouse", "Who is #2?", "X >> y", "#9 Dream"])  # references, relations, literals
    support = st.one_of(st.none(), st.integers(0, n - 1))
    steps = [{"id": k, "question": draw(hop) + draw(short), "answer": draw(some), "paragraph_support_idx": draw(support)}
             for k in range(draw(st.integers(1, 3)))]  # fmt: skip
    return {"id": draw(st.sampled_from(["2hop__", "3hop1__", "x"])) + draw(some), "paragraphs": paragraphs,
            "question": draw(some), "question_decomposition": steps, "answer": draw(some),
            "answer_aliases": draw(st.lists(some, max_size=2)), "answerable": draw(st.booleans())}  # fmt: skip


def mutate_json(draw: st.DrawFn, tree: Any) -> Any:
    """``tree`` with one value replaced by anything, or one key deleted."""
    paths: list[tuple] = [()]

    def walk(node: Any, path: tuple) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
        for k, v in items:
            paths.append((*path, k))
            walk(v, (*path, k))

    walk(tree, ())
    path = draw(st.sampled_from(paths))
    if not path:
        return draw(yaml_value)
    parent = tree
    for k in path[:-1]:
        parent = parent[k]
    if isinstance(parent, dict) and draw(st.booleans()):
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(st.one_of(yaml_value, any_text))
    return tree


@st.composite
def official_file(draw: st.DrawFn) -> tuple[str, bytes]:
    """(source, file bytes): valid records in the published layout, then mutated as JSON and as text."""
    source = draw(st.sampled_from(["hotpotqa", "2wikimultihopqa", "musique"]))
    make = musique_record() if source == "musique" else hotpot_record(source)
    records: Any = draw(st.lists(make, min_size=1, max_size=3))
    for _ in range(draw(st.integers(0, 2))):
        records = mutate_json(draw, records)
    as_jsonl = (source == "musique") != (draw(st.integers(0, 19)) == 0)  # sometimes the other source's layout
    if as_jsonl and isinstance(records, list):
        text = "".join(json.dumps(r) + "\n" for r in records)
    else:
        text = json.dumps(records, indent=draw(st.sampled_from([None, 1])))
    raw = text.encode()  # ASCII: lone surrogates travel as JSON escapes, as in a real file
    if draw(st.integers(0, 3)) == 0:  # a cut-off download, or a spliced-in fragment
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] if draw(st.booleans()) else raw[:at] + draw(st.sampled_from(_FRAGMENTS)).encode(
            "utf-8", "surrogatepass") + raw[at:]  # fmt: skip
    return source, raw


def check_readers_only_raise_their_error(tmp_path: Path, case: tuple[str, bytes]) -> None:
    """Any official-format file: parquet files of valid normalised records, or OfficialFormatError naming the file."""
    source, raw = case
    path = tmp_path / "official.json"
    path.write_bytes(raw)
    out = tmp_path / "out"
    try:
        n_questions, n_docs = convert_file(source, path, out)
    except OfficialFormatError as exc:
        assert str(exc).startswith(str(path)), exc
        str(exc).encode()  # the message itself can be printed
        return
    questions, corpus = pd.read_parquet(out / "questions.parquet"), pd.read_parquet(out / "corpus.parquet")
    assert (len(questions), len(corpus)) == (n_questions, n_docs)
    assert list(questions.columns) == list(QUESTION_COLUMNS) and list(corpus.columns) == list(CORPUS_COLUMNS)
    validate_questions(questions)
    validate_corpus(corpus)
    assert (questions["source"] == source).all() and questions["id"].is_unique
    assert all(len(a) and a[0].strip() and all(isinstance(x, str) for x in a) for a in questions["answers"])
    assert all(d == doc_id(source, t, x) for d, t, x in corpus.itertuples(index=False))


_VALID = '{"_id": "a", "answer": "b", "question": "c?", "type": "bridge", "context": [["T", ["s."]]], '
_FOUND_FILES = [  # each raised a raw ValueError / RecursionError / UnicodeEncodeError
    ("hotpotqa", f'[{_VALID}"supporting_facts": [["T", {"9" * 5000}]]}}]'.encode()),
    ("2wikimultihopqa", b"[" * 100_000),
    ("musique", b'{"id": "x", "paragraphs": [' + b"[" * 100_000 + b"\n"),
    ("hotpotqa", f'[{_VALID}"supporting_facts": [["T\\ud800", 0]]}}]'.encode()),
    ("hotpotqa", f'[{_VALID}"supporting_facts": [], "\\udc00": 1}}]'.encode()),
]
test_readers_only_raise_their_error, test_readers_only_raise_their_error_fuzz = fuzz_twins(
    found=[{"case": case} for case in _FOUND_FILES], case=official_file()
)(
    check_readers_only_raise_their_error
)


def test_profiles_are_registered() -> None:
    """The slow twins really run 10,000 examples; the ci profile is derandomised."""
    assert settings.get_profile("fuzz").max_examples >= 10_000
    assert settings.get_profile("ci").derandomize
