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
params as ``data.source: package.module:Name``; free-form settings for it go in
``data.options`` (``self.options``). The registry (:data:`agent_r1.registry.DATA_SOURCES`)
is the list of built-in names. Kept light (no pandas at import): the params
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
    """One data source; constructed by :func:`get_source` with its params name and ``data.options``.

    Generated kind: override :meth:`generate`. Downloaded kind: set ``downloads = True``,
    ``urls`` and ``files`` (same split keys), and override :meth:`read`.
    """

    downloads: ClassVar[bool] = False
    urls: ClassVar[Mapping[str, str]] = {}  # official split -> URL of the published file (or zip)
    files: ClassVar[Mapping[str, str]] = {}  # official split -> file name; for a zip, the member's base name

    def __init__(self, name: str, options: Mapping[str, Any] | None = None) -> None:
        self.name = name  # what params call it: the registry name or "package.module:Name"
        self.options: dict[str, Any] = dict(options or {})  # data.options, for a plugin's own settings

    def generate(self, data: DataConfig) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Generated kind: ``(questions with split train/test, corpus)`` for these params."""
        raise NotImplementedError(f"{type(self).__qualname__} generates nothing (downloads = True?)")

    def read(self, path: Path, max_questions: int | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Downloaded kind: ``(questions, corpus)`` parsed from the downloaded file at ``path``.

        ``max_questions`` keeps the first N questions (``data.real.max_questions``); ``split``
        may hold anything, the prepare stage assigns it.
        """
        raise NotImplementedError(f"{type(self).__qualname__} reads no downloaded file (downloads = False?)")


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
    """The source ``value`` names (a registered name or a plugin reference), ready to use."""
    from agent_r1.registry import DATA_SOURCES

    if (problem := DATA_SOURCES.problem(value)) is not None:
        raise ValueError(problem)
    return DATA_SOURCES.load(value)(value, options)
