"""Guess the hidden number: the smallest stateful environment, outside the library.

The env keeps a secret per episode and answers each guess with "higher" or
"lower"; a found number ends the episode with reward 1, fewer guesses being
worth more. From params alone::

    data: {source: "examples.guess_number:GuessingGames", options: {n_train: 200, n_test: 50}}
    env:  {name: "examples.guess_number:GuessNumber", options: {high: 100}, max_turns: 8}
    sft:  {enabled: false}
"""

from __future__ import annotations

import random
from typing import Any

from pydantic import Field

from agent_r1.config import DataConfig, PluginOptions
from agent_r1.data.schema import corpus_frame, questions_frame
from agent_r1.data.sources import DataSource
from agent_r1.env.agent_env import AgentEnv, Transition
from agent_r1.env.formats import ParsedAction
from agent_r1.env.tools import Tool


class Guess(Tool):  # a spec only: the env answers the call
    name, description = "guess", "Guess the hidden number. Returns 'higher', 'lower' or 'correct'."
    parameters = {"type": "object", "properties": {"number": {"type": "string"}}, "required": ["number"]}

    def execute(self, args: dict[str, Any]) -> Any:
        raise NotImplementedError("GuessNumber answers its own calls")


class GuessOptions(PluginOptions):
    high: int = Field(100, ge=2, le=10**6, description="the secret is drawn from 1..high")


class GuessNumber(AgentEnv):
    tools = (Guess(),)
    Options = GuessOptions

    def reset(self, record: dict) -> str:
        self.secret = random.Random(record["id"]).randint(1, self.options.high)  # the same for every sample
        self.guesses = 0
        return f"I am thinking of a whole number from 1 to {self.options.high}. Find it."

    def step(self, action: ParsedAction) -> Transition:
        calls = [c for c in action.calls if c.name == "guess"]
        number = str(calls[0].arguments.get("number", "")).strip() if calls else ""
        if not number.lstrip("-").isdigit():
            return Transition("Call guess with a whole number.", reward=-0.1, info={"invalid": True})
        self.guesses += 1
        if int(number) == self.secret:
            return Transition(reward=1.0 / self.guesses**0.5, done=True, info={"success": True, "guesses": self.guesses})
        return Transition("higher" if int(number) < self.secret else "lower", info={"guesses": self.guesses})


class GameCounts(PluginOptions):
    n_train: int = Field(200, ge=1)
    n_test: int = Field(50, ge=1)


class GuessingGames(DataSource):
    """One record per game: its id seeds the secret. The env judges success, so ``answers`` holds a
    placeholder (a real phrase: an answer that normalises to nothing is refused at prepare)."""

    Options = GameCounts

    def generate(self, data: DataConfig) -> tuple[Any, Any]:
        n = self.options.n_train + self.options.n_test
        records = [{"id": f"guess-{data.seed}-{i:05d}", "question": "Find the hidden number.", "answers": ["the hidden number"],
                    "supporting_titles": [], "type": "guess", "source": "guess", "sub_queries": [],
                    "split": "train" if i < self.options.n_train else "test"} for i in range(n)]
        notes = [{"doc_id": "guess-note-0", "title": "Bisection", "text": "Halve the interval with each guess."}]
        return questions_frame(records, "guess"), corpus_frame(notes, "guess")
