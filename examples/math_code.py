"""Counting and number-theory problems an agent solves by writing Python: a task for the ``python`` tool.

Each problem needs a loop, not a formula a small model knows or a calculator can
take (how many primes lie between 312 and 2,809?): the agent writes code, runs it
in its episode's sandboxed interpreter (the built-in ``python`` tool) and answers
with the number. The answer is scored by the arithmetic example's numeric reward::

    data:   {source: "examples.math_code:CodeMathProblems", options: {n_train: 400, n_test: 100}}
    env:    {tools: [python], reward: {scheme: "examples.arithmetic:numeric_reward"}}
    sft:    {enabled: false}       # the scripted expert demos are search episodes

The reference answers come from the plain functions below, one per kind of problem.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from examples.arithmetic import ArithmeticProblems, draw

SOURCE = "math_code"


# ---------------------------------------------------------- reference answers
def sum_of_multiples(below: int, a: int, b: int) -> int:
    return sum(k for k in range(1, below) if k % a == 0 or k % b == 0)


def count_primes(lo: int, hi: int) -> int:
    def is_prime(k: int) -> bool:
        return k >= 2 and all(k % d for d in range(2, int(k**0.5) + 1))

    return sum(is_prime(k) for k in range(lo, hi + 1))


def fibonacci_mod(k: int, m: int) -> int:
    a, b = 1, 1  # F1, F2
    for _ in range(k - 1):
        a, b = b, a + b
    return a % m


def digit_sum_of_power(base: int, exponent: int) -> int:
    return sum(int(d) for d in str(base**exponent))


def collatz_steps(n: int) -> int:
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


# ------------------------------------------------------------------ problems
def _multiples(rng: random.Random) -> tuple[str, int]:
    below, a, b = rng.randint(200, 5000), *rng.sample(range(3, 12), 2)
    return f"What is the sum of all positive integers below {below} that are multiples of {a} or {b}?", \
        sum_of_multiples(below, a, b)


def _primes(rng: random.Random) -> tuple[str, int]:
    lo = rng.randint(2, 500)
    hi = lo + rng.randint(200, 3000)
    return f"How many prime numbers are there between {lo} and {hi}, inclusive?", count_primes(lo, hi)


def _fibonacci(rng: random.Random) -> tuple[str, int]:
    k, m = rng.randint(30, 300), rng.randint(97, 9973)
    return (f"The Fibonacci numbers start F1 = 1, F2 = 1, and each next one is the sum of the two before. "
            f"What is F{k} modulo {m}?"), fibonacci_mod(k, m)


def _digits(rng: random.Random) -> tuple[str, int]:
    base, exponent = rng.randint(2, 9), rng.randint(40, 200)
    return f"What is the sum of the decimal digits of {base} to the power {exponent}?", digit_sum_of_power(base, exponent)


def _collatz(rng: random.Random) -> tuple[str, int]:
    n = rng.randint(27, 9999)
    return (f"Starting from {n}, repeatedly halve the number if it is even, or replace it by 3 times it plus 1 if it "
            "is odd. How many steps does it take to reach 1?"), collatz_steps(n)


TEMPLATES: dict[str, Callable[[random.Random], tuple[str, int]]] = {
    "multiples": _multiples, "primes": _primes, "fibonacci": _fibonacci, "digits": _digits, "collatz": _collatz,
}
# The corpus the index stage builds (every pipeline has one); this task does not search it.
NOTES = {
    "Primes": "A prime number is an integer greater than 1 whose only divisors are 1 and itself.",
    "Modulo": "a modulo m is the remainder of a divided by m.",
}


def problems(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` distinct problems, seeded, the kinds in turn; each record in the prepared schema but for ``split``."""
    return [{
        "id": f"{SOURCE}-{i:05d}", "question": question, "answers": [str(answer)],
        "supporting_titles": [], "type": kind, "source": SOURCE, "sub_queries": [],
    } for i, (kind, question, answer) in enumerate(draw(TEMPLATES, n, seed))]  # fmt: skip


class CodeMathProblems(ArithmeticProblems):
    """Generated problems that need code: ``data.options.n_train`` / ``n_test``, seeded by ``data.seed``."""

    source, notes = SOURCE, NOTES
    problems = staticmethod(problems)
