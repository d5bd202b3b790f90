"""Tools: each executes one atomic action and returns its raw result.

A tool knows nothing of observations or chat formats (Agent-R1's split):
:class:`~agent_r1.env.env.ToolEnv` validates the arguments the policy wrote,
calls the tool, renders the raw result into the observation and scores the
step. A tool declares what it accepts (``parameters``, a JSON schema of the
arguments object, which is also what the chat template's ``tools=`` shows a
tool-calling model) and does the work. The one part of the score a tool may
claim is its own process reward: :meth:`Tool.process_reward` prices a turn's
results given the episode (the search tool pays for supporting documents found
for the first time); the env adds it to the turn's reward.

A tool is built from the params by :meth:`Tool.from_params` (by default
``cls()``), so ``env.tools`` in ``params.yaml`` can name a user's own
``package.module:Name`` subclass; :func:`~agent_r1.env.make.make_env` builds the
tool set every flow uses. A tool with state of its own per episode (an
interpreter whose variables persist between calls) sets ``per_episode``: the env
then :meth:`~Tool.open`\ s an instance for each episode and closes it as the
episode ends. Settings of its own a tool declares as ``Options`` (a
model derived from :class:`agent_r1.config.PluginOptions`); they are written
under ``env.tool_options.<its name>``, validated by the params check, and given
to ``from_params`` (the default keeps them as ``self.options``). A tool that
reads the retrieval index sets ``needs_index``; one that brings a worked
one-shot example sets ``example``.

A tool that cannot work for a reason that is not the agent's (its server is
down or answers garbage) raises :class:`~agent_r1.errors.ToolInfrastructureError`: the env
re-raises it and the run stops, instead of scoring an invalid call that would
quietly poison the rewards.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from agent_r1.env.episode import Episode, record_list
from agent_r1.retrieval import load_index
from agent_r1.retrieval.base import Hit, SearchIndex

if TYPE_CHECKING:
    from agent_r1.config import Params, ProcessRewardConfig

# Where a tool finds the retrieval index: a folder or server URL, the index already
# loaded (make_env loads it once for every tool that needs it), or None (none given).
IndexSource = str | Path | SearchIndex | None

# JSON-schema type name -> Python types. bool is excluded from the numeric
# types on purpose: ``True`` is an int in Python but not a number in JSON.
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def json_type_error(value: Any, expected: str | list[str]) -> str | None:
    """``None`` if ``value`` has JSON-schema type ``expected`` (a name or a list of names), else why not."""
    names = [expected] if isinstance(expected, str) else list(expected)
    for name in names:
        types = _JSON_TYPES.get(name)
        if types is None:
            return f"schema has unknown type {name!r}"
        if isinstance(value, types) and not (isinstance(value, bool) and name in ("integer", "number")):
            return None
    return f"must be of type {' or '.join(names)}, got {type(value).__name__}"


@dataclass(frozen=True)
class ToolExample:
    """A worked one-shot example of a tool: a question, each call's arguments with the
    observation text it gives, and the final answer (shown as chat turns, see
    :meth:`~agent_r1.env.formats.ActionFormat.example_messages`)."""

    question: str
    calls: tuple[tuple[dict[str, Any], str], ...]
    answer: str


class Tool(ABC):
    """One atomic action the agent can take.

    Subclasses set ``name``, ``description`` and ``parameters`` (a JSON schema
    with ``"type": "object"``, ``properties`` and ``required``) and implement
    :meth:`execute`, which may return any value: a string is shown as is, a list
    of :class:`Hit` as numbered documents, anything else as JSON. Override
    :meth:`validate` to add checks beyond the schema, :meth:`batch_execute` when
    many calls are cheaper together (one batched index lookup instead of 32),
    :meth:`from_params` when the tool needs settings or the index, and
    :meth:`process_reward` when its results earn a process reward. Its own
    settings it declares as ``Options`` and reads as ``self.options``.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    # True when from_params needs the retrieval index: a tool set without such a tool needs none.
    needs_index: ClassVar[bool] = False
    # The one-shot example (env.one_shot) this tool can show; None: the tool has none.
    example: ClassVar[ToolExample | None] = None
    # Seconds within which the tool's backend gives up by itself (a client that retries with backoff),
    # or None. The env then waits that long beyond env.tool_timeout_s, so a dead backend reports its own
    # named error, and treats an overrun as an infrastructure failure rather than the agent's.
    backend_deadline_s: float | None = None
    # True when each episode needs an instance of its own (state that carries from one call to the
    # next, a process to keep): the env calls open() as the episode starts and close() as it ends.
    per_episode: ClassVar[bool] = False
    # The model of its own settings (env.tool_options.<name>); None: it takes none.
    Options: ClassVar[Any] = None
    # Its settings: env.tool_options.<name> validated by Options (None for a tool without Options).
    options: Any = None

    def validate(self, args: Any) -> str | None:
        """Why ``args`` is not a valid call of this tool, or ``None`` if it is.

        Checks the subset of JSON schema tool specs use: an object, every
        required key present, each property of its declared type, no keys the
        schema does not declare (a hallucinated argument is a malformed call).
        """
        if not isinstance(args, dict):
            return f"arguments of {self.name!r} must be a JSON object, got {type(args).__name__}"
        props: dict[str, Any] = self.parameters.get("properties", {})
        missing = [k for k in self.parameters.get("required", []) if k not in args]
        if missing:
            return f"{self.name!r} is missing required argument(s) {missing}"
        extra = sorted(str(k) for k in args if k not in props)
        if extra:
            return f"{self.name!r} got unexpected argument(s) {extra}; it accepts {sorted(props)}"
        for key, value in args.items():
            expected = props[key].get("type")
            if expected is not None:
                problem = json_type_error(value, expected)
                if problem is not None:
                    return f"argument {key!r} of {self.name!r} {problem}"
        return None

    @classmethod
    def from_params(cls, params: Params, index_path: IndexSource, options: Any = None) -> Tool:
        """The tool configured by ``params``; ``index_path`` is where the index lives (see
        :data:`IndexSource`), ``options`` its own settings (an ``Options`` instance, or None).
        The default reads nothing else: ``cls()``, with ``self.options = options``."""
        del params, index_path
        tool = cls()
        tool.options = options
        return tool

    def process_reward(self, results: list[Any], episode: Episode, cfg: ProcessRewardConfig) -> float:
        """The process reward this tool's results earn in one turn of ``episode`` (default 0.0).

        ``results``: the raw results of the tool's calls that ran this turn, in call order;
        ``episode``: its record (the question, answers, supporting titles) and state, which
        the tool may update (what it found); ``cfg``: ``env.reward.process``. The env adds
        the sum over its tools to the turn's ``valid_call`` and ``invalid_call`` terms
        (:func:`agent_r1.env.rewards.turn_process_reward`).
        """
        del results, episode, cfg
        return 0.0

    def open(self, episode: Episode) -> Tool:
        """This tool for one episode: a ``per_episode`` tool returns a new instance holding that
        episode's state (which its calls then share); the default is the tool itself."""
        del episode
        return self

    def close(self) -> None:
        """Release what :meth:`open` acquired; called once per opened instance, when its episode
        ends or the rollout stops early (default: nothing to release)."""

    @abstractmethod
    def execute(self, args: dict[str, Any]) -> Any:
        """Run one validated call and return its raw result (rendered by the env, not here)."""

    def batch_execute(self, args_list: list[dict[str, Any]]) -> list[Any]:
        """Run several validated calls; one result per call, in order."""
        return [self.execute(args) for args in args_list]

    def spec(self) -> dict[str, Any]:
        """The OpenAI/Hermes function spec a chat template's ``tools=`` expects."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


class SearchTool(Tool):
    """Search the retrieval corpus: ``{"query": str}`` -> the ``top_k`` best :class:`Hit`\\ s.

    Works with any :class:`SearchIndex` (in-process BM25/dense, or the HTTP
    ``RemoteIndex``); a batch of calls is one ``index.search`` so a rollout
    step costs one retrieval round trip however many episodes search. An index
    with a ``deadline_s`` (the remote one: retries take time) lends it to
    :attr:`backend_deadline_s`. Its process reward pays for the question's
    supporting documents it surfaces (:meth:`process_reward`).
    """

    name = "search"
    description = "Search the knowledge base. Returns the most relevant documents for the query."
    parameters = {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "what to look up, e.g. an entity name"}},
        "required": ["query"],
    }
    max_query_chars = 500  # a longer "query" is the model rambling, and costs retrieval time
    needs_index = True
    # A 2-hop question about fictional entities, so the example teaches the
    # procedure, not facts the model could memorise.
    example = ToolExample(
        question="In which city was the founder of Velmora Labs born?",
        calls=(
            ({"query": "Velmora Labs founder"},
             "Doc 1 (Velmora Labs): Velmora Labs is a robotics company founded by Ilsa Brandt."),
            ({"query": "Ilsa Brandt"}, "Doc 1 (Ilsa Brandt): Ilsa Brandt is an engineer born in Quorvale."),
        ),
        answer="Quorvale",
    )

    def __init__(self, index: SearchIndex, top_k: int):
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
            raise ValueError(f"SearchTool top_k must be an integer >= 1, got {top_k!r}")
        self.index = index
        self.top_k = top_k
        self.backend_deadline_s = getattr(index, "deadline_s", None)

    @classmethod
    def from_params(cls, params: Params, index_path: IndexSource, options: Any = None) -> SearchTool:
        """Search the index at ``index_path`` (loaded here unless already loaded) for ``env.top_k`` hits.
        It declares no ``Options``: ``options`` is always None."""
        del options
        if index_path is None:
            raise ValueError(f"env.tools: tool {cls.name!r} needs a retrieval index, and none was given")
        if isinstance(index_path, SearchIndex):
            return cls(index_path, params.env.top_k)
        return cls(load_index(index_path), params.env.top_k)

    def validate(self, args: Any) -> str | None:
        problem = super().validate(args)
        if problem is not None:
            return problem
        query = args["query"]
        if not query.strip():
            return "search query is empty"
        if len(query) > self.max_query_chars:
            return f"search query is too long ({len(query)} > {self.max_query_chars} characters)"
        return None

    def execute(self, args: dict[str, Any]) -> list[Hit]:
        return self.batch_execute([args])[0]

    def batch_execute(self, args_list: list[dict[str, Any]]) -> list[list[Hit]]:
        queries = [args["query"].strip() for args in args_list]
        results = self.index.search(queries, self.top_k)
        if len(results) != len(queries):
            raise RuntimeError(f"index returned {len(results)} result lists for {len(queries)} queries")
        return [list(hits) for hits in results]

    def process_reward(self, results: list[list[Hit]], episode: Episode, cfg: ProcessRewardConfig) -> float:
        """``new_support_doc * n``, n = the record's supporting titles (``supporting_titles``) these hits
        surface for the first time in the episode; notes every document seen in the episode's state
        (``seen_doc_ids``, ``support_titles_found``, which its ``support_docs_found`` metric counts)."""
        supporting = set(record_list(episode.record, "supporting_titles"))
        new_support = 0
        for hits in results:
            episode.seen_doc_ids.update(h.doc_id for h in hits)
            new = {h.title for h in hits if h.title in supporting} - episode.support_titles_found
            episode.support_titles_found |= new
            new_support += len(new)
        return new_support * cfg.new_support_doc
