"""Extension points by name: the one list of every built-in name, and plugins.

Each registry maps a short name (what ``params.yaml`` says) to where its object
lives, ``"module:attribute"``, imported on first use: reading the names, as the
params check does, imports nothing heavy (the estimators need torch, the data
sources pandas). Adding a built-in is one ``add`` line here next to the object.

A params value holding a ``:`` is a *plugin*: ``"package.module:Name"`` from the
user's own code (importable from the project root, where the stages run). It is
imported, checked against the extension point's interface, and then used exactly
like a built-in; a failed import or a wrong object is an error naming the params
key before any work starts. What an extension point expects of its objects is
in its base class or its built-ins' docstrings:

===============  ====================  =================================================
registry         params key            object
===============  ====================  =================================================
TOOLS            ``env.tools``         a ``agent_r1.env.tools.Tool`` subclass
ENVS             ``env.name``          a ``agent_r1.env.agent_env.AgentEnv`` subclass (a stateful env)
FORMATS          ``env.format``        an ``agent_r1.env.formats.ActionFormat`` subclass
REWARDS          ``env.reward.scheme`` ``fn(answer, golds, format_valid, cfg) -> float``
DATA_SOURCES     ``data.source``       an ``agent_r1.data.sources.DataSource`` subclass
ESTIMATORS       ``algorithm.name``    an advantage function (``agent_r1.algorithms.advantages``)
===============  ====================  =================================================

Metadata an entry carries (``needs_critic`` for an estimator) is given to ``add``
for a built-in and read from the object's attribute of that name for a plugin.

**Options.** An object may take settings of its own from ``params.yaml``: it declares
them as a pydantic model in its attribute ``Options`` (derive it from
``agent_r1.config.PluginOptions``: unknown keys are errors), metadata like
``needs_critic``; one without ``Options`` takes none (a built-in that declares some
names them in ``add``, by reference).
:meth:`Registry.options` validates the raw mapping into an ``Options`` instance,
defaults filled in: the params check calls it (a bad option fails naming its key),
and so does whatever builds the object, which receives that instance:

* a tool: ``env.tool_options.<the name the agent calls it by>``, given to
  ``Tool.from_params(params, index_path, options)`` (by default ``self.options``);
* a reward scheme: ``env.reward.options``, as ``fn(..., options=...)``;
* a data source: ``data.options``, given to every named source with ``Options`` as
  ``DataSource(name, options)`` (``self.options``);
* an estimator: ``algorithm.options``, as ``fn(..., options=...)`` (``compute_advantages``).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PLUGIN_SEPARATOR = ":"
OPTIONS = "Options"  # the attribute by which an object declares its own settings (a pydantic model class)


@dataclass(frozen=True)
class Entry:
    ref: str  # "module:attribute"
    meta: dict[str, Any] = field(default_factory=dict)


def is_plugin(value: str) -> bool:
    """A ``package.module:Name`` reference rather than a registered name."""
    return PLUGIN_SEPARATOR in value


def _project_importable() -> None:
    """Plugins live in the project, where the stages run (``python -m`` puts it on the path);
    a console script (``agent-r1``) starts with its own folder there instead."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())


def import_ref(ref: str) -> Any:
    """The object ``"package.module:Name"`` names (``Name`` may be dotted: ``Class.attr``)."""
    module_name, _, attr = ref.partition(PLUGIN_SEPARATOR)
    if not module_name or not attr:
        raise ImportError(f"{ref!r} is not of the form package.module:Name")
    _project_importable()
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ImportError(f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def ref_source(ref: str) -> Path | None:
    """The code a plugin reference depends on: its top-level package's folder, or its module's
    file; None for a module that is not a file (built into Python)."""
    top = ref.partition(PLUGIN_SEPARATOR)[0].split(".")[0]
    spec = importlib.util.find_spec(top)
    if spec is None or spec.origin in (None, "built-in", "frozen"):
        return None
    origin = Path(spec.origin)
    return origin.parent if origin.name == "__init__.py" else origin


def subclass_of(base_ref: str) -> Callable[[Any], str | None]:
    """An interface check: the object must be a class deriving from ``base_ref`` (imported when a plugin is checked)."""

    def check(obj: Any) -> str | None:
        base = import_ref(base_ref)
        if inspect.isclass(obj) and issubclass(obj, base):
            return None
        return f"must be a subclass of {base.__module__}.{base.__qualname__}, got {obj!r}"

    return check


def function_taking(*names: str) -> Callable[[Any], str | None]:
    """An interface check: a function (or other callable) that accepts keyword arguments ``names``."""

    def check(obj: Any) -> str | None:
        if not callable(obj) or inspect.isclass(obj):
            return f"must be a function, got {obj!r}"
        params = inspect.signature(obj).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        missing = [n for n in names if n not in params and not takes_any]
        return f"must take the arguments {', '.join(names)}; missing {', '.join(missing)}" if missing else None

    return check


def options_problem(obj: Any) -> str | None:
    """Why the ``Options`` an object declares cannot be used, or None (also when it declares none).

    ``Options`` must be a pydantic model that forbids unknown keys (a misspelt option must never be
    ignored), and a function (a reward scheme, an estimator) must take the ``options`` it is given,
    and may require them only when it declares ``Options`` (without, it is given none).
    """
    model = getattr(obj, OPTIONS, None)
    if model is None:
        takes = {} if inspect.isclass(obj) or not callable(obj) else inspect.signature(obj).parameters
        if "options" in takes and takes["options"].default is inspect.Parameter.empty:
            return f"requires options but declares no {OPTIONS} to validate them"
        return None
    from pydantic import BaseModel  # here, not at import: reading the names imports nothing heavy

    if not (inspect.isclass(model) and issubclass(model, BaseModel)) or model.model_config.get("extra") != "forbid":
        return (f"its {OPTIONS} must be a pydantic model that forbids unknown keys (derive it from "
                f"agent_r1.config.PluginOptions), got {model!r}")
    if not inspect.isclass(obj) and function_taking("options")(obj) is not None:
        return f"declares {OPTIONS} but takes no argument options to receive them"
    return None


class Registry:
    """Names -> objects for one extension point (see the module docstring)."""

    def __init__(self, kind: str, check: Callable[[Any], str | None]):
        self.kind = kind
        self._check = check
        self._entries: dict[str, Entry] = {}
        self._loaded: dict[str, Any] = {}

    def add(self, name: str, ref: str, **meta: Any) -> None:
        """Register a built-in: ``name`` -> the object at ``ref`` (imported on first use)."""
        if name in self._entries or is_plugin(name):
            raise ValueError(f"{self.kind} {name!r}: already registered or contains {PLUGIN_SEPARATOR!r}")
        self._entries[name] = Entry(ref, meta)

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def problem(self, value: str) -> str | None:
        """Why ``value`` names no usable object (unknown name, failed import, wrong interface), or None."""
        if not is_plugin(value):
            if value in self._entries:
                return None
            return f"unknown {self.kind} {value!r}; one of {', '.join(self._entries)}, or a plugin 'package.module:Name'"
        try:
            obj = self.load(value)
        except Exception as exc:  # any import-time failure of user code is reported, not raised
            return f"plugin {value!r} could not be imported: {type(exc).__name__}: {exc}"
        if (why := self._check(obj) or options_problem(obj)) is not None:
            return f"plugin {value!r} is no {self.kind}: {why}"
        return None

    def load(self, value: str) -> Any:
        """The object ``value`` names: a registered name or a plugin reference."""
        if value not in self._loaded:
            if is_plugin(value):
                self._loaded[value] = import_ref(value)
            elif value in self._entries:
                self._loaded[value] = import_ref(self._entries[value].ref)
            else:
                raise KeyError(self.problem(value))
        return self._loaded[value]

    def meta(self, value: str, key: str, default: Any = None) -> Any:
        """Metadata ``key`` of ``value``: given to ``add`` for a built-in, the object's attribute for a plugin."""
        if is_plugin(value):
            return getattr(self.load(value), key, default)
        return self._entries[value].meta.get(key, default)

    def options_model(self, value: str) -> Any:
        """The pydantic model of ``value``'s own settings (metadata ``Options``; a built-in names it by
        reference, imported only when asked for), or None: it takes none."""
        model = self.meta(value, OPTIONS)
        return import_ref(model) if isinstance(model, str) else model

    def options(self, value: str, raw: Mapping[str, Any] | None) -> Any:
        """``value``'s settings: ``raw`` validated by its ``Options`` model (an instance, defaults filled in),
        or None for an object that takes none.

        Raises pydantic's ``ValidationError`` (a ``ValueError``) for a bad option, and ``ValueError`` for
        options given to an object without ``Options``.
        """
        model = self.options_model(value)
        if model is None:
            if raw:
                raise ValueError(f"{self.kind} {value!r} takes no options (it declares no {OPTIONS}), got {dict(raw)}")
            return None
        return model.model_validate(dict(raw or {}))


TOOLS = Registry("tool", subclass_of("agent_r1.env.tools:Tool"))
TOOLS.add("search", "agent_r1.env.tools:SearchTool")
TOOLS.add("python", "agent_r1.env.python_tool:PythonTool", Options="agent_r1.env.python_tool:PythonToolOptions")

# env.name null is the tool env of the QA task (agent_r1.env.env.ToolEnv)
ENVS = Registry("environment", subclass_of("agent_r1.env.agent_env:AgentEnv"))
ENVS.add("textworld", "agent_r1.env.textworld_env:TextWorldEnv", Options="agent_r1.env.textworld_env:TextWorldEnvOptions")

FORMATS = Registry("action format", subclass_of("agent_r1.env.formats:ActionFormat"))
FORMATS.add("tags", "agent_r1.env.formats:TagFormat")
FORMATS.add("tool_call", "agent_r1.env.formats:ToolCallFormat")

REWARDS = Registry("reward scheme", function_taking("answer", "golds", "format_valid", "cfg"))
REWARDS.add("paper", "agent_r1.env.rewards:paper_reward")
REWARDS.add("answer_only", "agent_r1.env.rewards:answer_only_reward")
REWARDS.add("answer_plus_format", "agent_r1.env.rewards:answer_plus_format_reward")

# the check also asks for the kind's methods (generate, or downloads + urls/files + read)
DATA_SOURCES = Registry("data source", lambda obj: import_ref("agent_r1.data.sources:interface_problem")(obj))
DATA_SOURCES.add("synthetic", "agent_r1.data.synthetic:SyntheticWorld")
DATA_SOURCES.add("hotpotqa", "agent_r1.data.official:HotpotQA", downloads=True)
DATA_SOURCES.add("2wikimultihopqa", "agent_r1.data.official:TwoWikiMultihopQA", downloads=True)
DATA_SOURCES.add("musique", "agent_r1.data.official:MuSiQue", downloads=True)
DATA_SOURCES.add("textworld", "agent_r1.data.textworld_games:TextWorldGames",
                 Options="agent_r1.data.textworld_games:TextWorldOptions")

# What ``compute_advantages`` offers an estimator (each gets the ones it names): a plugin may
# require no other argument; ``needs_critic = True`` on it asks the trainer for ``values``;
# ``options`` is its own ``Options`` instance (``algorithm.options`` validated).
ESTIMATOR_ARGUMENTS = (
    "token_rewards", "action_mask", "group_id", "values", "gamma", "lam", "align", "response_mask",
    "process_rewards", "norm_by_std", "options",
)


def advantage_function(obj: Any) -> str | None:
    """An estimator's interface: takes ``token_rewards`` and ``action_mask``, requires nothing
    outside :data:`ESTIMATOR_ARGUMENTS`, and takes ``values`` when it sets ``needs_critic``."""
    if (why := function_taking("token_rewards", "action_mask")(obj)) is not None:
        return why
    params = inspect.signature(obj).parameters
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    extra = [n for n, p in params.items() if p.kind in named and p.default is p.empty and n not in ESTIMATOR_ARGUMENTS]
    if extra:
        return f"requires {', '.join(extra)}; an estimator is offered only {', '.join(ESTIMATOR_ARGUMENTS)}"
    if getattr(obj, "needs_critic", False) and "values" not in params:
        return "sets needs_critic but does not take values (the critic's)"
    return None


ESTIMATORS = Registry("advantage estimator", advantage_function)
ESTIMATORS.add("ppo", "agent_r1.algorithms.advantages:gae", needs_critic=True)
ESTIMATORS.add("gae", "agent_r1.algorithms.advantages:gae", needs_critic=True)
ESTIMATORS.add("grpo", "agent_r1.algorithms.advantages:grpo")
ESTIMATORS.add("rloo", "agent_r1.algorithms.advantages:rloo")
ESTIMATORS.add("reinforce_pp", "agent_r1.algorithms.advantages:reinforce_pp")
ESTIMATORS.add("reinforce_pp_baseline", "agent_r1.algorithms.advantages:reinforce_pp_baseline")
