"""Rollouts: generation engines and the multi-turn loop that produces a TrajectoryBatch.

Engines are imported lazily by their users' choice (``TransformersEngine``
loads transformers; a vLLM engine would load vLLM), so importing this package
stays cheap.
"""

from agent_r1.rollout.engine import GenerationEngine, GenerationOutput, TransformersEngine
from agent_r1.rollout.loop import run_episodes
from agent_r1.rollout.trajectory import TrajectoryBatch

__all__ = ["GenerationEngine", "GenerationOutput", "TransformersEngine", "TrajectoryBatch", "run_episodes"]
