"""The ``python`` tool: model-written code run in the episode's own sandboxed interpreter.

Each episode gets an interpreter of its own (``per_episode``), started on its
first call, whose variables carry from call to call, and killed when the episode
ends (:mod:`agent_r1.env.sandbox` says what confines it). Everything the code
does comes back as the observation: its output, its traceback, or that it timed
out or hit a limit (then its variables are lost). Settings, under
``env.tool_options.python``::

    env:
      tools: [python]
      tool_options:
        python: {call_timeout_s: 5, memory_mb: 512, output_chars: 1000}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from agent_r1.config import PluginOptions
from agent_r1.env.episode import Episode
from agent_r1.env.sandbox import PythonSandbox, SandboxLimits
from agent_r1.env.tools import IndexSource, Tool, ToolExample

if TYPE_CHECKING:
    from agent_r1.config import Params


class PythonToolOptions(PluginOptions):
    call_timeout_s: float = Field(5.0, gt=0.0, le=600.0)  # wall clock per call; must be under env.tool_timeout_s
    cpu_s: int = Field(10, ge=1, le=3600)  # CPU seconds per process of the interpreter
    memory_mb: int = Field(512, ge=64, le=65536)  # address space per process
    file_mb: int = Field(16, ge=1, le=4096)  # largest file it may write
    nproc: int = Field(16, ge=1, le=1024)  # processes and threads at once
    nofile: int = Field(64, ge=16, le=4096)  # open files per process
    output_chars: int = Field(1000, ge=100, le=100_000)  # the first and last this many characters are shown


class PythonTool(Tool):
    name = "python"
    description = (
        "Run Python code. Variables persist between calls in one episode. Use print() to show "
        "results; the value of a last bare expression is shown too."
    )
    parameters = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "Python source to run"}},
        "required": ["code"],
    }
    per_episode = True
    Options = PythonToolOptions
    example = ToolExample(
        question="What is the sum of the squares of the first 25 positive integers?",
        calls=(({"code": "sum(k * k for k in range(1, 26))"}, "5525\n"),),
        answer="5525",
    )
    max_code_chars = 20_000

    def __init__(self, limits: SandboxLimits = SandboxLimits()):
        self.limits = limits
        self.sandbox: PythonSandbox | None = None  # set on the per-episode instances only

    @classmethod
    def from_params(cls, params: Params, index_path: IndexSource, options: Any = None) -> PythonTool:
        """The sandbox's limits from ``env.tool_options.python``; its call timeout must be shorter than
        ``env.tool_timeout_s``, so that the sandbox, not the env's thread, ends an overrunning call."""
        del index_path
        options = options or PythonToolOptions()
        if options.call_timeout_s >= params.env.tool_timeout_s:
            raise ValueError(
                f"env.tool_options.python.call_timeout_s ({options.call_timeout_s:g}) must be less than "
                f"env.tool_timeout_s ({params.env.tool_timeout_s:g})"
            )
        tool = cls(SandboxLimits(**options.model_dump()))
        tool.options = options
        return tool

    def open(self, episode: Episode) -> PythonTool:
        del episode
        tool = type(self)(self.limits)
        tool.options = self.options
        tool.sandbox = PythonSandbox(self.limits)
        return tool

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()

    def validate(self, args: Any) -> str | None:
        problem = super().validate(args)
        if problem is None and not args["code"].strip():
            return "code is empty"
        if problem is None and len(args["code"]) > self.max_code_chars:
            return f"code is too long ({len(args['code'])} > {self.max_code_chars} characters)"
        return problem

    def execute(self, args: dict[str, Any]) -> str:
        if self.sandbox is None:
            raise RuntimeError("the python tool runs on an episode's instance (Tool.open), not the shared one")
        return self.sandbox.run(args["code"]).observation()
