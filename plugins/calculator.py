"""A calculator tool with settings of its own, configured from ``params.yaml`` alone::

    env:
      tools: [search, plugins.calculator:Calculator]
      tool_options:
        calculator: {digits: 2, call_reward: 0.01}

``digits`` rounds what the agent reads; ``call_reward`` is the tool's own process
reward per calculation that ran (the env adds it to the turn's, under the same
``env.reward.process`` cap and ``only_if_answered`` as every process reward).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import Field

from agent_r1.config import PluginOptions
from agent_r1.env.tools import Tool, ToolExample

if TYPE_CHECKING:
    from agent_r1.config import ProcessRewardConfig
    from agent_r1.env import Episode

OPERATORS: dict[str, Callable[[float, float], float]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
}


class CalculatorOptions(PluginOptions):
    """``env.tool_options.calculator``."""

    digits: int = Field(4, ge=0, le=12, description="decimals a result is rounded to")
    call_reward: float = Field(
        0.0, ge=-1.0, le=1.0, description="process reward per calculation that ran (0: the tool claims none)"
    )


def parse(expression: str) -> tuple[float, str, float]:
    """``"a op b"`` (two finite numbers and one of ``+ - * /``, space-separated) -> ``(a, op, b)``;
    ValueError naming what is wrong otherwise."""
    parts = expression.split()
    if len(parts) != 3 or parts[1] not in OPERATORS:
        raise ValueError(f"expected 'a op b' with op one of {' '.join(OPERATORS)}, got {expression!r}")
    try:
        a, b = float(parts[0]), float(parts[2])
    except ValueError:
        raise ValueError(f"expected two numbers, got {parts[0]!r} and {parts[2]!r}") from None
    if not (math.isfinite(a) and math.isfinite(b)):
        raise ValueError("numbers must be finite")
    if parts[1] == "/" and b == 0:
        raise ValueError("division by zero")
    return a, parts[1], b


def calculate(expression: str, digits: int) -> str:
    """The value of ``"a op b"`` rounded to ``digits`` decimals, trailing zeros dropped (``"0.67"``, ``"84"``)."""
    a, op, b = parse(expression)
    text = f"{OPERATORS[op](a, b):.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


class Calculator(Tool):
    """``{"expression": "a op b"}`` -> the value as text, to ``digits`` decimals (:class:`CalculatorOptions`)."""

    name = "calculator"
    description = "Compute 'a op b' for two numbers a, b and op one of + - * /. Returns the value."
    parameters = {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. 12 * 7"}},
        "required": ["expression"],
    }
    example = ToolExample("What is 12 times 7?", (({"expression": "12 * 7"}, "84"),), "84")
    Options = CalculatorOptions

    def __init__(self, options: CalculatorOptions | None = None) -> None:
        self.options = options if options is not None else CalculatorOptions()

    def validate(self, args: Any) -> str | None:
        problem = super().validate(args)
        if problem is not None:
            return problem
        try:
            parse(args["expression"])
        except ValueError as exc:
            return str(exc)
        return None

    def execute(self, args: dict[str, Any]) -> str:
        return calculate(args["expression"], self.options.digits)

    def process_reward(self, results: list[Any], episode: Episode, cfg: ProcessRewardConfig) -> float:
        """``call_reward`` per calculation of the turn that ran."""
        del episode, cfg
        return len(results) * self.options.call_reward
