"""The inference-engine interface: token ids in, token ids (and their logprobs) out, and new weights in.

An engine (:class:`GenerationEngine`) generates and loads weights; it does not
know episodes or environments. The scheduler (:mod:`agent_r1.rollout.scheduler`)
plays the episodes: it hands an engine token ids and gets token ids back, so the
trajectory the trainer sees is exactly what the policy produced (nothing is
decoded and re-encoded). For multi-turn episodes the scheduler drives a
:class:`TurnSession` that the engine opens (:meth:`GenerationEngine.open_turns`):
it adds each episode's context, asks for the turns that end, and adds the next
context or drops the episode. An engine that keeps state across turns (the
transformers engine's KV caches, :mod:`agent_r1.rollout.continuous`) opens its
own session; the default, :class:`TurnByTurnSession`, is one ``generate`` call
per turn.

Logprob convention (every engine): ``logprobs[i]`` is the sampled token's log-probability
under the temperature it was sampled at, before top-p filtering:
``log_softmax(model_logits / temperature)[token_ids[i]]`` (the raw logits when greedy).
That is the distribution the trainer optimises and scores (it scores at
``rollout.temperature``), so the two can be compared directly (the trainer logs
the gap as ``train/rollout_mismatch``) and used as the behaviour policy's
logprobs in importance ratios. vLLM's ``processed_logprobs`` are the same when
``top_p`` is 1 (with ``top_p`` < 1 vLLM renormalises them over the nucleus).
TransformersEngine applies the output projection in float32 (bf16 logits are
rounded to 0.125 steps); a trainer that wants to match it to ~1e-2 in bf16
should do the same.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

FINISH_REASONS: tuple[str, ...] = ("stop", "length")


@dataclass
class GenerationOutput:
    """One prompt's continuation.

    ``finish_reason`` is ``"stop"`` when a stop string or an end-of-turn token
    ended it (that token is kept, tokens after a stop string are never
    produced) and ``"length"`` when it hit its ``max_new_tokens``.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


@dataclass(frozen=True)
class TurnSettings:
    """How multi-turn episodes are generated (from ``rollout`` params).

    Each turn may generate ``min(max_new_tokens, max_total_tokens - context length)``
    tokens; ``slots`` episodes are decoded at once.
    """

    max_new_tokens: int
    max_total_tokens: int
    temperature: float
    top_p: float
    slots: int

    def budget(self, context_length: int) -> int:
        """Tokens a turn that continues a context of ``context_length`` ids may generate."""
        return min(self.max_new_tokens, self.max_total_tokens - context_length)


class TurnSession(ABC):
    """Multi-turn generation driven by the scheduler, one episode per ``key``.

    The scheduler :meth:`add`\\ s an episode's context (its prompt, later the
    context its next turn continues), calls :meth:`step` for the turns that
    end, and for each ended turn either adds the episode's next context or
    :meth:`drop`\\ s the episode. A context is always the whole sequence the
    turn continues; a session that caches may reuse what it computed for the
    part the new context shares with the old one.
    """

    @abstractmethod
    def add(self, key: Hashable, context: list[int]) -> None:
        """Queue a turn of episode ``key`` that continues ``context`` (a new episode, or one whose turn ended)."""

    @abstractmethod
    def step(self) -> list[tuple[Hashable, GenerationOutput]]:
        """Generate until at least one queued turn has ended; return the ended turns (none: nothing is left)."""

    def drop(self, key: Hashable) -> None:
        """Forget episode ``key``, whose turn ended and which has no next turn (frees what is kept of it)."""


class TurnByTurnSession(TurnSession):
    """One ``generate`` call per turn (per ``settings.slots`` episodes) with each episode's whole context.

    The engine sees every context afresh, so unless it caches prefixes itself
    (vLLM's prefix caching does) it prefills the history again on every turn,
    and a turn waits for its slowest episode. Episodes go sorted by context
    length, ties in the order they were first added (similar lengths waste less
    padding); the i-th call's seed is the i-th draw of ``random.Random(seed)``.
    """

    def __init__(self, engine: GenerationEngine, settings: TurnSettings, stop_strings: Sequence[str], seed: int):
        self.engine, self.settings, self.stop_strings = engine, settings, list(stop_strings)
        self.seeds = random.Random(seed)
        self.arrival: dict[Hashable, int] = {}  # the order in which episodes were first added
        self.queued: dict[Hashable, list[int]] = {}

    def add(self, key: Hashable, context: list[int]) -> None:
        self.arrival.setdefault(key, len(self.arrival))
        self.queued[key] = list(context)

    def step(self) -> list[tuple[Hashable, GenerationOutput]]:
        queued, self.queued = self.queued, {}
        order = sorted(queued, key=lambda k: (len(queued[k]), self.arrival[k]))
        outputs: list[GenerationOutput] = []
        s = self.settings
        for start in range(0, len(order), s.slots):
            chunk = order[start : start + s.slots]
            outputs += self.engine.generate(
                [queued[k] for k in chunk], [s.budget(len(queued[k])) for k in chunk],
                temperature=s.temperature, top_p=s.top_p, stop_strings=self.stop_strings,
                seed=self.seeds.getrandbits(63),
            )
        return list(zip(order, outputs, strict=True))


class WeightNames:
    """The weights of one sync, checked as they come: each name known and sent once, all by the end.

    ``optional``: names an engine takes but does not need (a tied ``lm_head.weight`` is the embedding).
    """

    def __init__(self, required: set[str], optional: set[str]) -> None:
        self.required, self.optional = set(required), set(optional)
        self.seen: set[str] = set()

    def take(self, names: Iterable[str]) -> None:
        """Record a bucket's names; a KeyError for unknown or repeated ones (checked before anything loads)."""
        names = list(names)
        unexpected = sorted(n for n in names if n not in self.required and n not in self.optional)
        repeated = sorted(n for n in names if n in self.seen)
        if unexpected or repeated:
            raise KeyError(f"update_weights: unexpected keys {unexpected[:5]}, repeated keys {repeated[:5]}")
        self.seen.update(names)

    def check_complete(self) -> None:
        """A KeyError naming the weights the sync never sent (the engine would sample with stale ones)."""
        missing = sorted(self.required - self.seen)
        if missing:
            raise KeyError(f"update_weights: missing keys {missing[:5]} ({len(missing)} of {len(self.required)})")


class GenerationEngine(ABC):
    """An inference backend (transformers, vLLM, a test double): it generates and loads weights.

    A subclass implements :meth:`generate`; to take new weights, the three
    hooks of a weight sync (:meth:`_expected_weights`, :meth:`_load_weights`,
    :meth:`_finish_weight_sync`); to keep state across turns, :meth:`open_turns`.
    """

    @abstractmethod
    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: list[int] | int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop_strings: Sequence[str] = (),
        seed: int | None = None,
    ) -> list[GenerationOutput]:
        """Continue every prompt; greedy when ``temperature == 0``. See the module doc for logprobs."""

    def open_turns(self, settings: TurnSettings, stop_strings: Sequence[str] = (), seed: int = 0) -> TurnSession:
        """A session for multi-turn episodes; by default one ``generate`` call per turn (:class:`TurnByTurnSession`)."""
        return TurnByTurnSession(self, settings, stop_strings, seed)

    # ------------------------------------------------------------ weights
    # the names of the weight sync in progress (None: none is)
    _weight_sync: WeightNames | None = None

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load new policy weights, named as in the model's checkpoint (the trainer's weight sync).

        Alone, ``state_dict`` is the complete set (one sync). Inside :meth:`weight_sync`, each call
        may carry any subset (a bucket), so a sync never needs the whole model in memory at once.
        Unknown or repeated names raise a KeyError before anything is loaded. The engine copies
        what it keeps: a bucket's tensors may be freed (re-partitioned by ZeRO-3) once it returns.
        """
        if self._weight_sync is None:
            with self.weight_sync():
                self.update_weights(state_dict)
            return
        self._weight_sync.take(state_dict)
        self._load_weights(state_dict)

    @contextmanager
    def weight_sync(self) -> Iterator[None]:
        """Group :meth:`update_weights` calls (buckets) into one sync.

        On exit every weight must have come (else a KeyError), then the once-per-sync work runs
        once, not once per bucket (derived state such as a packed or float32 head, caches of KV
        computed with the old weights). After a sync that raised, the weights are a mix of old
        and new: sync again before sampling.
        """
        if self._weight_sync is not None:
            raise RuntimeError(f"{type(self).__name__}.weight_sync: a sync is already in progress")
        self._weight_sync = WeightNames(*self._expected_weights())
        try:
            yield
            self._weight_sync.check_complete()
        finally:
            self._weight_sync = None
        self._finish_weight_sync()

    def share_weights(self, state_dict: Mapping[str, torch.Tensor]) -> bool:
        """Sample with the trainer's own tensors ``state_dict`` instead of a copy, when the engine can:
        the optimizer's in-place updates are then what the next rollout sees. Returns whether it
        did; False (the default), changing nothing, means the caller copies with :meth:`update_weights`."""
        return False

    def _expected_weights(self) -> tuple[set[str], set[str]]:
        """(names a sync must send, names it may send)."""
        raise NotImplementedError(f"{type(self).__name__} does not support update_weights")

    def _load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Load some of the weights (names already checked); copy what is kept."""
        raise NotImplementedError(f"{type(self).__name__} does not support update_weights")

    def _finish_weight_sync(self) -> None:
        """The once-per-sync work after the last bucket (nothing by default)."""

    # ------------------------------------------------------------ memory
    def sleep(self) -> None:
        """Free what the engine holds on the accelerator while the trainer updates (vLLM on GPU);
        nothing by default. The next call is :meth:`wake_up`, then a weight sync."""

    def wake_up(self) -> None:
        """Take back what :meth:`sleep` freed, before the weight sync and the next rollout."""
