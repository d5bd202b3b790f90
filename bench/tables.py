"""The printed tables of the update benchmark: one actor update's throughput, and its peak memory."""

from __future__ import annotations

from typing import Any


def fmt(v: Any, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float)) else str(v if v is not None else "-")


def cell(r: dict, key: str, spec: str, killed: str = "> {} MiB") -> str:
    """A measurement's ``key``, or what became of its worker: killed above the memory cap, or failed."""
    if "killed_above_mib" in r:
        return killed.format(r["killed_above_mib"])
    return "failed" if "error" in r else fmt(r.get(key), spec)


THROUGHPUT_COLUMNS = (("ours", "ours (packed)"), ("ours_padded", "ours, padded"), ("naive", "plain torch"))


def format_throughput(t: dict) -> str:
    """The update table: ours (the default, packed), ours on the padded path it replaced, plain torch."""
    cols = [(label, t[key]) for key, label in THROUGHPUT_COLUMNS if key in t]
    ref = next((r for _, r in cols if "batch" in r), None)
    if ref is None:
        return "\n== update throughput ==\n" + "\n".join(f"{label}: {r}" for label, r in cols)
    b = ref["batch"]
    lines = [f"\n== one actor update: {b['rows']} trajectories, {b['tokens']:,} tokens "
             f"({b['loss_tokens'] / b['tokens']:.1%} under the loss mask), longest {b['padded_width']} ==",
             f"{'':30s}" + "".join(f"{label:>17s}" for label, _ in cols)]  # fmt: skip

    rows = [("micro-batches", "mb", ""), ("tokens computed (w/ padding)", "computed", ","),
            ("padding share", "padding_share", ".1%"),
            ("update s (median)", "update_s", ".1f"), ("  of which optimizer step s", "optimizer_step_s", ".1f"),
            ("warm-up update s", "warmup_s", ".1f"), ("tokens/s", "tokens_per_s", ".1f"),
            ("GFLOP/s, 6N+attn per token", "palm_gflops", ".1f"), ("MFU vs bf16 matmul", "mfu_vs_bf16", ".1%"),
            ("MFU vs fp32 matmul", "mfu_vs_fp32", ".1%"), ("needed GFLOP/s (head@loss)", "needed_gflops", ".1f"),
            ("  vs bf16 matmul", "needed_vs_bf16", ".1%"), ("executed GFLOP/s", "executed_gflops", ".1f"),
            ("  vs bf16 matmul", "executed_vs_bf16", ".1%"), ("ru_maxrss MiB", "ru_maxrss_mib", "")]  # fmt: skip
    plan = lambda r: r.get("plan") or {}  # noqa: E731
    shown = []
    for _, r in cols:
        size = f"budget {r.get('micro_batch_tokens')}" if r.get("method") == "ours" else f"{r.get('micro_rows')} rows"
        shown.append({**r, "mb": f"{plan(r).get('micro_batches')} ({size})", "computed": plan(r).get("computed_tokens"),
                      "padding_share": plan(r).get("padding_share")})  # fmt: skip
    for label, key, spec in rows:
        lines.append(f"{label:30s}" + "".join(f"{cell(r, key, spec):>17s}" for r in shown))
    for key, label in (("speedup_tokens_per_s", "ours vs plain torch (tokens/s)"),
                       ("packed_vs_padded", "packed vs padded (update s)")):  # fmt: skip
        if t.get(key):
            lines.append(f"{label:34s}{t[key]:>13.2f}x")
    return "\n".join(lines)


def format_memory(rows: list[dict]) -> str:
    lines = ["\n== peak memory of one update (fresh process each) ==",
             f"{'rows':>5}{'tokens':>8}{'ours ru_maxrss':>16}{'naive ru_maxrss':>17}{'ratio':>8}"
             f"{'ours update+':>14}{'naive update+':>15}{'ratio':>8}"]  # fmt: skip

    def mib(r: dict, key: str) -> str:
        return cell(r, key, "", killed=">{}")

    for row in rows:
        o, n = row["ours"], row["naive"]
        tokens = (o.get("batch") or n.get("batch") or {}).get("tokens")
        at_least = row.get("ratio_ru_maxrss_at_least")
        ratio = f">{at_least:.2f}" if at_least else fmt(row.get("ratio_ru_maxrss"), ".2f")
        lines.append(f"{row['rows']:>5}{fmt(tokens, ',')!s:>8}{mib(o, 'ru_maxrss_mib'):>16}{mib(n, 'ru_maxrss_mib'):>17}"
                     f"{ratio:>8}{mib(o, 'update_peak_above_loaded_mib'):>14}"
                     f"{mib(n, 'update_peak_above_loaded_mib'):>15}{fmt(row.get('ratio_update_peak'), '.2f'):>8}")  # fmt: skip
    lines.append("  MiB; ratio = naive / ours; update+ = the update's peak above the loaded model")
    return "\n".join(lines)
