"""``reports/results.md``: a table shaped like the paper's Table 3 (methods x
data sources, EM, with in-domain / out-of-domain averages) and a bar chart.

Every number comes from a ``metrics/eval/<method>.json`` that DVC tracks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent_r1.io import atomic_path, write_text

DISPLAY = {"naive_rag": "Naive RAG", "base_tool_call": "Base Tool Call"}
BASELINE_ORDER = ("naive_rag", "base_tool_call")


def load_results(eval_dir: Path) -> dict[str, dict[str, Any]]:
    results = {p.stem: json.loads(p.read_text()) for p in sorted(eval_dir.glob("*.json"))}
    order = [m for m in BASELINE_ORDER if m in results] + sorted(set(results) - set(BASELINE_ORDER))
    return {m: results[m] for m in order}


def _avg(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def results_table(
    results: dict[str, dict[str, Any]], in_domain: list[str], metric: str = "em"
) -> tuple[list[str], list[list[str]]]:
    """Rows of ``method | source... | in-domain avg | out-of-domain avg | avg``."""
    sources = sorted({s for r in results.values() for s in r["by_source"]}, key=lambda s: (s not in in_domain, s))
    header = ["Method", *sources, "In-domain avg", "Out-of-domain avg", "Avg"]
    rows = []
    for method, r in results.items():
        per = {s: r["by_source"][s][metric] for s in sources if s in r["by_source"]}
        ind = _avg([v for s, v in per.items() if s in in_domain])
        ood = _avg([v for s, v in per.items() if s not in in_domain])
        cells = [f"{per[s]:.4f}" if s in per else "–" for s in sources]
        avgs = [f"{v:.4f}" if v is not None else "–" for v in (ind, ood, _avg(list(per.values())))]
        rows.append([DISPLAY.get(method, method), *cells, *avgs])
    return header, rows


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def bar_chart(results: dict[str, dict[str, Any]], in_domain: list[str], out_png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    sources = sorted({s for r in results.values() for s in r["by_source"]}, key=lambda s: (s not in in_domain, s))
    methods = list(results)
    width = 0.8 / max(len(methods), 1)
    fig, ax = plt.subplots(figsize=(2.2 + 1.6 * len(sources) + 0.3 * len(methods), 4))
    x = np.arange(len(sources))
    for i, m in enumerate(methods):
        ems = [results[m]["by_source"].get(s, {}).get("em", 0.0) for s in sources]
        bars = ax.bar(x + (i - (len(methods) - 1) / 2) * width, ems, width, label=DISPLAY.get(m, m))
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks(x, [f"{s}\n({'in' if s in in_domain else 'out-of'}-domain)" for s in sources])
    ax.set_ylabel("exact match (greedy)")
    ax.set_ylim(0, 1)
    ax.set_title("Held-out EM by data source")
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


CURVES = (
    ("train/reward", "training reward (mean per trajectory)"),
    ("train/answer_rate", "answer rate (training rollouts)"),
    ("eval/em", "held-out EM (greedy)"),
)


def read_curve(tsv: Path) -> tuple[list[int], list[float]]:
    """A dvclive metric file (``[timestamp,] step, <name>``) as (steps, values)."""
    lines = tsv.read_text().splitlines()
    header = lines[0].split("\t")
    at_step = header.index("step")
    steps, values = [], []
    for line in lines[1:]:
        cols = line.split("\t")
        steps.append(int(cols[at_step]))
        values.append(float(cols[-1]))
    return steps, values


def training_curves(live_dir: Path, out_png: Path) -> list[str]:
    """One panel per metric of CURVES, one line per experiment (dvclive/<experiment>/)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    experiments = sorted(p for p in live_dir.glob("*") if (p / "plots" / "metrics").is_dir()) if live_dir.is_dir() else []
    fig, axes = plt.subplots(1, len(CURVES), figsize=(5 * len(CURVES), 3.6))
    for ax, (metric, title) in zip(axes, CURVES):
        for exp in experiments:
            tsv = exp / "plots" / "metrics" / f"{metric}.tsv"
            if tsv.exists():
                steps, values = read_curve(tsv)
                ax.plot([s + 1 for s in steps], values, marker="o", markersize=3, label=exp.name)
        ax.set_title(title)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    if experiments:
        axes[0].legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return [e.name for e in experiments]


def write_report(
    eval_dir: Path, in_domain: list[str], out_md: Path, out_png: Path, extra_sections: tuple[str, ...] = ()
) -> str:
    results = load_results(eval_dir)
    if not results:
        raise FileNotFoundError(f"no metrics in {eval_dir}: run the baselines/evaluate stages first")
    em_header, em_rows = results_table(results, in_domain, "em")
    f1_header, f1_rows = results_table(results, in_domain, "f1")
    detail = ["| Method | n | answer rate | turns | tool calls | invalid-call rate |", "|---|---|---|---|---|---|"]
    for m, r in results.items():
        detail.append(
            f"| {DISPLAY.get(m, m)} | {r['n']} | {r.get('answer_rate', 1.0):.3f} | {r.get('mean_turns', 1):.2f} "
            f"| {r.get('mean_tool_calls', 0):.2f} | {r.get('invalid_call_rate', 0):.3f} |"
        )
    text = "\n\n".join(
        [
            "# Results",
            "Held-out exact match (greedy decoding), shaped like Table 3 of Agent-R1. "
            f"In-domain sources: {', '.join(in_domain) or '–'}; the others are out-of-domain. "
            f"Every number comes from `{eval_dir}/<method>.json`.",
            "## Exact match",
            markdown_table(em_header, em_rows),
            f"![EM by source]({out_png.name})",
            "## F1",
            markdown_table(f1_header, f1_rows),
            "## Behaviour",
            "\n".join(detail),
            *extra_sections,
        ]
    )
    bar_chart(results, in_domain, out_png)
    write_text(out_md, text + "\n")
    return text
