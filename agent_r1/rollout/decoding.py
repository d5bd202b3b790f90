"""Pieces every decoding loop shares: argument checks, token sampling, stop detection, prefixes.

Used by the engines (:mod:`agent_r1.rollout.transformers_engine`,
:mod:`agent_r1.rollout.vllm_engine`) and the continuous batcher
(:mod:`agent_r1.rollout.continuous`), so that each decides the same way which
token is sampled, where a turn stops and which prefix is shared.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch


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
    """Pick one token per row of float32 ``logits`` [B, V]; return (tokens, their logprobs under the
    sampling temperature, before top-p: ``log_softmax(logits / temperature)``, raw logits when greedy)."""
    if temperature == 0:
        tokens = logits.argmax(dim=-1)
        logprobs = torch.log_softmax(logits, dim=-1)
    else:
        logprobs = torch.log_softmax(logits / temperature, dim=-1)
        probs = torch.softmax(logits / temperature, dim=-1)
        if top_p < 1.0:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            # drop a token when the mass strictly before it already reaches top_p (the first always stays)
            drop = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= top_p
            sorted_probs = sorted_probs.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)


def end_token_ids(eos: int | list[int] | None, tokenizer, extra: Sequence[str]) -> set[int]:
    """The ids a turn stops on: the model's EOS id(s) ``eos`` (its generation config's), the
    tokenizer's EOS, and the end-of-turn tokens ``extra`` that the vocabulary has."""
    ids: set[int] = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    vocab = tokenizer.get_vocab()
    ids.update(vocab[t] for t in extra if t in vocab and vocab[t] != tokenizer.unk_token_id)
    return ids


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
