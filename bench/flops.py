"""FLOP counts of one actor update, and the machine's matmul ceiling they are compared with.

Utilisation is FLOP/s over the best bf16 (and fp32) matmul rate, three ways
(:func:`update_flops`): MFU with PaLM's model FLOPs, the FLOPs the loss needs,
and the FLOPs each method executes.
"""

from __future__ import annotations

import statistics
import time
from typing import Any


def matmul_gflops(n: int, reps: int) -> dict:
    """Best and median GFLOP/s of an n x n x n ``torch.matmul``, bf16 and fp32, on this process's threads."""
    import torch

    out = {"n": n, "threads": torch.get_num_threads()}
    for dtype in (torch.bfloat16, torch.float32):
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        torch.matmul(a, b)  # warm-up
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            torch.matmul(a, b)
            times.append(time.perf_counter() - t0)
        name = str(dtype).removeprefix("torch.")
        out[name] = {"best_gflops": 2 * n**3 / min(times) / 1e9, "median_gflops": 2 * n**3 / statistics.median(times) / 1e9}
    return out


def model_shape(model: Any) -> dict:
    """What the FLOP count needs: matmul parameters and attention width."""
    cfg = model.config
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is emb
    n_params = sum(p.numel() for p in model.parameters())
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return {
        "n_params": n_params, "n_matmul": n_params if tied else n_params - emb.numel(), "tied_head": tied,
        "vocab": emb.shape[0], "hidden": cfg.hidden_size, "layers": cfg.num_hidden_layers,
        "d_attn": cfg.num_attention_heads * head_dim,
    }  # fmt: skip


def update_flops(r: dict) -> dict:
    """FLOPs of one update, three ways (matmuls only; LM head = vocab x hidden per position).

    * ``palm_flops``: PaLM's model FLOPs, 6N per real token + attention (12 * layers *
      d_attn * T per token), as if the head ran on every token;
    * ``needed_flops``: what the loss needs: the backbone on every real token, the head
      only on the positions the loss reads (forward + backward: 6 * V * d each);
    * ``executed_flops``: what the method runs: its micro-batches' padding included; ours
      runs the head on the loss positions (on every position without ``score_mask``)
      once more in the backward (its chunks are activation-checkpointed); either one
      recomputes the backbone forward under ``train.gradient_checkpointing``.
    """
    s, b, plan = r["shape"], r["batch"], r["plan"]
    head = s["vocab"] * s["hidden"]
    backbone = s["n_matmul"] - head
    attn = 12 * s["layers"] * s["d_attn"]
    palm = 6 * s["n_matmul"] * b["tokens"] + attn * b["sum_len_sq"]
    needed = 6 * backbone * b["tokens"] + attn * b["sum_len_sq"] + 6 * head * b["loss_tokens"]
    executed = 6 * backbone * plan["computed_tokens"] + attn * plan["computed_len_sq"]
    if r["method"] == "ours":
        positions = b["loss_tokens"] if r.get("head_on_loss_tokens_only") else b["scored_tokens"]
        executed += 8 * head * positions  # forward, recomputed forward, backward
    else:
        executed += 6 * head * plan["computed_tokens"]
    if r.get("gradient_checkpointing"):
        executed += 2 * backbone * plan["computed_tokens"] + attn // 3 * plan["computed_len_sq"]
    return {"palm_flops": palm, "needed_flops": needed, "executed_flops": executed}


def throughput_row(r: dict, ceiling: dict) -> dict:
    """Adds FLOP/s and utilisations (vs the best bf16 and fp32 matmul rates)."""
    if "update_s" not in r:
        return r
    f = update_flops(r)
    bf16, fp32 = ceiling["bfloat16"]["best_gflops"] * 1e9, ceiling["float32"]["best_gflops"] * 1e9
    palm, needed, executed = (f[k] / r["update_s"] for k in ("palm_flops", "needed_flops", "executed_flops"))
    return {**r, **f, "palm_gflops": palm / 1e9, "mfu_vs_bf16": palm / bf16, "mfu_vs_fp32": palm / fp32,
            "needed_gflops": needed / 1e9, "needed_vs_bf16": needed / bf16,
            "executed_gflops": executed / 1e9, "executed_vs_bf16": executed / bf16}  # fmt: skip


def format_ceiling(c: dict) -> str:
    return (f"\n== matmul ceiling ({c['n']}^3, {c['threads']} threads) ==\n"
            f"bf16 {c['bfloat16']['best_gflops']:8.1f} GFLOP/s best ({c['bfloat16']['median_gflops']:.1f} median)\n"
            f"fp32 {c['float32']['best_gflops']:8.1f} GFLOP/s best ({c['float32']['median_gflops']:.1f} median)")  # fmt: skip
