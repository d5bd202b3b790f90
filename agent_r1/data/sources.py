"""The one interface of every data source (``data.source`` in params), built-in or a user's plugin.

A source is one of two kinds, told apart by the class attribute ``downloads``:

- **generated** (``downloads = False``, the default): :meth:`DataSource.generate`
  builds the questions, ``split`` already set to ``train`` / ``test``, and the
  corpus from the params alone; the download stage fetches nothing for it.
  Built-in: the synthetic world (:class:`agent_r1.data.synthetic.SyntheticWorld`).
- **downloaded** (``downloads = True``): ``urls`` and ``files`` say, per official
  split (``data.real.split``: ``train`` / ``dev``), where the file is published
  and what it is called (for a zip, the base name of the member to extract);
  the download stage fetches it (mirrors, sha256 pin: ``data.real``) and
  :meth:`DataSource.read` parses it. The prepare stage then splits the questions
  into train/test by a hash of their id, or makes them all test questions for
  a ``data.test_only`` source. Built-ins: HotpotQA, 2WikiMultihopQA, MuSiQue
  (:mod:`agent_r1.data.official`).

Both return frames in the normalised schema (:mod:`agent_r1.data.schema`):
questions ``id, question, answers, supporting_titles, type, source, split,
sub_queries`` (:func:`agent_r1.data.schema.questions_frame` builds and checks
one from dict records) and corpus ``doc_id, title, text``.

A plugin is a subclass of :class:`DataSource` in the user's own module, named in
params as ``data.source: package.module:Name``. Settings of its own it declares as
``Options`` (a model derived from :class:`agent_r1.config.PluginOptions`) and
reads as ``self.options``; they go in ``data.options``, which every named source
with ``Options`` validates (the params check, naming the key) and receives, and
no other. The registry (:data:`agent_r1.registry.DATA_SOURCES`) is the list of
built-in names. Kept light (no pandas at import): the params
check imports this module to check a plugin.
"""

from __future__ import annotations

import inspect
from abc import ABC
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import pandas as pd

    from agent_r1.config import DataConfig


class DataSource(ABC):
    """One data source; constructed by :func:`get_source` with its params name and its options
    (``data.options`` validated by ``Options``; None for a source without ``Options``).

    Generated kind: override :meth:`generate`. Downloaded kind: set ``downloads = True``,
    ``urls`` and ``files`` (same split keys), and override :meth:`read`.
    """

    downloads: ClassVar[bool] = False
    urls: ClassVar[Mapping[str, str]] = {}  # official split -> URL of the published file (or zip)
    files: ClassVar[Mapping[str, str]] = {}  # official split -> file name; for a zip, the member's base name
    Options: ClassVar[Any] = None  # the model of its own settings (data.options); None: it takes none

    def __init__(self, name: str, options: Any = None) -> None:
        self.name = name  # what params call it: the registry name or "package.module:Name"
        self.options = options  # an Options instance: data.options validated (see get_source)

    def generate(self, data: DataConfig) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Generated kind: ``(questions with split train/test, corpus)`` for these params."""
        raise NotImplementedError(f"{type(self).__qualname__} generates nothing (downloads = True?)")

    def read(self, path: Path, max_questions: int | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Downloaded kind: ``(questions, corpus)`` parsed from the downloaded file at ``path``.

        ``max_questions`` keeps the first N questions (``data.real.max_questions``); ``split``
        may hold anything, the prepare stage assigns it.
        """
        raise NotImplementedError(f"{type(self).__qualname__} reads no downloaded file (downloads = False?)")

    def write_files(self, questions: pd.DataFrame, folder: Path) -> None:
        """Files the records refer to (a game per record), written into the prepared ``folder``
        after :meth:`generate` or :meth:`read`. Most sources have none."""


def _overrides(cls: type, method: str) -> bool:
    return getattr(cls, method) is not getattr(DataSource, method)


def interface_problem(obj: Any) -> str | None:
    """Why ``obj`` is no usable data source class (the registry's check of a plugin), or None."""
    if not (inspect.isclass(obj) and issubclass(obj, DataSource)):
        return f"must be a subclass of {DataSource.__module__}.{DataSource.__qualname__}, got {obj!r}"
    if inspect.isabstract(obj):
        return f"{obj.__qualname__} is abstract: implement {', '.join(sorted(obj.__abstractmethods__))}"
    if not obj.downloads:
        return None if _overrides(obj, "generate") else "must implement generate(data) (or set downloads = True)"
    if not _overrides(obj, "read"):
        return "has downloads = True but does not implement read(path, max_questions)"
    if not obj.urls or set(obj.urls) != set(obj.files):
        return f"has downloads = True: urls and files must name the same splits, got {dict(obj.urls)} / {dict(obj.files)}"
    return None


def get_source(value: str, options: Mapping[str, Any] | None = None) -> DataSource:
    """The source ``value`` names (a registered name or a plugin reference), ready to use.

    ``options`` is ``data.options``: validated by the source's ``Options`` into its ``self.options``;
    a source without ``Options`` takes none of them (they are another named source's).
    """
    from agent_r1.registry import DATA_SOURCES

    if (problem := DATA_SOURCES.problem(value)) is not None:
        raise ValueError(problem)
    takes = DATA_SOURCES.options_model(value) is not None
    return DATA_SOURCES.load(value)(value, DATA_SOURCES.options(value, options) if takes else None)
