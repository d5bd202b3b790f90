"""Exceptions that several layers of agent_r1 raise or catch.

Bottom layer (it imports nothing): a lower layer can raise what a higher one handles,
e.g. the retrieval client raises :class:`ToolInfrastructureError` and the env stops on it.
"""

from __future__ import annotations


class ToolInfrastructureError(RuntimeError):
    """A tool's backend failed (not the call the agent wrote); the message names the backend.

    :class:`~agent_r1.env.env.ToolEnv` never turns it into an error observation:
    it propagates out of ``step_batch`` and stops the rollout.
    """
