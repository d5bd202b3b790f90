"""Tools: each executes one atomic action and returns its raw result.

A tool knows nothing of rewards, observations or chat formats (Agent-R1's
split): :class:`~agent_r1.env.env.ToolEnv` validates the arguments the policy
wrote, calls the tool, renders the raw result into the observation and scores
the step. A tool only declares what it accepts (``parameters``, a JSON schema
of the arguments object, which is also what the chat template's ``tools=``
shows a tool-calling model) and does the work.

A tool that cannot work for a reason that is not the agent's (its server is
down or answers garbage) raises :class:`ToolInfrastructureError`: the env
re-raises it and the run stops, instead of scoring an invalid call that would
quietly poison the rewards.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from agent_r1.retrieval.base import Hit, SearchIndex

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


class ToolInfrastructureError(RuntimeError):
    """A tool's backend failed (not the call the agent wrote); the message names the backend.

    :class:`~agent_r1.env.env.ToolEnv` never turns it into an error observation:
    it propagates out of ``step_batch`` and stops the rollout.
    """


class Tool(ABC):
    """One atomic action the agent can take.

    Subclasses set ``name``, ``description`` and ``parameters`` (a JSON schema
    with ``"type": "object"``, ``properties`` and ``required``) and implement
    :meth:`execute`. Override :meth:`validate` to add checks beyond the schema
    and :meth:`batch_execute` when many calls are cheaper together (one batched
    index lookup instead of 32).
    """

    name: str
    description: str
    parameters: dict[str, Any]
    # Seconds within which the tool's backend gives up by itself (a client that retries with backoff),
    # or None. The env then waits that long beyond env.tool_timeout_s, so a dead backend reports its own
    # named error, and treats an overrun as an infrastructure failure rather than the agent's.
    backend_deadline_s: float | None = None

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
    :attr:`backend_deadline_s`.
    """

    name = "search"
    description = "Search the knowledge base. Returns the most relevant documents for the query."
    parameters = {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "what to look up, e.g. an entity name"}},
        "required": ["query"],
    }
    max_query_chars = 500  # a longer "query" is the model rambling, and costs retrieval time

    def __init__(self, index: SearchIndex, top_k: int):
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
            raise ValueError(f"SearchTool top_k must be an integer >= 1, got {top_k!r}")
        self.index = index
        self.top_k = top_k
        self.backend_deadline_s = getattr(index, "deadline_s", None)

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
