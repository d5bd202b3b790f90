"""How the policy writes actions and sees observations: the tags and the JSON tool-call formats.

A format turns the text of one assistant turn into a :class:`ParsedAction`
and renders observations; it never executes anything. Two formats:

* ``tags`` (default, for small models): ``<search>query</search>`` or
  ``<answer>text</answer>``, free text (e.g. ``<think>...</think>``) allowed
  before; observations ``<information>...</information>`` in a ``user``
  message. Every tool whose arguments are one string becomes a tag named after
  it. The system prompt explains the tags.
* ``tool_call`` (Hermes/Qwen, for larger models):
  ``<tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call>``,
  answer as ``<answer>...</answer>``; tools are offered through the chat
  template's ``tools=``; observations go in ``tool`` messages.

One-shot example (``env.one_shot``): :meth:`ActionFormat.example_messages`
gives one worked conversation (for the search tool, a 2-hop question about
fictional entities: two searches, their observations, the answer) as real chat
turns placed between the system prompt and the question. The example is the
tool's (:attr:`Tool.example <agent_r1.env.tools.Tool.example>`): the first tool
of the set that has one; with none, there is no example and the system prompt
does not mention one. Chat turns rather than text inside the system prompt,
because a small model imitates turns far more than a described example (the
README's "Measurements behind the defaults" has the counts).

Parsing policy (the same for both; a violation sets ``error`` and no action
runs, the env shows the error and counts one invalid call):

* only the format's own tags count (the tool tags / ``tool_call``, and
  ``answer``); any other text, including unknown tags, is free reasoning;
* every opened tag must be closed by the same tag before another known tag
  opens: unclosed, stray-closing, mismatched and nested tags are errors;
* a turn either answers or calls tools, never both (there is no safe reading
  of "search X, and the answer is Y"); at most one answer, and it must not be
  empty;
* up to :data:`MAX_CALLS_PER_TURN` calls in one turn run together; more is an
  error (in practice the stop strings end a turn at its first call);
* text after the last closing tag is ignored (the engine normally cuts it).

Argument checks against the tool's schema (unknown tool, missing, extra or
wrongly typed arguments, empty query) are the env's job, per call, so one
bad call does not void a good one in the same turn.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent_r1.registry import FORMATS

if TYPE_CHECKING:
    from agent_r1.env.tools import Tool

MAX_CALLS_PER_TURN = 3

ANSWER_TAG = "answer"
_QUOTE_CHARS = 60  # how much of a bad fragment an error message quotes back to the model


@dataclass
class ToolCall:
    name: str
    arguments: Any  # a dict when well formed; the env's validation reports anything else


@dataclass
class ParsedAction:
    """What one assistant turn asks for. Neither calls, nor answer, nor error = "no action"."""

    calls: list[ToolCall] = field(default_factory=list)
    answer: str | None = None
    error: str | None = None

    @property
    def is_no_action(self) -> bool:
        return not self.calls and self.answer is None and self.error is None


def _quote(text: str) -> str:
    """``text`` quoted and escaped, at most ~_QUOTE_CHARS long: cut after escaping, as control characters grow 4x."""
    quoted = repr(" ".join(text.split()))
    return quoted if len(quoted) <= _QUOTE_CHARS + 2 else quoted[: _QUOTE_CHARS + 1] + "..." + quoted[0]


def tag_blocks(text: str, tags: list[str]) -> tuple[list[tuple[str, str]], str | None]:
    """The ``(tag, body)`` blocks of ``text`` for the known ``tags``, or an error naming the first problem.

    Flat, not recursive: a known tag opened inside another is an error, so a
    body never contains a known tag and the parse is unambiguous.
    """
    pattern = re.compile(r"<(/?)(" + "|".join(re.escape(t) for t in tags) + r")>")
    blocks: list[tuple[str, str]] = []
    open_tag: str | None = None
    start = 0
    for m in pattern.finditer(text):
        closing, tag = m.group(1) == "/", m.group(2)
        if not closing:
            if open_tag is not None:
                return blocks, f"<{tag}> opened inside <{open_tag}>; close <{open_tag}> first"
            open_tag, start = tag, m.end()
        elif open_tag is None:
            return blocks, f"</{tag}> without a matching <{tag}>"
        elif tag != open_tag:
            return blocks, f"</{tag}> closes <{open_tag}>; write <{open_tag}>...</{open_tag}>"
        else:
            blocks.append((tag, text[start : m.start()]))
            open_tag = None
    if open_tag is not None:
        return blocks, f"unclosed <{open_tag}> tag; write <{open_tag}>...</{open_tag}>"
    return blocks, None


def action_from_blocks(answers: list[str], calls: list[ToolCall]) -> ParsedAction:
    """Apply the one-action-per-turn rules shared by both formats."""
    if answers and calls:
        return ParsedAction(error="a turn must either call a tool or answer, not both")
    if len(answers) > 1:
        return ParsedAction(error=f"{len(answers)} answers in one turn; give exactly one <answer>")
    if answers:
        answer = answers[0].strip()
        if not answer:
            return ParsedAction(error="empty <answer>")
        return ParsedAction(answer=answer)
    if len(calls) > MAX_CALLS_PER_TURN:
        return ParsedAction(error=f"{len(calls)} tool calls in one turn; at most {MAX_CALLS_PER_TURN}")
    return ParsedAction(calls=calls)


class ActionFormat(ABC):
    """Parses a turn and renders observations; see the module docstring for the rules.

    ``env.format`` names a registered format or a user's own subclass
    (``package.module:Name``); it is built as ``cls(tools)`` with the env's tools
    (or ``None``: then the built-in search tool's shape).
    """

    name: str
    stop_strings: list[str]
    observation_role: str
    uses_template_tools: bool

    def __init__(self, tools: list[Tool] | None = None):
        del tools  # a format whose parsing depends on the tools (tags) overrides this

    def parse(self, text: str) -> ParsedAction:
        """Parse one turn's text. Never raises: anything unexpected becomes ``error``."""
        if not isinstance(text, str):
            return ParsedAction(error=f"action must be text, got {type(text).__name__}")
        try:
            return self._parse(text)
        except Exception as exc:  # a parser bug must not kill a rollout; tests call _parse directly
            return ParsedAction(error=f"could not parse the turn ({type(exc).__name__})")

    @abstractmethod
    def _parse(self, text: str) -> ParsedAction: ...

    @abstractmethod
    def system_prompt(self, tools: list[Tool], one_shot: bool, task: str | None = None) -> str:
        """The system message: the tools and how to call them and answer.

        ``one_shot`` only adjusts the wording; the example itself is
        :meth:`example_messages` (see the module docstring for why). ``task`` is a
        stateful env's own instructions (:attr:`AgentEnv.instructions
        <agent_r1.env.agent_env.AgentEnv.instructions>`), in place of answering a question.
        """

    @abstractmethod
    def render_call(self, call: ToolCall) -> str:
        """How the policy writes ``call`` in this format (used for the one-shot example)."""

    def render_answer(self, answer: str) -> str:
        """How the policy writes its final answer in this format."""
        return f"<{ANSWER_TAG}>{answer}</{ANSWER_TAG}>"

    def example_messages(self, tools: list[Tool]) -> list[dict[str, str]]:
        """The one-shot example of the first tool that has one, as chat messages (empty when none has)."""
        tool = next((t for t in tools if t.example is not None), None)
        if tool is None or tool.example is None:
            return []
        messages = [{"role": "user", "content": self.user_prompt(tool.example.question)}]
        for args, observation in tool.example.calls:
            messages.append({"role": "assistant", "content": self.render_call(ToolCall(tool.name, dict(args)))})
            messages.append({"role": self.observation_role, "content": self.format_observation([observation])})
        messages.append({"role": "assistant", "content": self.render_answer(tool.example.answer)})
        return messages

    @abstractmethod
    def format_observation(self, results: list[str]) -> str:
        """One observation message's content from the rendered result of each call, in order."""

    def format_error(self, message: str) -> str:
        """The observation for a malformed turn."""
        return self.format_observation([f"Error: {message}"])

    def user_prompt(self, question: str) -> str:
        return f"Question: {question.strip()}"


# ------------------------------------------------------------------ tags
def tag_argument(tool: Tool) -> str:
    """The one string argument a tool takes in the tags format; ValueError if it has another shape."""
    props = tool.parameters.get("properties", {})
    if len(props) != 1 or next(iter(props.values())).get("type") != "string":
        raise ValueError(
            f"tool {tool.name!r} takes arguments {sorted(props)}; the tags format supports only tools "
            "with exactly one string argument (use env.format: tool_call)"
        )
    return next(iter(props))


class TagFormat(ActionFormat):
    """``<tool>argument</tool>`` / ``<answer>text</answer>``; observations in ``<information>``."""

    name = "tags"
    observation_role = "user"
    uses_template_tools = False

    def __init__(self, tools: list[Tool] | None = None):
        # tool name -> its single argument; without tools, the search tool's shape
        self.tag_args: dict[str, str] = {"search": "query"} if tools is None else {}
        for tool in tools or []:
            if tool.name == ANSWER_TAG:
                raise ValueError(f"a tool may not be named {ANSWER_TAG!r}: the tag is reserved for answers")
            self.tag_args[tool.name] = tag_argument(tool)
        self.stop_strings = [f"</{name}>" for name in self.tag_args] + [f"</{ANSWER_TAG}>"]
        self._tags = [*self.tag_args, ANSWER_TAG]

    def _parse(self, text: str) -> ParsedAction:
        blocks, error = tag_blocks(text, self._tags)
        if error is not None:
            return ParsedAction(error=error)
        answers = [body for tag, body in blocks if tag == ANSWER_TAG]
        calls = [ToolCall(tag, {self.tag_args[tag]: body.strip()}) for tag, body in blocks if tag != ANSWER_TAG]
        return action_from_blocks(answers, calls)

    def system_prompt(self, tools: list[Tool], one_shot: bool, task: str | None = None) -> str:
        lines = [task or "Answer the question. Use these tools to look up facts you do not know:"]
        lines += [f"<{t.name}>{tag_argument(t)}</{t.name}>: {t.description}" for t in tools]
        if task is not None:
            lines.append("Each result appears in <information>...</information>. One call per turn.")
        else:
            lines.append(
                "Each result appears in <information>...</information>. Look up one fact at a time. "
                "Finish with <answer>short answer</answer>."
            )
        if one_shot:
            lines.append("Follow the example.")
        return "\n".join(lines)

    def render_call(self, call: ToolCall) -> str:
        return f"<{call.name}>{call.arguments[self.tag_args[call.name]]}</{call.name}>"

    def format_observation(self, results: list[str]) -> str:
        return "\n".join(f"<information>{r}</information>" for r in results)


# ------------------------------------------------------------- tool_call
_TOOL_CALL_TAG = "tool_call"

def parse_tool_call(body: str) -> tuple[ToolCall | None, str | None]:
    """One ``<tool_call>`` body -> a call, or an error naming what is wrong with its JSON."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        return None, f"tool call is not valid JSON ({exc.msg} at character {exc.pos}): {_quote(body)}"
    except (ValueError, RecursionError) as exc:  # e.g. a 10k-digit int, or nesting deeper than the stack
        return None, f"tool call is not valid JSON ({type(exc).__name__}): {_quote(body)}"
    if not isinstance(obj, dict):
        return None, f'tool call must be a JSON object {{"name": ..., "arguments": {{...}}}}, got {type(obj).__name__}'
    extra = str(sorted(k for k in obj if k not in ("name", "arguments")))
    if extra != "[]":  # the keys are the policy's text: quoted short, like every fragment
        shown = extra if len(extra) <= _QUOTE_CHARS else extra[:_QUOTE_CHARS] + "...]"
        return None, f"tool call has unexpected key(s) {shown}; only 'name' and 'arguments'"
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None, "tool call needs a 'name' string"
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models emit the arguments object as a JSON string
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            return None, f"'arguments' of {_quote(name)} is a string that is not a JSON object: {_quote(args)}"
    return ToolCall(name.strip(), args), None


class ToolCallFormat(ActionFormat):
    """Hermes/Qwen ``<tool_call>{json}</tool_call>``; ``<answer>text</answer>``; ``tool`` observations."""

    name = "tool_call"
    observation_role = "tool"
    uses_template_tools = True
    stop_strings = [f"</{_TOOL_CALL_TAG}>", f"</{ANSWER_TAG}>"]

    def _parse(self, text: str) -> ParsedAction:
        blocks, error = tag_blocks(text, [_TOOL_CALL_TAG, ANSWER_TAG])
        if error is not None:
            return ParsedAction(error=error)
        answers = [body for tag, body in blocks if tag == ANSWER_TAG]
        calls: list[ToolCall] = []
        for i, (tag, body) in enumerate(b for b in blocks if b[0] == _TOOL_CALL_TAG):
            call, problem = parse_tool_call(body)
            if call is None:
                return ParsedAction(error=problem if i == 0 else f"tool call {i + 1}: {problem}")
            calls.append(call)
        return action_from_blocks(answers, calls)

    def system_prompt(self, tools: list[Tool], one_shot: bool, task: str | None = None) -> str:
        del tools  # listed by the chat template's tools= (see ToolEnv.tool_specs)
        if task is not None:
            return f'{task} Call a tool with <tool_call>{{"name": ..., "arguments": {{...}}}}</tool_call>, one per turn.'
        text = (
            "Answer the question. Use the tools to look up facts you do not know: call one with "
            '<tool_call>{"name": ..., "arguments": {...}}</tool_call>. Look up one fact at a time. '
            "Finish with <answer>short answer</answer>."
        )
        return f"{text} Follow the example." if one_shot else text

    def render_call(self, call: ToolCall) -> str:
        return f"<{_TOOL_CALL_TAG}>{json.dumps({'name': call.name, 'arguments': call.arguments})}</{_TOOL_CALL_TAG}>"

    def format_observation(self, results: list[str]) -> str:
        """Results of one turn's calls as the content of one ``tool`` message.

        The Qwen/Hermes templates wrap a ``tool`` message's content in
        ``<tool_response>\\n...\\n</tool_response>`` themselves, so the content
        carries no tags of its own (they would be doubled); several results are
        separated exactly as the template renders consecutive tool messages.
        """
        return "\n</tool_response>\n<tool_response>\n".join(results)


def get_format(name: str, tools: list[Tool] | None = None) -> ActionFormat:
    """The format ``name`` (``env.format``: a name in ``agent_r1.registry.FORMATS`` or a plugin), set up for ``tools``."""
    if (problem := FORMATS.problem(name)) is not None:
        raise ValueError(problem)
    return FORMATS.load(name)(tools)
