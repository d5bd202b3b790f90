"""Portable numerics: does a training step come out bit-identical on another CPU model?

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

    .venv/bin/python bench/portable_numerics.py [--cpus EPYC-Milan Haswell-v4 ...] [--no-cost]

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
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_CPUS = ("EPYC-Milan",)  # AMD Zen 3: another vendor, AVX2 and no AVX-512
RESULT = REPO / "bench" / "results" / "portable_numerics.json"


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


def run_worker(env: dict[str, str], cpu: str | None, model_dir: str | None = None) -> dict:
    """:func:`step_hash` in a fresh process with ``env`` (natively, or emulating ``cpu``)."""
    cmd = [sys.executable, __file__, "--worker"] + (["--model", model_dir] if model_dir else [])
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
    runs = {name: run_worker(settings()[name], None, str(model_dir)) for name in ("default", "portable")}
    return {**{n: round(r["seconds"], 1) for n, r in runs.items()},
            "ratio": round(runs["portable"]["seconds"] / runs["default"]["seconds"], 2)}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", default=None, help=argparse.SUPPRESS)
    p.add_argument("--cpus", nargs="*", default=list(DEFAULT_CPUS), help="qemu -cpu names to emulate")
    p.add_argument("--no-cost", dest="cost", action="store_false", help="skip the timing on models/policy")
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(step_hash(args.model)))
        return
    if args.cpus and shutil.which("qemu-x86_64") is None:
        sys.exit("qemu-x86_64 not found (Debian: apt-get install qemu-user), or pass --cpus with no names")
    from bench.rl_step import machine

    print("== the same training step's weights (sha256), per setting and CPU ==", flush=True)
    table = hashes(args.cpus)
    portable = {name: len({r["sha256"] for r in row.values()}) == 1 for name, row in table.items()}
    for name, same in portable.items():
        print(f"{name:>20}: {'the same on every CPU' if same else 'differs across CPUs'}")
    result = {"machine": machine(), "emulated_cpus": args.cpus, "hashes": table, "portable": portable}
    policy = REPO / "models" / "policy"
    if args.cost and policy.is_dir():
        result["cost_seconds"] = cost(policy)
        c = result["cost_seconds"]
        print(f"\n== two AdamW steps on {policy.name}, 4 x 256 tokens, natively ==\n"
              f"default {c['default']} s, portable {c['portable']} s: x{c['ratio']}")
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"-> {RESULT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
