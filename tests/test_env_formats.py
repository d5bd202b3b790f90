"""Parsing and rendering of the tags and tool_call formats, including a fuzz test that parse never raises."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_r1.env.formats import (
    MAX_CALLS_PER_TURN,
    ParsedAction,
    TagFormat,
    ToolCall,
    ToolCallFormat,
    get_format,
)
from agent_r1.env.tools import SearchTool, Tool


class NoIndex:
    def search(self, queries: list[str], top_k: int) -> list:
        return [[] for _ in queries]


class Lookup(Tool):
    name = "lookup"
    description = "Look up a word in the dictionary."
    parameters = {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}

    def execute(self, args: dict[str, Any]) -> str:
        return args["word"]


TAGS = TagFormat()
TOOL_CALL = ToolCallFormat()


def call(query: str) -> ToolCall:
    return ToolCall("search", {"query": query})


def tc(query: str) -> str:
    return '<tool_call>{"name": "search", "arguments": {"query": "%s"}}</tool_call>' % query


# ------------------------------------------------------------------ tags
@pytest.mark.parametrize(
    "text, expected",
    [
        ("<search>Velmora Labs</search>", ParsedAction(calls=[call("Velmora Labs")])),
        ("<think>first the company</think>\n<search> Velmora </search>", ParsedAction(calls=[call("Velmora")])),
        ("I know it. <answer> Quorvale </answer>", ParsedAction(answer="Quorvale")),
        ("<search>a</search><search>b</search>", ParsedAction(calls=[call("a"), call("b")])),
        ("<search></search>", ParsedAction(calls=[call("")])),  # empty query: the tool's validate rejects it
        ("just some text", ParsedAction()),
        ("", ParsedAction()),
        ("<think>unclosed think is free text", ParsedAction()),
        ("<b>bold</b> and <Search>x</Search>", ParsedAction()),  # unknown / other-case tags are free text
        ("<search>a</search> trailing words", ParsedAction(calls=[call("a")])),
    ],
)
def test_tags_parse_valid(text: str, expected: ParsedAction) -> None:
    assert TAGS._parse(text) == expected


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("<search>Velmora", "unclosed <search>"),
        ("Velmora</search>", "</search> without a matching <search>"),
        ("<search>x</answer>", "</answer> closes <search>"),
        ("<search>a <search>b</search></search>", "<search> opened inside <search>"),
        ("<answer>x <search>y</search></answer>", "<search> opened inside <answer>"),
        ("<answer>a</answer><answer>b</answer>", "2 answers"),
        ("<answer>   </answer>", "empty <answer>"),
        ("<search>q</search><answer>a</answer>", "either call a tool or answer"),
        ("<answer>a</answer><search>q</search>", "either call a tool or answer"),
        ("<search>q</search>" * (MAX_CALLS_PER_TURN + 1), f"{MAX_CALLS_PER_TURN + 1} tool calls"),
    ],
)
def test_tags_parse_malformed(text: str, fragment: str) -> None:
    parsed = TAGS._parse(text)
    assert parsed.error is not None and fragment in parsed.error
    assert parsed.calls == [] and parsed.answer is None


def test_tags_format_for_custom_tools() -> None:
    fmt = TagFormat([SearchTool(NoIndex(), 1), Lookup()])
    assert fmt.stop_strings == ["</search>", "</lookup>", "</answer>"]
    assert fmt._parse("<lookup>cat</lookup>") == ParsedAction(calls=[ToolCall("lookup", {"word": "cat"})])
    prompt = fmt.system_prompt([SearchTool(NoIndex(), 1), Lookup()], one_shot=False)
    assert "<lookup>word</lookup>: Look up a word" in prompt and "Example" not in prompt


def test_tags_format_refuses_tools_it_cannot_express() -> None:
    class TwoArgs(Lookup):
        name = "pair"
        parameters = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}}

    class Answer(Lookup):
        name = "answer"

    with pytest.raises(ValueError, match="'pair' takes arguments \\['a', 'b'\\]"):
        TagFormat([TwoArgs()])
    with pytest.raises(ValueError, match="reserved"):
        TagFormat([Answer()])


def test_tags_system_prompt_example_and_observations() -> None:
    tools = [SearchTool(NoIndex(), 3)]
    for one_shot in (True, False):
        text = TAGS.system_prompt(tools, one_shot=one_shot)
        assert "<search>query</search>" in text and "<answer>" in text and "<information>" in text
    example = TAGS.example_messages(tools)
    assert [m["role"] for m in example] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert example[0]["content"].startswith("Question: ")
    assert [TAGS.parse(m["content"]) for m in example[1::2]] == [
        ParsedAction(calls=[call("Velmora Labs founder")]),
        ParsedAction(calls=[call("Ilsa Brandt")]),
        ParsedAction(answer="Quorvale"),
    ]
    assert all(m["content"].startswith("<information>Doc 1 (") for m in example[2::2])
    assert TAGS.example_messages([Lookup()]) == []  # nothing to show: no tool of the set has an example
    assert TAGS.observation_role == "user" and not TAGS.uses_template_tools
    assert TAGS.stop_strings == ["</search>", "</answer>"]
    assert TAGS.format_observation(["r1", "r2"]) == "<information>r1</information>\n<information>r2</information>"
    assert TAGS.format_error("bad") == "<information>Error: bad</information>"


def test_tags_prompt_with_example_is_short(policy_dir) -> None:
    """The 135M model pays for every prompt token on every turn of every episode."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(policy_dir))
    tools = [SearchTool(NoIndex(), 3)]
    messages = [{"role": "system", "content": TAGS.system_prompt(tools, one_shot=True)}, *TAGS.example_messages(tools)]
    n = len(tok(tok.apply_chat_template(messages, tokenize=False), add_special_tokens=False)["input_ids"])
    assert n < 350


# -------------------------------------------------------------- tool_call
@pytest.mark.parametrize(
    "text, expected",
    [
        (tc("Velmora Labs"), ParsedAction(calls=[call("Velmora Labs")])),
        ("<think>hmm</think>\n" + tc("a") + tc("b"), ParsedAction(calls=[call("a"), call("b")])),
        (
            '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"x\\"}"}</tool_call>',
            ParsedAction(calls=[call("x")]),
        ),
        ('<tool_call>{"name": "search"}</tool_call>', ParsedAction(calls=[ToolCall("search", {})])),
        ('<tool_call>{"name": "nope", "arguments": {"q": 1}}</tool_call>', ParsedAction(calls=[ToolCall("nope", {"q": 1})])),
        ("<answer>Quorvale</answer>", ParsedAction(answer="Quorvale")),
        ("<search>x</search>", ParsedAction()),  # tags of the other format are just text here
    ],
)
def test_tool_call_parse_valid(text: str, expected: ParsedAction) -> None:
    assert TOOL_CALL._parse(text) == expected


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("<tool_call>{name: search}</tool_call>", "not valid JSON"),
        ("<tool_call></tool_call>", "not valid JSON"),
        ('<tool_call>["search"]</tool_call>', "must be a JSON object"),
        ('<tool_call>{"arguments": {}}</tool_call>', "needs a 'name'"),
        ('<tool_call>{"name": 3}</tool_call>', "needs a 'name'"),
        ('<tool_call>{"name": "search", "arguments": {}, "id": 1}</tool_call>', "unexpected key(s) ['id']"),
        ('<tool_call>{"name": "search", "arguments": "{oops"}</tool_call>', "not a JSON object"),
        (tc("a") + "<tool_call>{bad</tool_call>", "tool call 2: tool call is not valid JSON"),
        ('<tool_call>{"name": "search"', "unclosed <tool_call>"),
        (tc("a") + "<answer>b</answer>", "either call a tool or answer"),
        ("<tool_call>" + "[" * 100_000 + "</tool_call>", "not valid JSON"),
        ('<tool_call>{"name": "search", "arguments": {"query": ' + "9" * 5000 + "}}</tool_call>", "not valid JSON"),
    ],
)
def test_tool_call_parse_malformed(text: str, fragment: str) -> None:
    parsed = TOOL_CALL._parse(text)
    assert parsed.error is not None and fragment in parsed.error, parsed
    assert len(parsed.error) < 300  # errors quote only a short fragment back to the model


def test_tool_call_format_prompt_and_observations() -> None:
    example = TOOL_CALL.example_messages([SearchTool(NoIndex(), 3)])
    assert [m["role"] for m in example] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert [TOOL_CALL.parse(m["content"]) for m in example[1::2]] == [
        ParsedAction(calls=[call("Velmora Labs founder")]),
        ParsedAction(calls=[call("Ilsa Brandt")]),
        ParsedAction(answer="Quorvale"),
    ]
    assert "<tool_call>" in TOOL_CALL.system_prompt([], one_shot=False)
    assert TOOL_CALL.stop_strings == ["</tool_call>", "</answer>"]
    assert TOOL_CALL.observation_role == "tool" and TOOL_CALL.uses_template_tools
    # the Qwen/Hermes template wraps a tool message in <tool_response>...</tool_response> itself
    assert TOOL_CALL.format_observation(["r1"]) == "r1"
    assert TOOL_CALL.format_observation(["r1", "r2"]) == "r1\n</tool_response>\n<tool_response>\nr2"


def test_get_format() -> None:
    assert isinstance(get_format("tags"), TagFormat)
    assert isinstance(get_format("tool_call", [SearchTool(NoIndex(), 1)]), ToolCallFormat)
    with pytest.raises(ValueError, match="unknown action format 'xml'"):
        get_format("xml")


def test_parse_rejects_non_text_without_raising() -> None:
    for fmt in (TAGS, TOOL_CALL):
        assert fmt.parse(None).error == "action must be text, got NoneType"  # type: ignore[arg-type]


# ------------------------------------------------------------------ fuzz
_FRAGMENTS = [
    "<search>", "</search>", "<answer>", "</answer>", "<tool_call>", "</tool_call>", "<think>", "</think>",
    "<information>", "</information>", "<", ">", "</", '{"name": "search", "arguments": {"query": "x"}}',
    '{"name": ', '"arguments": ', "{", "}", "[", "]", '"', "\\", "null", "1e999", "Velmora", " ", "\n",
    "\x00", "\ud7ff", "🙂", "ä",
]
adversarial_text = st.one_of(
    st.text(max_size=300),
    st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.text(max_size=8)), max_size=40).map("".join),
    st.builds(lambda s, n: s * n, st.sampled_from(_FRAGMENTS), st.integers(0, 20_000)),
)


def check_consistent(parsed: ParsedAction) -> None:
    assert isinstance(parsed, ParsedAction)
    if parsed.error is not None:
        assert isinstance(parsed.error, str) and parsed.error
        assert parsed.calls == [] and parsed.answer is None
    assert not (parsed.calls and parsed.answer is not None)
    assert len(parsed.calls) <= MAX_CALLS_PER_TURN
    if parsed.answer is not None:
        assert parsed.answer.strip() == parsed.answer and parsed.answer
    for c in parsed.calls:
        assert isinstance(c.name, str)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(adversarial_text)
def test_parsers_never_raise_on_any_text(text: str) -> None:
    for fmt in (TAGS, TOOL_CALL):
        check_consistent(fmt._parse(text))  # the raw parser, not the exception-catching wrapper


@settings(max_examples=100, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3)))
def test_tool_call_parser_on_arbitrary_json(obj: Any) -> None:
    check_consistent(TOOL_CALL._parse(f"<tool_call>{json.dumps(obj)}</tool_call>"))
