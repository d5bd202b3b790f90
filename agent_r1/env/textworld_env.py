"""TextWorld games as a stateful environment (``env.name: textworld``, with ``data.source: textworld``).

One game process per episode: ``reset`` starts the record's game (the prepared
folder's ``games/<id>.z8``, :mod:`agent_r1.data.textworld_games`) and shows
its opening; each turn the agent types one command with the ``act`` tool and
sees the game's reply. The turn's reward is the score it gained as a share of
the game's maximum, so a won game returns 1; ``success`` (the report's EM) is
winning, ``score`` (its F1) the share of the maximum reached. With
``list_commands`` every observation ends with the commands the game accepts
there (ALFWorld's admissible actions), which is also what the random baseline
draws from; the warm start's expert types the walkthrough.
"""

from __future__ import annotations

import random
import warnings
from pathlib import Path
from typing import Any

from pydantic import Field

from agent_r1.config import PluginOptions
from agent_r1.data.textworld_games import GAMES_DIR, clean_feedback, listed_commands, opening
from agent_r1.env.agent_env import AgentEnv, Transition
from agent_r1.env.formats import ActionFormat, ParsedAction, ToolCall
from agent_r1.env.tools import Tool


class Act(Tool):  # a spec only: the env answers the call
    name = "act"
    description = "Type one command into the game, e.g. go east, take key, open box."
    parameters = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}

    def execute(self, args: dict[str, Any]) -> Any:
        raise NotImplementedError("TextWorldEnv answers its own calls")


class TextWorldEnvOptions(PluginOptions):
    games: str = Field(
        f"data/prepared/{GAMES_DIR}", description="the prepared games' folder, from where the stages run"
    )
    list_commands: bool = Field(True, description="each observation lists the commands the game accepts now")


class TextWorldEnv(AgentEnv):
    """One TextWorld game; see the module docstring."""

    tools = (Act(),)
    Options = TextWorldEnvOptions
    instructions = "You are playing a text game. Do what the game asks, one command per turn:"

    def reset(self, record: dict) -> str:
        import textworld

        story = Path(self.options.games) / f"{record['id']}.z8"
        if not story.is_file():
            raise FileNotFoundError(
                f"env.options.games: no game {story} for record {record['id']!r} (the prepare stage of "
                "data.source textworld writes them)"
            )
        infos = textworld.EnvInfos(objective=True, description=True, admissible_commands=True, score=True,
                                   max_score=True, won=True, lost=True)
        with warnings.catch_warnings():  # jericho's score tracking does not know TextWorld games: the .json tracks them
            warnings.filterwarnings("ignore", message=".*is not fully supported")
            self.game = textworld.start(str(story), request_infos=infos)
            state = self.game.reset()
        self.score, self.max_score, self.moves = 0, max(1, int(state["max_score"])), 0
        self.commands = listed_commands(state["admissible_commands"])
        return self._shown(opening(state["objective"], state["description"]))

    def step(self, action: ParsedAction) -> Transition:
        calls = [c for c in action.calls if c.name == Act.name]
        command = str(calls[0].arguments.get("command", "")).strip() if calls else ""
        if not command:
            why = action.error or "type one command with the act tool"
            return Transition(self._shown(f"Error: {why}"), info={"invalid": True, **self._info(False)})
        state, _, done = self.game.step(command)
        self.moves += 1
        gained, self.score = int(state["score"]) - self.score, int(state["score"])
        self.commands = listed_commands(state["admissible_commands"])
        return Transition(self._shown(clean_feedback(state.feedback)), reward=gained / self.max_score,
                          done=bool(done), info=self._info(bool(state["won"])))

    def _shown(self, text: str) -> str:
        return f"{text}\nCommands: {', '.join(self.commands)}" if self.options.list_commands else text

    def _info(self, won: bool) -> dict[str, Any]:
        return {"success": won, "score": self.score / self.max_score, "moves": self.moves}

    def close(self) -> None:
        if getattr(self, "game", None) is not None:
            self.game.close()
            self.game = None

    def random_call(self, rng: random.Random) -> ToolCall | None:
        return ToolCall(Act.name, {"command": rng.choice(self.commands)}) if self.commands else None

    @classmethod
    def expert_plan(cls, record: dict, fmt: ActionFormat) -> list[str]:
        return [fmt.render_call(ToolCall(Act.name, {"command": str(c)})) for c in record["sub_queries"]]
