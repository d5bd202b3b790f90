"""TransformersEngine (``rollout.engine: transformers``): our own decoding loop on a transformers causal LM.

It follows the engine contract of :mod:`agent_r1.rollout.engine` (token ids in,
token ids and their temperature-1 logprobs out, weights loaded in memory). Its
turn session (:meth:`TransformersEngine.open_turns`) is the continuous batcher
of :mod:`agent_r1.rollout.continuous`, which keeps each episode's KV cache
across turns; it drives the model through this engine's public attributes and
:meth:`TransformersEngine.last_logits`.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from agent_r1.rollout.decoding import (
    StopChecker, check_generate_args, end_token_ids, sample_tokens, shared_prefix_length,
)
from agent_r1.rollout.engine import GenerationEngine, GenerationOutput, TurnSession, TurnSettings

log = logging.getLogger(__name__)


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
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        self.stop_token_ids = end_token_ids(eos, self.tokenizer, extra_stop_tokens)
        # Tokens run through the model (reset by the caller at will): prompt/observation tokens
        # prefilled, sampled tokens fed back, padding computed alongside them, and row_tokens:
        # the tokens whose KV each row received (a prefix shared by k rows counts k times)
        self.stats = {"prefill_tokens": 0, "decode_tokens": 0, "padded_tokens": 0, "row_tokens": 0}
        log.info("loaded %s (%s on %s); stop tokens %s", model_path, dtype, device, sorted(self.stop_token_ids))

    def _refresh_head(self) -> None:
        """A float32 copy of the output projection (see :meth:`last_logits`)."""
        self.head_weight = self.model.get_output_embeddings().weight.detach().float()
        bias = getattr(self.model.get_output_embeddings(), "bias", None)
        self.head_bias = None if bias is None else bias.detach().float()

    def last_logits(self, **inputs) -> torch.Tensor:
        """float32 logits at the last position of a decoder forward on ``inputs`` (ids, mask,
        positions, cache): the decoder in ``dtype``, the output projection in float32.

        bf16 logits of magnitude 16-32 are rounded to steps of 0.125, which alone
        moves logprobs by ~0.04; projecting the last hidden state in float32
        removes that rounding for the cost of one [B, d] x [d, V] float32 matmul.
        """
        hidden = self.model.get_decoder()(**inputs).last_hidden_state[:, -1, :].float()
        logits = hidden @ self.head_weight.T
        return logits if self.head_bias is None else logits + self.head_bias

    # ------------------------------------------------------------ turns
    def open_turns(self, settings: TurnSettings, stop_strings: Sequence[str] = (), seed: int = 0) -> TurnSession:
        """Continuous batching with each episode's KV cache kept across turns (see :mod:`.continuous`)."""
        from agent_r1.rollout.continuous import ContinuousSession  # loads transformers' cache classes

        gen = torch.Generator(device=self.device)
        gen.manual_seed(random.Random(seed).getrandbits(63))
        return ContinuousSession(self, settings, stop_strings, gen)

    # ------------------------------------------------------------ weights
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

    # ------------------------------------------------------------ generate
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
        logits = self.last_logits(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
        real = sum(len(p) - shared for p in prompts)
        self.stats["prefill_tokens"] += real
        self.stats["row_tokens"] += real + shared * len(prompts)
        self.stats["padded_tokens"] += ids.numel() - real
        return logits, mask, pos

    def _take_samples(
        self, tokens: torch.Tensor, lps: torch.Tensor, rows: list[int], alive: list[bool],
        outs: list[GenerationOutput], limits: list[int], stops: StopChecker,
    ) -> None:
        """Append each alive row's sampled token to its output; a row whose turn stopped or hit its limit dies."""
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
            self._take_samples(tokens, lps, rows, alive, outs, limits, stops)
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
            logits = self.last_logits(
                input_ids=tokens[:, None], attention_mask=mask, position_ids=last_pos, past_key_values=cache, use_cache=True,
            )
        return outs
