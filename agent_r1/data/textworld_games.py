"""Text games from TextWorld (``data.source: textworld``): one seeded game per record.

Each record is one game generated and compiled by TextWorld (a Z-machine story
file and its game logic): its id names the files (``games/<id>.z8`` and
``.json`` in the prepared folder, written by :meth:`TextWorldGames.write_files`),
its ``question`` is the game's opening as the agent sees it (the quest and the
first room), its ``sub_queries`` the walkthrough (the warm start's expert plays
it), its ``answers`` the word the report files it under. In-domain games
(train, validation, test) share one world size and quest length and are
disjoint by seed and by opening; the out-of-domain games (source
``textworld-ood``, test only) have larger worlds and longer quests.

The files are the same bytes on every machine and day: generation is seeded,
and the one thing TextWorld's compiler writes that depends on the clock, the
story file's serial number (the compile date, header bytes 0x12-0x17), is
fixed. TextWorld is imported only here and in the env (it is a large package).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, model_validator

from agent_r1.config import PluginOptions
from agent_r1.data.sources import DataSource

if TYPE_CHECKING:
    import pandas as pd

    from agent_r1.config import DataConfig

GAMES_DIR = "games"  # the prepared folder's subfolder of game files
SOURCE, OOD_SOURCE = "textworld", "textworld-ood"
SERIAL = slice(0x12, 0x18)  # the story file header's serial number: YYMMDD of the compile
FIXED_SERIAL = b"000000"
# the commands the env leaves out of the list it shows (they stay valid to type)
UNLISTED = ("look", "inventory", "examine")
_PROMPT_LINE = re.compile(r"\n>[^\n]*$", re.S)  # the game's prompt and status line after the feedback


def clean_feedback(text: str) -> str:
    """A game's reply without its trailing prompt and status line, blank runs collapsed."""
    text = _PROMPT_LINE.sub("", text)
    return re.sub(r"\n\s*\n+", "\n", text).strip()


def listed_commands(admissible: list[str]) -> list[str]:
    """The commands shown to the agent (and drawn from by the random baseline): the admissible
    ones but looking, the inventory and examining, sorted."""
    return sorted(c for c in admissible if not c.startswith(UNLISTED))


def opening(objective: str, description: str) -> str:
    """The game's first observation: the quest, then the first room (the banner dropped)."""
    return f"{objective.strip()}\n\n{clean_feedback(description)}"


class WorldSize(PluginOptions):
    rooms: int = Field(3, ge=1, le=20)
    objects: int = Field(4, ge=0, le=40)
    quest_length: int = Field(2, ge=1, le=10)


class TextWorldOptions(PluginOptions):
    n_train: int = Field(160, ge=1, description="training games (data.val_questions of them become validation)")
    n_test: int = Field(60, ge=1, description="in-domain test games")
    n_ood: int = Field(40, ge=0, description="out-of-domain test games (source textworld-ood)")
    world: WorldSize = Field(default_factory=WorldSize)
    ood_world: WorldSize = Field(default_factory=lambda: WorldSize(rooms=5, objects=8, quest_length=4))
    workers: int = Field(2, ge=1, description="processes generating games (each ~2 s of CPU)")

    @model_validator(mode="after")
    def _ood_is_harder(self) -> TextWorldOptions:
        if self.n_ood and self.ood_world.quest_length <= self.world.quest_length:
            raise ValueError("ood_world.quest_length must exceed world.quest_length: out-of-domain means longer quests")
        return self


def build_game(seed: int, size: dict[str, int], folder: str, game_id: str) -> dict[str, Any]:
    """Generate and compile one game into ``folder``/<id>.z8|.json; its opening and walkthrough."""
    import textworld
    import textworld.generator

    options = textworld.GameOptions()
    options.seeds = seed
    options.nb_rooms, options.nb_objects, options.quest_length = size["rooms"], size["objects"], size["quest_length"]
    options.path, options.file_ext, options.force_recompile = str(Path(folder) / f"{game_id}.z8"), ".z8", True
    game = textworld.generator.make_game(options)
    story = Path(textworld.generator.compile_game(game, options))
    data = bytearray(story.read_bytes())
    data[SERIAL] = FIXED_SERIAL
    story.write_bytes(bytes(data))
    story.with_suffix(".ni").unlink(missing_ok=True)  # the Inform 7 source: not needed to play
    infos = textworld.EnvInfos(objective=True, description=True)
    env = textworld.start(str(story), request_infos=infos)
    try:
        state = env.reset()
        first = opening(state["objective"], state["description"])
    finally:
        env.close()
    return {"id": game_id, "opening": first, "walkthrough": list(game.walkthrough)}


class TextWorldGames(DataSource):
    """Seeded TextWorld games: train/test in one world size, out-of-domain ones larger."""

    Options = TextWorldOptions

    def generate(self, data: DataConfig) -> tuple[pd.DataFrame, pd.DataFrame]:
        from agent_r1.data.schema import corpus_frame, questions_frame

        o = self.options
        self._workdir = tempfile.TemporaryDirectory(prefix="textworld-games-")
        plan = [(SOURCE, "train", o.n_train, o.world), (SOURCE, "test", o.n_test, o.world)]
        plan += [(OOD_SOURCE, "test", o.n_ood, o.ood_world)] if o.n_ood else []
        records: list[dict[str, Any]] = []
        for block, (source, split, n, size) in enumerate(plan):
            seen = {r["question"] for r in records}
            records += self._games(data.seed, block, source, split, n, size, seen)
        notes = [{"doc_id": "textworld-0", "title": "Playing", "text": "Type one command at a time, e.g. go east."}]
        return questions_frame(records, "textworld"), corpus_frame(notes, "textworld")

    def _games(self, seed: int, block: int, source: str, split: str, n: int, size: WorldSize,
               seen: set[str]) -> list[dict[str, Any]]:
        """``n`` games of one kind, each opening new (a seed whose game opens like an earlier
        one is skipped, so no test game is a training game); game seeds never overlap blocks."""
        out: list[dict[str, Any]] = []
        tried = 0
        with ProcessPoolExecutor(self.options.workers) as pool:
            while len(out) < n:
                batch = range(tried, tried + (n - len(out)))
                seeds = [(seed * 1000 + block) * 100_000 + i for i in batch]
                ids = [f"{source}-{split}-{seed}-{i:05d}" for i in batch]
                games = pool.map(build_game, seeds, [size.model_dump()] * len(ids), [self._workdir.name] * len(ids), ids)
                for game in games:
                    if game["opening"] in seen:
                        continue
                    seen.add(game["opening"])
                    out.append(_record(game, source, split, size))
                tried += len(batch)
                if tried > 3 * n + 10:
                    raise ValueError(f"data.options: {source} worlds this small open the same way too often; "
                                     f"found {len(out)} distinct games of {n} in {tried} seeds")
        return out

    def write_files(self, records: pd.DataFrame, folder: Path) -> None:
        """The game files of ``records`` into ``folder``/games (the prepared folder)."""
        games = folder / GAMES_DIR
        games.mkdir(parents=True, exist_ok=True)
        for game_id in records["id"]:
            for suffix in (".z8", ".json"):
                shutil.copyfile(Path(self._workdir.name) / f"{game_id}{suffix}", games / f"{game_id}{suffix}")
        self._workdir.cleanup()


def _record(game: dict[str, Any], source: str, split: str, size: WorldSize) -> dict[str, Any]:
    return {
        "id": game["id"], "question": game["opening"], "answers": ["won"], "supporting_titles": [],
        "type": f"quest{size.quest_length}", "source": source, "split": split, "sub_queries": game["walkthrough"],
    }
