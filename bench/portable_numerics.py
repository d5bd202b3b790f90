"""Portable numerics: do a training step and the dense index's embeddings come out
bit-identical on another CPU model?

The index and sft stages run under ``PORTABLE_CPU_NUMERICS`` (agent_r1/stages/common.py)
so that the indexes and the warm start, which every trained run is keyed on, have the
same bytes whichever x86-64 CPU rebuilt them. This benchmark checks that on CPUs this
machine does not have: the same step (a tiny random Llama, forward + backward + fused
AdamW, twice) runs natively and under qemu-x86_64 user-mode emulation with another CPU's
CPUID. MKL and PyTorch choose their kernels from CPUID, so under emulation they take the
path they would take on that CPU; the arithmetic itself is IEEE either way.

Each setting is run on every CPU; a setting is portable when all its hashes agree. The
default setting should differ across CPUs (else the check shows nothing), the portable
one should not. Unless ``--no-cost``, it also times the step on the real policy
(``models/policy``) with and without the pinning, natively: what the pinned stages pay.

The encoder check (unless ``--no-encoder``; needs ``models/encoder`` and the prepared
corpus) does the same for ``agent_r1.retrieval.dense.encode`` on the corpus's first
``--encoder-texts`` documents, in batches of 8. Natively it also shows why that function
makes its own batches: ``SentenceTransformer.encode`` batches by ``np.argsort``, whose
order of equal lengths depends on numpy's SIMD (here AVX-512, capped to AVX2 with
``NPY_DISABLE_CPU_FEATURES`` as on an AVX2 CPU), and an embedding's bits depend on its
batch. (Under qemu, numpy's AVX2 argsort segfaults once sentence-transformers is imported,
an emulator problem, so that path is compared natively only.) The cost part also times
the encoding of the whole corpus natively.

    .venv/bin/python bench/portable_numerics.py [--cpus EPYC-Milan Haswell-v4 ...] [--no-cost] [--no-encoder]

Needs ``qemu-x86_64`` (Debian: qemu-user) for the emulated CPUs; each emulated run takes
minutes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_CPUS = ("EPYC-Milan",)  # AMD Zen 3: another vendor, AVX2 and no AVX-512
RESULT = REPO / "bench" / "results" / "portable_numerics.json"
ENCODER = REPO / "models" / "encoder"
ENCODER_BATCH = 8  # a few batches even over the emulated runs' few texts
# numpy's SIMD dispatch capped to what an AVX2 CPU gets (NPY_DISABLE_CPU_FEATURES names)
NUMPY_AVX2 = {"NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR"}


def settings() -> dict[str, dict[str, str]]:
    """The environments compared (imported here: the emulated workers skip agent_r1's imports)."""
    from agent_r1.stages.common import PORTABLE_CPU_NUMERICS

    # MKL's AVX2 branch is documented as Intel-only: on AMD it falls back to the CPU's own
    return {"portable": PORTABLE_CPU_NUMERICS, "default": {},
            "MKL_CBWR=AVX2": {**PORTABLE_CPU_NUMERICS, "MKL_CBWR": "AVX2"}}  # fmt: skip


def step_hash(model_dir: str | None, steps: int = 2) -> dict:
    """Train ``steps`` AdamW steps on a fixed batch; the sha256 of the weights after them."""
    import torch

    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if model_dir is None:  # small enough to run under emulation in minutes; no deepspeed import
        cfg = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
        model, vocab, shape = LlamaForCausalLM(cfg), 512, (4, 96)
    else:
        model, vocab, shape = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), 1000, (4, 256)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    ids = torch.randint(0, vocab, shape)
    start = time.perf_counter()
    for _ in range(steps):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    seconds = time.perf_counter() - start
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    return {"sha256": digest[:16], "capability": torch.backends.cpu.get_cpu_capability(), "seconds": seconds}


def encoder_hash(texts_file: str, batch_size: int, st_encode: bool = False) -> dict:
    """The sha256 of the embeddings of the texts in ``texts_file`` (a JSON list) by
    ``dense.encode``, or by ``SentenceTransformer.encode`` (``st_encode``: its own batching)."""
    import numpy as np
    import torch

    from agent_r1.config import EncoderConfig
    from agent_r1.retrieval.dense import encode, load_encoder

    texts = json.loads(Path(texts_file).read_text())
    model = load_encoder(ENCODER, EncoderConfig().max_seq_length)
    start = time.perf_counter()
    if st_encode:
        emb = model.encode(texts, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True)
    else:
        emb = encode(model, texts, batch_size)
    seconds = time.perf_counter() - start
    digest = hashlib.sha256(np.ascontiguousarray(emb, dtype=np.float32).tobytes()).hexdigest()
    return {"sha256": digest[:16], "capability": torch.backends.cpu.get_cpu_capability(), "seconds": seconds}


def run_worker(env: dict[str, str], cpu: str | None, *worker_args: str) -> dict:
    """A worker (:func:`step_hash`, or :func:`encoder_hash` with ``--encoder``) in a fresh
    process with ``env`` (natively, or emulating ``cpu``)."""
    cmd = [sys.executable, __file__, "--worker", *worker_args]
    if cpu is not None:
        cmd = ["qemu-x86_64", "-cpu", cpu, *cmd]
    pinned = set(settings()["portable"])
    full_env = {**{k: v for k, v in os.environ.items() if k not in pinned}, **env}
    out = subprocess.run(cmd, env=full_env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def hashes(cpus: list[str]) -> dict[str, dict[str, dict]]:
    """{setting: {cpu: worker result}}, the native CPU as ``native``."""
    table: dict[str, dict[str, dict]] = {}
    for name, env in settings().items():
        table[name] = {}
        for cpu in [None, *cpus]:
            r = table[name][cpu or "native"] = run_worker(env, cpu)
            print(f"  {name:>20} on {cpu or 'native':<12} {r['capability']:<7} {r['sha256']}", flush=True)
    return table


def cost(model_dir: Path) -> dict:
    """Seconds of two AdamW steps on the real policy, natively, default vs portable."""
    runs = {name: run_worker(settings()[name], None, "--model", str(model_dir)) for name in ("default", "portable")}
    return {**{n: round(r["seconds"], 1) for n, r in runs.items()},
            "ratio": round(runs["portable"]["seconds"] / runs["default"]["seconds"], 2)}  # fmt: skip


def corpus_texts(n: int | None, folder: Path) -> tuple[Path, dict]:
    """The first ``n`` (None: all) documents of the prepared corpus as the dense index
    embeds them, in a JSON file for the workers; and what they are."""
    from agent_r1 import paths
    from agent_r1.data.schema import read_corpus
    from agent_r1.retrieval import doc_strings

    texts = doc_strings(read_corpus(paths.CORPUS))[:n]
    file = folder / f"texts-{len(texts)}.json"
    file.write_text(json.dumps(texts))
    return file, {"corpus": str(paths.CORPUS), "texts": len(texts),
                  "texts_sha256": hashlib.sha256(file.read_bytes()).hexdigest()[:16]}  # fmt: skip


def encoder_check(cpus: list[str], n_texts: int, folder: Path) -> dict:
    """The embeddings' hashes per setting (portable, default) and CPU; and, natively, those of
    ``SentenceTransformer.encode`` vs ``dense.encode`` with numpy's SIMD at AVX-512 vs AVX2."""
    file, result = corpus_texts(n_texts, folder)
    args = ["--encoder", str(file), "--batch-size", str(ENCODER_BATCH)]
    table: dict[str, dict[str, dict]] = {}
    for name in ("portable", "default"):
        table[name] = {}
        for cpu in [None, *cpus]:
            r = table[name][cpu or "native"] = run_worker(settings()[name], cpu, *args)
            print(f"  {name:>20} on {cpu or 'native':<12} {r['capability']:<7} {r['sha256']}", flush=True)
    # the cause, natively: sentence-transformers' batches follow numpy's (unstable, SIMD) argsort
    big, sort_info = corpus_texts(512, folder)  # enough ties at the batch edges to show it
    sort: dict[str, dict[str, str]] = {}
    for fn, extra in (("SentenceTransformer.encode", ["--st-encode"]), ("dense.encode", [])):
        sort[fn] = {}
        for isa, npy in (("numpy AVX-512", {}), ("numpy AVX2", NUMPY_AVX2)):
            env = {**settings()["portable"], **npy}
            sort[fn][isa] = run_worker(env, None, "--encoder", str(big), "--batch-size", "64", *extra)["sha256"]
        print(f"  {fn:>26}, portable, numpy AVX-512 vs AVX2: {sort[fn]}", flush=True)
    return {**result, "batch_size": ENCODER_BATCH, "hashes": table,
            "portable": {name: len({r["sha256"] for r in row.values()}) == 1 for name, row in table.items()},
            "numpy_sort_native": {**sort_info, "batch_size": 64, "sha256": sort}}  # fmt: skip


def encoder_cost(folder: Path) -> dict:
    """Seconds to embed the whole corpus natively (as the index stage does, batch 64):
    dense.encode default vs portable, and SentenceTransformer.encode portable (before the fix)."""
    file, result = corpus_texts(None, folder)
    args = ["--encoder", str(file), "--batch-size", "64"]
    runs = {"default": run_worker(settings()["default"], None, *args),
            "portable": run_worker(settings()["portable"], None, *args),
            "portable, SentenceTransformer.encode": run_worker(settings()["portable"], None, *args, "--st-encode")}
    return {"texts": result["texts"], **{n: round(r["seconds"], 1) for n, r in runs.items()},
            "ratio": round(runs["portable"]["seconds"] / runs["default"]["seconds"], 2)}  # fmt: skip


def described_machine() -> dict:
    """:func:`bench.rl_step.machine`, with the vector ISA the kernels choose from and the versions."""
    import platform

    import numpy
    import sentence_transformers

    from bench.rl_step import machine

    flags = set()
    if platform.system() == "Linux":
        line = next(x for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("flags"))
        flags = set(line.split(":", 1)[1].split())
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile") if f in flags]
    return {**machine(), "isa": isa, "numpy": numpy.__version__,
            "sentence_transformers": sentence_transformers.__version__}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", default=None, help=argparse.SUPPRESS)
    p.add_argument("--encoder", default=None, help=argparse.SUPPRESS)  # the worker embeds this file's texts
    p.add_argument("--batch-size", type=int, default=ENCODER_BATCH, help=argparse.SUPPRESS)
    p.add_argument("--st-encode", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cpus", nargs="*", default=list(DEFAULT_CPUS), help="qemu -cpu names to emulate")
    p.add_argument("--no-cost", dest="cost", action="store_false", help="skip the timings natively")
    p.add_argument("--no-encoder", dest="encoder_check", action="store_false", help="skip the encoder check")
    p.add_argument("--encoder-texts", type=int, default=24, help="documents embedded by the encoder check (emulated: minutes each)")
    args = p.parse_args(argv)
    if args.worker:
        if args.encoder:
            print(json.dumps(encoder_hash(args.encoder, args.batch_size, args.st_encode)))
        else:
            print(json.dumps(step_hash(args.model)))
        return
    if args.cpus and shutil.which("qemu-x86_64") is None:
        sys.exit("qemu-x86_64 not found (Debian: apt-get install qemu-user), or pass --cpus with no names")
    from agent_r1 import paths

    if args.encoder_check and not (ENCODER.is_dir() and paths.CORPUS.is_file()):
        sys.exit(f"the encoder check needs {ENCODER} and {paths.CORPUS} (the pipeline's download and"
                 " prepare stages), or pass --no-encoder")  # fmt: skip

    print("== the same training step's weights (sha256), per setting and CPU ==", flush=True)
    table = hashes(args.cpus)
    portable = {name: len({r["sha256"] for r in row.values()}) == 1 for name, row in table.items()}
    for name, same in portable.items():
        print(f"{name:>20}: {'the same on every CPU' if same else 'differs across CPUs'}")
    result = {"machine": described_machine(), "emulated_cpus": args.cpus, "hashes": table, "portable": portable}
    with tempfile.TemporaryDirectory() as tmp:
        if args.encoder_check:
            print(f"\n== the dense encoder's embeddings of {args.encoder_texts} documents (sha256) ==", flush=True)
            enc = result["encoder"] = encoder_check(args.cpus, args.encoder_texts, Path(tmp))
            for name, same in enc["portable"].items():
                print(f"{name:>20}: {'the same on every CPU' if same else 'differs across CPUs'}")
        policy = REPO / "models" / "policy"
        if args.cost and policy.is_dir():
            result["cost_seconds"] = cost(policy)
            c = result["cost_seconds"]
            print(f"\n== two AdamW steps on {policy.name}, 4 x 256 tokens, natively ==\n"
                  f"default {c['default']} s, portable {c['portable']} s: x{c['ratio']}")
        if args.cost and args.encoder_check:
            c = result["encoder_cost_seconds"] = encoder_cost(Path(tmp))
            print(f"\n== embedding the corpus ({c['texts']} documents), natively ==\n"
                  + ", ".join(f"{k} {v} s" for k, v in c.items() if k != "texts"))
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"-> {RESULT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
