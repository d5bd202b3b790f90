"""Arithmetic word problems solved with a calculator tool: a second task, outside the library.

Nothing here is registered in ``agent_r1``: ``params.yaml`` names the three
objects as plugins, and the pipeline (``dvc repro``) prepares the problems,
builds the env with the calculator and scores answers with the numeric reward::

    data:   {source: "examples.arithmetic:ArithmeticProblems", options: {n_train: 400, n_test: 100}}
    env:    {tools: ["examples.arithmetic:Calculator"], reward: {scheme: "examples.arithmetic:numeric_reward"}}

Each problem takes two operations on two- and three-digit numbers: hard to do in
the head for a small model, one ``calculate`` call for an agent that uses its tool.

The calculator also shows a tool's own settings (:class:`CalculatorOptions`), written
under the name the agent calls it by::

    env:
      tool_options:
        calculate: {digits: 2, call_reward: 0.01}

``digits`` rounds what the agent reads; ``call_reward`` is the tool's own process
reward per calculation that ran (the env adds it to the turn's, under the same
``env.reward.process`` cap and ``only_if_answered`` as every process reward).
"""

from __future__ import annotations

import ast
import math
import operator
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import Field

from agent_r1.config import DataConfig, PluginOptions, RewardConfig
from agent_r1.data.schema import corpus_frame, questions_frame
from agent_r1.data.sources import DataSource
from agent_r1.env.tools import Tool, ToolExample

if TYPE_CHECKING:
    from agent_r1.config import ProcessRewardConfig
    from agent_r1.env import Episode

SOURCE = "arithmetic"
_OPERATORS: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
MAX_EXPRESSION_CHARS = 200
# Decimals a non-integer value is written with: the problems' gold answers and the tool's default.
DIGITS = 6


# ------------------------------------------------------------------ the tool
def evaluate_expression(expression: str) -> float:
    """The value of ``+ - * /`` over numbers and parentheses; ValueError for anything else.

    Parsed with :mod:`ast` and evaluated node by node: never ``eval`` on text a policy wrote.
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {exc.msg}") from None
    return _value(tree.body)


def _value(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _value(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ValueError("division by zero")
        return _OPERATORS[type(node.op)](left, right)
    raise ValueError(f"only numbers, + - * / and parentheses are allowed, not {ast.unparse(node)!r}")


def format_number(value: float, digits: int = DIGITS) -> str:
    """``730.0`` -> ``"730"``; other values to at most ``digits`` decimals, trailing zeros dropped
    (``2/3`` -> ``"0.666667"``, to 2 digits ``"0.67"``, to 0 digits ``"1"``)."""
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    text = f"{value:.{digits}f}"
    # Only a fraction's zeros are trailing: with 0 digits, 9.6 is "10", not "1".
    return text.rstrip("0").rstrip(".") if "." in text else text


class CalculatorOptions(PluginOptions):
    """``env.tool_options.calculate``: the settings of :class:`Calculator`."""

    digits: int = Field(DIGITS, ge=0, le=12, description="decimals a result is rounded to (trailing zeros dropped)")
    call_reward: float = Field(
        0.0, ge=-1.0, le=1.0, description="process reward per calculation that ran (0: the tool claims none)"
    )


class Calculator(Tool):
    """``{"expression": "37*24-158"}`` -> ``"730"``, to ``digits`` decimals (:class:`CalculatorOptions`)."""

    name = "calculate"
    description = "Evaluate an arithmetic expression (numbers, + - * / and parentheses). Returns its value."
    parameters = {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. (12 + 30) * 4"}},
        "required": ["expression"],
    }
    example = ToolExample(
        question="A farm packs 23 crates with 18 eggs each and breaks 9 eggs. How many eggs are left?",
        calls=(({"expression": "23*18-9"}, "405"),),
        answer="405",
    )
    Options = CalculatorOptions

    def __init__(self, options: CalculatorOptions | None = None) -> None:
        self.options = options if options is not None else CalculatorOptions()

    def validate(self, args: Any) -> str | None:
        problem = super().validate(args)
        if problem is not None:
            return problem
        if len(args["expression"]) > MAX_EXPRESSION_CHARS:
            return f"expression is too long ({len(args['expression'])} > {MAX_EXPRESSION_CHARS} characters)"
        try:
            evaluate_expression(args["expression"])
        except ValueError as exc:
            return str(exc)
        return None

    def execute(self, args: dict[str, Any]) -> str:
        return format_number(evaluate_expression(args["expression"]), self.options.digits)

    def process_reward(self, results: list[Any], episode: Episode, cfg: ProcessRewardConfig) -> float:
        """``call_reward`` per calculation of the turn that ran."""
        del episode, cfg
        return len(results) * self.options.call_reward


# ---------------------------------------------------------------- the reward
def parse_number(text: str | None) -> float | None:
    """The number an answer states (``"730"``, ``"730 pens"``, ``"$1,250"``), or None."""
    if text is None:
        return None
    for token in text.replace(",", "").replace("$", "").split():
        try:
            value = float(token.rstrip("."))
        except ValueError:
            continue
        if math.isfinite(value):
            return value
    return None


def numeric_reward(answer: str | None, golds: list[str], format_valid: bool, cfg: RewardConfig) -> float:
    """``1`` if the answer's number equals a gold (relative tolerance 1e-6), else ``0``;
    ``format_score - 1`` when the episode ended without a well-formed answer (as the ``paper`` scheme)."""
    if not format_valid:
        return cfg.format_score - 1.0
    value = parse_number(answer)
    if value is None:
        return 0.0
    return float(any((gold := parse_number(g)) is not None and math.isclose(value, gold, rel_tol=1e-6) for g in golds))


# ----------------------------------------------------------- the data source
def _pens(rng: random.Random) -> tuple[str, str]:
    boxes, per_box = rng.randint(12, 48), rng.randint(11, 36)
    sold = rng.randint(100, boxes * per_box - 1)
    question = (f"A shop has {boxes} boxes of pens with {per_box} pens in each box. "
                f"It sells {sold} pens. How many pens are left?")
    return question, f"{boxes}*{per_box}-{sold}"


def _change(rng: random.Random) -> tuple[str, str]:
    books, price = rng.randint(3, 9), rng.randint(13, 47)
    note = 100 * ((books * price) // 100 + 1)
    question = f"Mara buys {books} books at {price} dollars each and pays with {note} dollars. How much change does she get?"
    return question, f"{note}-{books}*{price}"


def _trip(rng: random.Random) -> tuple[str, str]:
    speed, hours, extra = rng.randint(42, 97), rng.randint(3, 9), rng.randint(15, 180)
    question = (f"A train travels at {speed} km per hour for {hours} hours, then {extra} km more. "
                "How many km does it travel in total?")
    return question, f"{speed}*{hours}+{extra}"


def _share(rng: random.Random) -> tuple[str, str]:
    people, apples = rng.randint(3, 12), rng.randint(20, 90)
    pears = people * rng.randint(5, 15) + (-apples % people)
    question = f"{people} friends share {apples} apples and {pears} pears equally. How many pieces of fruit does each get?"
    return question, f"({apples}+{pears})/{people}"


TEMPLATES: dict[str, Callable[[random.Random], tuple[str, str]]] = {
    "pens": _pens, "change": _change, "trip": _trip, "share": _share,
}
# The corpus the index stage builds (every pipeline has one); the calculator task does not search it.
NOTES = {
    "Order of operations": "Multiplication and division are done before addition and subtraction.",
    "Sharing equally": "To share a total equally, divide the total by the number of people.",
    "Change": "The change is the amount paid minus the total price.",
}


def draw(templates: dict[str, Callable[[random.Random], tuple[str, Any]]], n: int, seed: int) -> list[tuple[str, str, Any]]:
    """``n`` distinct ``(kind, question, what the template gave)``, seeded, the kinds in turn."""
    rng, seen, drawn = random.Random(seed), set(), []
    kinds = sorted(templates)
    while len(drawn) < n:
        kind = kinds[len(drawn) % len(kinds)]
        question, given = templates[kind](rng)
        if question not in seen:
            seen.add(question)
            drawn.append((kind, question, given))
    return drawn


def problems(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` distinct problems, seeded; each record in the prepared schema but for ``split``."""
    return [{
        "id": f"{SOURCE}-{i:05d}", "question": question, "answers": [format_number(evaluate_expression(expression))],
        "supporting_titles": [], "type": kind, "source": SOURCE, "sub_queries": [expression],
    } for i, (kind, question, expression) in enumerate(draw(TEMPLATES, n, seed))]  # fmt: skip


class ProblemCounts(PluginOptions):
    """``data.options`` of a generated problem source."""

    n_train: int = Field(400, ge=1, description="training problems")
    n_test: int = Field(100, ge=1, description="test problems")


class ArithmeticProblems(DataSource):
    """Generated word problems: ``data.options.n_train`` / ``n_test`` (:class:`ProblemCounts`), seeded by ``data.seed``.
    A subclass with its own ``problems``, ``source`` and ``notes`` is another generated task."""

    Options = ProblemCounts
    source, notes = SOURCE, NOTES
    problems = staticmethod(problems)

    def generate(self, data: DataConfig) -> tuple[Any, Any]:
        n_train, n_test = self.options.n_train, self.options.n_test
        records = self.problems(n_train + n_test, data.seed)
        for i, record in enumerate(records):
            record["split"] = "train" if i < n_train else "test"
        notes = [{"doc_id": f"{self.source}-note-{i}", "title": t, "text": x} for i, (t, x) in enumerate(self.notes.items())]
        return questions_frame(records, self.source), corpus_frame(notes, self.source)
