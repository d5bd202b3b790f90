"""Generation engines: token ids in, token ids (and their logprobs) out.

The multi-turn loop (:mod:`agent_r1.rollout.loop`) only ever hands token ids to
an engine and gets token ids back, so the trajectory the trainer sees is exactly
what the policy produced: nothing is decoded and re-encoded.

Logprob convention (every engine): ``logprobs[i]`` is
``log_softmax(model_logits)[token_ids[i]]`` of the model's raw logits, i.e. at
temperature 1 and before top-p filtering, whatever temperature/top_p were used
to *sample*. That is the quantity the trainer's teacher-forced pass recomputes
(``log_softmax(logits).gather(ids)``), so the two can be compared directly and
used as the behaviour policy's logprobs in importance ratios. (With
temperature != 1 the true sampling distribution differs; recompute it from
these if a consumer needs it.) TransformersEngine applies the output projection
in float32 (bf16 logits are rounded to 0.125 steps); a trainer that wants to
match it to ~1e-2 in bf16 should do the same.
"""

from __future__ import annotations

import functools
import logging
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

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
class NewContext:
    """A turn-end reply that replaces an episode's context: its next turn continues ``ids``
    (the whole context, not a delta). Context management (``env.context``) replies with one
    when it shortens earlier observations; an engine keeps what it cached of the common prefix."""

    ids: list[int]


# A turn ended for these (episode index, output) pairs: return, per pair, the ids to
# append before the episode's next turn (its observation), a NewContext, or None when it is done.
TurnReply = list[int] | NewContext | None
TurnEnd = Callable[[list[tuple[int, GenerationOutput]]], list[TurnReply]]


def next_context(context: list[int], reply: list[int] | NewContext) -> list[int]:
    """The ids the next turn continues: ``context`` (which ends with the turn's action) then the
    reply's ids, or the reply's own context."""
    return list(reply.ids) if isinstance(reply, NewContext) else context + reply


@dataclass(frozen=True)
class TurnSettings:
    """How multi-turn episodes are generated (from ``rollout`` params).

    Each turn may generate ``min(max_new_tokens, max_total_tokens - length so
    far)`` tokens; ``slots`` episodes are decoded at once.
    """

    max_new_tokens: int
    max_total_tokens: int
    temperature: float
    top_p: float
    slots: int


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
    """What the rollout loop needs from an inference backend (transformers, vLLM, a test double)."""

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

    def run_turns(
        self, prompts: list[list[int]], on_turn_end: TurnEnd, settings: TurnSettings,
        stop_strings: Sequence[str] = (), seed: int = 0,
    ) -> None:
        """Play multi-turn episodes to the end: generate a turn, hand it to ``on_turn_end``, append the reply.

        This default runs turn by turn (:func:`run_turns_synchronously`);
        engines that keep state across turns override it.
        """
        run_turns_synchronously(self, prompts, on_turn_end, settings, stop_strings, seed)

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

    def _expected_weights(self) -> tuple[set[str], set[str]]:
        """(names a sync must send, names it may send)."""
        raise NotImplementedError(f"{type(self).__name__} does not support update_weights")

    def _load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Load some of the weights (names already checked); copy what is kept."""
        raise NotImplementedError(f"{type(self).__name__} does not support update_weights")

    def _finish_weight_sync(self) -> None:
        """The once-per-sync work after the last bucket (nothing by default)."""

    def sleep(self) -> None:
        """Free what the engine holds on the accelerator while the trainer updates (vLLM on GPU);
        nothing by default. The next call is :meth:`wake_up`, then a weight sync."""

    def wake_up(self) -> None:
        """Take back what :meth:`sleep` freed, before the weight sync and the next rollout."""


def run_turns_synchronously(
    engine: GenerationEngine, prompts: list[list[int]], on_turn_end: TurnEnd, settings: TurnSettings,
    stop_strings: Sequence[str] = (), seed: int = 0,
) -> None:
    """One ``generate`` call per turn (per ``settings.slots`` episodes) with each episode's whole history.

    The engine sees every history afresh, so unless it caches prefixes itself
    (vLLM's prefix caching does) it prefills the history again on every turn,
    and a turn waits for its slowest episode. Episodes go sorted by length
    (similar lengths waste less padding); the i-th call's seed is the i-th draw
    of ``random.Random(seed)``.
    """
    seqs = [list(p) for p in prompts]
    seeds = random.Random(seed)
    active = list(range(len(seqs)))
    while active:
        order = sorted(active, key=lambda i: len(seqs[i]))
        outputs: list[GenerationOutput] = []
        for start in range(0, len(order), settings.slots):
            chunk = order[start : start + settings.slots]
            outputs += engine.generate(
                [seqs[i] for i in chunk],
                [min(settings.max_new_tokens, settings.max_total_tokens - len(seqs[i])) for i in chunk],
                temperature=settings.temperature, top_p=settings.top_p, stop_strings=stop_strings,
                seed=seeds.getrandbits(63),
            )
        replies = on_turn_end(list(zip(order, outputs)))
        for i, out, reply in zip(order, outputs, replies, strict=True):
            if reply is not None:
                seqs[i] = next_context(seqs[i] + out.token_ids, reply)
        active = sorted(i for i, reply in zip(order, replies) if reply is not None)


def shared_prefix_length(prompts: list[list[int]], minimum: int) -> int:
    """Length of the prompts' common prefix, leaving at least one token of each prompt;
    0 when it is shorter than ``minimum``, ``minimum <= 0`` or there are fewer than 2 prompts."""
    if len(prompts) < 2 or minimum <= 0:
        return 0
    first, shortest = prompts[0], min(len(p) for p in prompts)
    n = 0
    while n < shortest - 1 and all(p[n] == first[n] for p in prompts):
        n += 1
    return n if n >= minimum else 0


def check_generate_args(
    prompts: list[list[int]], max_new_tokens: list[int] | int, temperature: float, top_p: float
) -> tuple[list[int], list[int]]:
    """Validate ``generate``'s arguments (shared by every engine).

    Returns (per-prompt token limits, indices of the prompts that generate at all).
    """
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {temperature}, {top_p}")
    n = len(prompts)
    if isinstance(max_new_tokens, int):
        limits = [max_new_tokens] * n
    elif len(max_new_tokens) != n:
        raise ValueError(f"max_new_tokens has {len(max_new_tokens)} entries for {n} prompts")
    else:
        limits = list(max_new_tokens)
    rows = [i for i, limit in enumerate(limits) if limit > 0]
    for i in rows:
        if not prompts[i]:
            raise ValueError(f"prompt {i} is empty")
    return limits, rows


def sample_tokens(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row of float32 ``logits`` [B, V]; return (tokens, their temperature-1 logprobs)."""
    logprobs = torch.log_softmax(logits, dim=-1)
    if temperature == 0:
        tokens = logits.argmax(dim=-1)
    else:
        probs = torch.softmax(logits / temperature, dim=-1)
        if top_p < 1.0:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            # drop a token when the mass strictly before it already reaches top_p (the first always stays)
            drop = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= top_p
            sorted_probs = sorted_probs.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)


@functools.lru_cache(maxsize=8)
def completing_tokens(tokenizer, stop_strings: tuple[str, ...]) -> frozenset[int] | None:
    """Ids of the tokens that can complete one of ``stop_strings``; None when any token might.

    A stop string is complete when its last character appears, and an ASCII
    character is always spelled whole inside the one token that carries it, so
    only tokens whose text contains some stop string's last character need the
    tail to be decoded: decoding on every token cost more than a decoding step.
    """
    if not stop_strings or any(not s[-1].isascii() for s in stop_strings):
        return None
    last = {s[-1] for s in stop_strings}
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=False)
    return frozenset(i for i, text in enumerate(texts) if any(c in text for c in last))


class StopChecker:
    """Finds a stop string at the end of a growing token sequence, decoding only a short tail.

    A stop string is found the step its last character appears, so checking the
    decoded text of the last few tokens suffices: ``window`` tokens always cover
    more characters than the longest stop string (a token decodes to at least
    one character, except byte fragments of a multi-byte character, hence the
    slack).
    """

    def __init__(self, tokenizer, stop_strings: Sequence[str]):
        self.tokenizer = tokenizer
        self.stop_strings = [s for s in stop_strings if s]
        self.window = max((len(s) for s in self.stop_strings), default=0) + 4
        self.enders = completing_tokens(tokenizer, tuple(self.stop_strings))

    def hit(self, token_ids: list[int]) -> bool:
        if not self.stop_strings or (self.enders is not None and token_ids[-1] not in self.enders):
            return False
        tail = self.tokenizer.decode(token_ids[-self.window :], skip_special_tokens=False)
        return any(s in tail for s in self.stop_strings)


class TransformersEngine(GenerationEngine):
    """Batched sampling with a transformers causal LM and a KV cache; our own loop.

    Why not ``model.generate``: we need the temperature-1 logprob of every
    sampled token, a per-sequence stop on strings that decode from arbitrary
    token boundaries, and finished sequences leaving the batch so that long
    tails do not pay for short ones. The loop is plain: run the prompts'
    common prefix (system prompt, one-shot example) once and share its KV
    cache, left-pad the rest of each prompt and prefill it (only the last
    position's logits are computed), then one forward per new token on the
    rows still running. Rows that finish are
    dropped from the KV cache once at least ``compact_fraction`` of the cache
    rows are dead (copying the cache costs about as much as a decoding step, so
    compacting on every single finish would not pay).
    """

    def __init__(
        self,
        model_path: str | Path,
        dtype: str = "bfloat16",
        device: str | torch.device = "cpu",
        compact_fraction: float = 0.25,
        min_shared_prefix: int = 16,
        extra_stop_tokens: Sequence[str] = ("<|im_end|>", "<|endoftext|>"),
    ):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model_path = Path(model_path)
        if not model_path.is_dir():
            raise FileNotFoundError(f"policy model folder not found: {model_path}")
        self.device = torch.device(device)
        self.dtype = getattr(torch, dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=self.dtype).to(self.device).eval()
        if getattr(self.model.config, "final_logit_softcapping", None):
            raise ValueError(f"{model_path}: logit soft-capping models are not supported (logits must be lm_head(h))")
        self._refresh_head()
        self.compact_fraction = compact_fraction
        self.min_shared_prefix = min_shared_prefix
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.stop_token_ids = self._stop_token_ids(extra_stop_tokens)
        # Tokens run through the model (reset by the caller at will): prompt/observation tokens
        # prefilled, sampled tokens fed back, padding computed alongside them, and row_tokens:
        # the tokens whose KV each row received (a prefix shared by k rows counts k times)
        self.stats = {"prefill_tokens": 0, "decode_tokens": 0, "padded_tokens": 0, "row_tokens": 0}
        log.info("loaded %s (%s on %s); stop tokens %s", model_path, dtype, device, sorted(self.stop_token_ids))

    def _stop_token_ids(self, extra: Sequence[str]) -> set[int]:
        """EOS ids of the generation config and tokenizer, plus end-of-turn tokens the vocabulary has."""
        ids: set[int] = set()
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        vocab = self.tokenizer.get_vocab()
        ids.update(vocab[t] for t in extra if t in vocab and vocab[t] != self.tokenizer.unk_token_id)
        return ids

    def _refresh_head(self) -> None:
        """A float32 copy of the output projection (see :meth:`_last_logits`)."""
        self.head_weight = self.model.get_output_embeddings().weight.detach().float()
        bias = getattr(self.model.get_output_embeddings(), "bias", None)
        self.head_bias = None if bias is None else bias.detach().float()

    def _last_logits(self, **inputs) -> torch.Tensor:
        """float32 logits at the last position: the decoder in ``dtype``, the output projection in float32.

        bf16 logits of magnitude 16-32 are rounded to steps of 0.125, which alone
        moves logprobs by ~0.04; projecting the last hidden state in float32
        removes that rounding for the cost of one [B, d] x [d, V] float32 matmul.
        """
        hidden = self.model.get_decoder()(**inputs).last_hidden_state[:, -1, :].float()
        logits = hidden @ self.head_weight.T
        return logits if self.head_bias is None else logits + self.head_bias

    def _prefill_shared_prefix(self, prompts: list[list[int]], cache) -> int:
        """Run the prompts' common prefix once and copy its KV to every row; return its length.

        In a rollout every prompt starts with the same system prompt (and
        one-shot example), often most of a first-turn prompt: computing it once
        instead of once per row is the cheapest large prefill saving. At least
        one token of each prompt is left for the batched prefill, which
        produces the first logits.
        """
        n = shared_prefix_length(prompts, self.min_shared_prefix)
        if n == 0:
            return 0
        ids = torch.tensor([prompts[0][:n]], device=self.device)
        pos = torch.arange(n, device=self.device)[None]
        self.model.get_decoder()(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True)
        cache.batch_repeat_interleave(len(prompts))
        self.stats["prefill_tokens"] += n
        return n

    def _prefill_prompts(self, prompts: list[list[int]], cache) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Prefill ``prompts`` into ``cache``: (last logits, attention mask, positions of the fed tokens).

        The common prefix runs once; each remaining suffix is left-padded, so
        padding sits between the shared prefix and the suffix and positions skip it.
        """
        shared = self._prefill_shared_prefix(prompts, cache)
        width = max(len(p) for p in prompts) - shared
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), shared + width), dtype=torch.long)
        mask[:, :shared] = 1
        for r, prompt in enumerate(prompts):
            suffix = prompt[shared:]
            ids[r, width - len(suffix) :] = torch.tensor(suffix)
            mask[r, shared + width - len(suffix) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, shared:]
        logits = self._last_logits(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
        real = sum(len(p) - shared for p in prompts)
        self.stats["prefill_tokens"] += real
        self.stats["row_tokens"] += real + shared * len(prompts)
        self.stats["padded_tokens"] += ids.numel() - real
        return logits, mask, pos

    @torch.inference_mode()
    def run_turns(
        self, prompts: list[list[int]], on_turn_end: TurnEnd, settings: TurnSettings,
        stop_strings: Sequence[str] = (), seed: int = 0,
    ) -> None:
        """Continuous batching with each episode's KV cache kept across turns (see :mod:`.continuous`)."""
        from agent_r1.rollout.continuous import ContinuousBatcher

        gen = torch.Generator(device=self.device)
        gen.manual_seed(random.Random(seed).getrandbits(63))
        ContinuousBatcher(self, settings, stop_strings, gen).run(prompts, on_turn_end)

    def _expected_weights(self) -> tuple[set[str], set[str]]:
        """Every ``state_dict`` entry; a tied ``lm_head.weight`` is optional (it is the embedding)."""
        tied = {"lm_head.weight"} if getattr(self.model.config, "tie_word_embeddings", False) else set()
        return set(self.model.state_dict()) - tied, tied

    def _load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Copy in place (``load_state_dict`` casts dtype/device and refuses a wrong shape)."""
        self.model.load_state_dict(dict(weights), strict=False)  # strict=False: a bucket is a subset

    def _finish_weight_sync(self) -> None:
        self._refresh_head()  # the float32 head copy: once per sync, not per bucket

    def share_weights(self, state_dict: Mapping[str, torch.Tensor]) -> bool:
        """Sample with the trainer's own weight tensors instead of a copy, when every parameter has
        its tensor there in this engine's dtype, device and shape: the optimizer's in-place updates
        are then what the next rollout sees, and the engine holds no weights of its own. Returns
        False, changing nothing, when they do not match (then :meth:`update_weights` copies)."""
        params = dict(self.model.named_parameters())  # a tied head appears once, as the embedding
        for name, param in params.items():
            given = state_dict.get(name)
            if given is None or given.dtype != param.dtype or given.device != param.device or given.shape != param.shape:
                return False
        for name, param in params.items():
            param.data = state_dict[name]
        self._refresh_head()
        return True

    @torch.inference_mode()
    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: list[int] | int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop_strings: Sequence[str] = (),
        seed: int | None = None,
    ) -> list[GenerationOutput]:
        from transformers import DynamicCache

        limits, rows = check_generate_args(prompts, max_new_tokens, temperature, top_p)
        outs = [GenerationOutput([], [], "length") for _ in prompts]
        # rows: the prompt index of each cache row
        if not rows:
            return outs
        gen = torch.Generator(device=self.device)
        gen.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, (1,)).item()))
        stops = StopChecker(self.tokenizer, stop_strings)

        cache = DynamicCache(config=self.model.config)
        logits, mask, pos = self._prefill_prompts([prompts[i] for i in rows], cache)
        last_pos = pos[:, -1:]
        alive = [True] * len(rows)
        while True:
            tokens, lps = sample_tokens(logits, temperature, top_p, gen)
            tokens_l, lps_l = tokens.tolist(), lps.tolist()
            for r, i in enumerate(rows):
                if not alive[r]:
                    continue
                o = outs[i]
                o.token_ids.append(tokens_l[r])
                o.logprobs.append(lps_l[r])
                if tokens_l[r] in self.stop_token_ids or stops.hit(o.token_ids):
                    o.finish_reason, alive[r] = "stop", False
                elif len(o.token_ids) >= limits[i]:
                    alive[r] = False
            n_alive = sum(alive)
            if n_alive == 0:
                break
            if len(rows) - n_alive >= max(1, self.compact_fraction * len(rows)):
                keep = torch.tensor([r for r in range(len(rows)) if alive[r]], device=self.device)
                cache.batch_select_indices(keep)
                tokens, mask, last_pos = tokens[keep], mask[keep], last_pos[keep]
                rows = [rows[r] for r in keep.tolist()]
                alive = [True] * len(rows)
            mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
            last_pos = last_pos + 1
            self.stats["decode_tokens"] += sum(alive)
            self.stats["row_tokens"] += sum(alive)
            self.stats["padded_tokens"] += len(alive) - sum(alive)
            logits = self._last_logits(
                input_ids=tokens[:, None],
                attention_mask=mask,
                position_ids=last_pos,
                past_key_values=cache,
                use_cache=True,
            )
        return outs
