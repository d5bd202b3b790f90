"""Peak memory of token log-probs: chunked (agent_r1.training.logprobs) vs the naive
full float32 log-softmax, on the real policy. A measurement, not a test.

    .venv/bin/python tests/scripts/logprob_memory.py [--model models/policy] [--batch 8] [--seq 1024]

Each (method, grad) pair runs in a fresh subprocess; the peak resident set
(VmHWM, reset through /proc/self/clear_refs after the model is loaded) minus
the resident set at that point is reported in MiB.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def measure(model_dir: str, method: str, grad: bool, batch: int, seq: int, dtype: str) -> dict:
    import torch

    from agent_r1.training.logprobs import token_logprobs
    from agent_r1.training.models import load_policy

    torch.manual_seed(0)
    model = load_policy(model_dir, dtype, gradient_checkpointing=True).train()
    ids = torch.randint(0, model.config.vocab_size, (batch, seq))
    mask = torch.ones_like(ids)
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
    base = _rss_kib("VmRSS")
    start = time.perf_counter()
    with torch.set_grad_enabled(grad):
        if method == "chunked":
            lp = token_logprobs(model, ids, mask, chunk_tokens=1024)
        else:
            logits = model(input_ids=ids, attention_mask=mask).logits.float()
            lp = torch.log_softmax(logits, -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
        if grad:
            (-lp.sum()).backward()
    seconds = time.perf_counter() - start
    peak = _rss_kib("VmHWM")
    return {"method": method, "grad": grad, "dtype": dtype, "shape": [batch, seq],
            "peak_delta_mib": round((peak - base) / 1024), "seconds": round(seconds, 1)}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="models/policy")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--one", nargs=2, metavar=("METHOD", "GRAD"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure(args.model, args.one[0], args.one[1] == "1", args.batch, args.seq, args.dtype)))
        return
    for grad in ("0", "1"):
        for method in ("chunked", "naive"):
            cmd = [sys.executable, __file__, "--model", args.model, "--batch", str(args.batch), "--seq", str(args.seq),
                   "--dtype", args.dtype, "--one", method, grad]  # fmt: skip
            out = subprocess.run(cmd, capture_output=True, text=True)
            print(out.stdout.strip().splitlines()[-1] if out.returncode == 0 else f"{method} grad={grad}: rc {out.returncode} {out.stderr[-500:]}", flush=True)


if __name__ == "__main__":
    main()
