"""``reports/results.md``: a table shaped like the paper's Table 3 (methods x
data sources, EM, with in-domain / out-of-domain averages) and a bar chart;
for a presets file (paper/presets.yaml) also Table 4: each ablation's EM delta
against the run it ablates, beside the paper's.

Every number comes from a ``metrics/eval/<method>.json`` that DVC tracks (the
paper's own numbers come from the presets file and PAPER_BASELINE_EM); the
paired comparisons come from the per-question ``outcomes/<method>.jsonl``.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from agent_r1.evaluation.paired import describe, paired_runs
from agent_r1.evaluation.runs import load_metrics, load_outcome_runs, run_seeds, spread
from agent_r1.io import atomic_path, write_text
from agent_r1.paths import split_seeded

log = logging.getLogger(__name__)

DISPLAY = {"naive_rag": "Naive RAG", "random": "Random legal action", "base_tool_call": "Base Tool Call",
           "sft": "SFT warm start (no RL)"}
# With sft.enabled false the "sft" row is the base model evaluated the way RL starts from it.
NO_WARM_START_LABEL = "Base model, RL prompt (no warm start, no RL)"
BASELINE_ORDER = ("naive_rag", "random", "base_tool_call", "sft")
# A stateful env's episodes have no answer to match: what its em and f1 are (agent_r1.env.agent_env).
STATEFUL_METRICS = ("For this environment EM is the success rate (the episode won) and F1 the score "
                    "(the share of the maximum reached).")
# A paired difference counts as resolved below this p (one table tests dozens of pairs: 0.05 would
# call about one in twenty ties a difference).
RESOLVED_P = 0.01
# Agent-R1 Table 3, average EM of the rows that are not presets (Qwen2.5-3B-Instruct).
PAPER_BASELINE_EM = {"naive_rag": 0.1328, "base_tool_call": 0.0847}


def load_results(
    eval_dir: Path,
    baseline_dir: Path | None = None,
    experiments: tuple[str, ...] | None = None,
    seeds: dict[str, list[int]] | None = None,
) -> dict[str, dict[str, Any]]:
    """``{method: metrics}``: baselines and the warm start first, then ``experiments`` in
    their order (a presets file's: algorithms, then their ablations).

    ``experiments`` is the params' list: a ``<name>.json`` left behind by an experiment
    that was removed or renamed is skipped (with a warning), so a report never shows a
    run the params no longer describe. ``None`` takes every file, by name.
    ``seeds`` (a presets file's, per experiment) reads ``<name>.seed<k>.json`` for each k
    and makes the row their mean (:mod:`agent_r1.evaluation.runs`).
    With ``baseline_dir`` (a presets report), the baselines and the warm start come from
    there and only the experiments from ``eval_dir``.
    """
    seeds = seeds or {}
    found = sorted({split_seeded(p.stem)[0] for p in eval_dir.glob("*.json")})
    wanted = found if experiments is None else list(experiments)
    results = {m: r for m in wanted if (r := load_metrics(eval_dir, m, seeds.get(m))) is not None}
    base = baseline_dir if baseline_dir is not None else eval_dir
    shared = {m: load_metrics(base, m) for m in BASELINE_ORDER}
    results.update({m: r for m, r in shared.items() if r is not None})
    order = [m for m in BASELINE_ORDER if m in results] + [m for m in wanted if m in results and m not in BASELINE_ORDER]
    for stale in sorted(set(found) - set(order) - set(BASELINE_ORDER)):
        log.warning("%s: no experiment %r in params, left out of the report", eval_dir / f"{stale}.json", stale)
    return {m: results[m] for m in order}


def results_rows(
    eval_dir: Path, baseline_dir: Path | None = None, experiments: tuple[str, ...] | None = None,
    seeds: dict[str, list[int]] | None = None,
) -> list[dict[str, Any]]:
    """One flat row per method (EM and F1, overall and per source; means over seeds): the flow's table artifact."""
    rows = []
    for method, r in load_results(eval_dir, baseline_dir, experiments, seeds).items() if eval_dir.is_dir() else ():
        row: dict[str, Any] = {"method": method, "n": r["n"], "em": r["em"], "f1": r["f1"]}
        for source, by in sorted(r.get("by_source", {}).items()):
            row[f"em_{source}"] = by["em"]
        rows.append(row)
    return rows


def _avg(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def average(r: dict[str, Any], metric: str = "em") -> float:
    """The table's "Avg": the mean over data sources (as the paper averages its data sets)."""
    return _avg([by[metric] for by in r["by_source"].values()]) or 0.0


def average_se(r: dict[str, Any]) -> float:
    """Binomial standard error of the average EM over the k data sources:

        SE = sqrt(sum_s p_s (1 - p_s) / n_s) / k

    EM is 0/1 per question, so this is how far "Avg" moves by chance alone with n_s
    questions per source; a difference of a few SEs is what a table this size resolves.
    """
    by = list(r["by_source"].values())
    if not by:
        return 0.0
    return math.sqrt(sum(b["em"] * (1 - b["em"]) / b["n"] for b in by)) / len(by)


def ablation_delta(results: dict[str, dict[str, Any]], method: str, base: str) -> tuple[float, float]:
    """(Δ, SE of Δ): the ablation's average EM minus the full method's, and
    sqrt(SE_a^2 + SE_b^2) with the two runs' held-out scores taken as independent
    (which overstates it a little: both answer the same questions)."""
    a, b = results[method], results[base]
    return average(a) - average(b), math.hypot(average_se(a), average_se(b))


def results_table(
    results: dict[str, dict[str, Any]],
    in_domain: list[str],
    metric: str = "em",
    labels: dict[str, str] | None = None,
    paper_em: dict[str, float] | None = None,
) -> tuple[list[str], list[list[str]]]:
    """Rows of ``method | source... | in-domain avg | out-of-domain avg | avg [| SE [| sd over seeds]] [| paper avg]``
    (for EM the SE of the average, see :func:`average_se`, and when a row has several runs their spread)."""
    labels = {**DISPLAY, **(labels or {})}
    sources = sorted({s for r in results.values() for s in r["by_source"]}, key=lambda s: (s not in in_domain, s))
    header = ["Method", *sources, "In-domain avg", "Out-of-domain avg", "Avg"]
    seeded = metric == "em" and any(r.get("seeds", 1) > 1 for r in results.values())
    if metric == "em":
        header += ["± SE", "sd over seeds"] if seeded else ["± SE"]
    if paper_em:
        header.append("Paper avg (Qwen2.5-3B)")
    rows = []
    for method, r in results.items():
        per = {s: r["by_source"][s][metric] for s in sources if s in r["by_source"]}
        ind = _avg([v for s, v in per.items() if s in in_domain])
        ood = _avg([v for s, v in per.items() if s not in in_domain])
        cells = [f"{per[s]:.4f}" if s in per else "–" for s in sources]
        avgs = [f"{v:.4f}" if v is not None else "–" for v in (ind, ood, _avg(list(per.values())))]
        row = [labels.get(method, method), *cells, *avgs]
        if metric == "em":
            row += [f"{average_se(r):.4f}", spread(r)] if seeded else [f"{average_se(r):.4f}"]
        if paper_em:
            row.append(f"{paper_em[method]:.4f}" if method in paper_em else "–")
        rows.append(row)
    return header, rows


def ablation_table(
    results: dict[str, dict[str, Any]],
    ablation_of: dict[str, str],
    labels: dict[str, str],
    paper_em: dict[str, float],
) -> tuple[list[str], list[list[str]]]:
    """Table 4: each ablation's average EM and its delta against the run it ablates,
    with the delta's standard error (:func:`ablation_delta`), beside the paper's delta where the paper reports both rows."""
    header = ["Ablation", "Of", "Avg EM", "Of: avg EM", "Δ EM", "± SE of Δ", "Paper Δ EM"]
    rows = []
    for method, base in ablation_of.items():
        if method not in results or base not in results:
            continue
        delta, se = ablation_delta(results, method, base)
        paper = f"{paper_em[method] - paper_em[base]:+.4f}" if method in paper_em and base in paper_em else "–"
        rows.append([labels.get(method, method), labels.get(base, base), f"{average(results[method]):.4f}",
                     f"{average(results[base]):.4f}", f"{delta:+.4f}", f"{se:.4f}", paper])
    return header, rows


def ablation_chart(
    results: dict[str, dict[str, Any]], ablation_of: dict[str, str], labels: dict[str, str],
    paper_em: dict[str, float], out_png: Path,
) -> None:
    """Horizontal bars: each ablation's EM delta, ours (with its SE) beside the paper's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    pairs = [(m, b) for m, b in ablation_of.items() if m in results and b in results]
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.45 * max(len(pairs), 1)))
    y = np.arange(len(pairs))
    ours, ses = zip(*(ablation_delta(results, m, b) for m, b in pairs)) if pairs else ((), ())
    paper = [paper_em[m] - paper_em[b] if m in paper_em and b in paper_em else np.nan for m, b in pairs]
    ax.barh(y - 0.2, ours, 0.4, xerr=ses, capsize=3, label="ours (CPU world), ± 1 SE")
    ax.barh(y + 0.2, paper, 0.4, label="paper (Qwen2.5-3B)")
    ax.set_yticks(y, [labels.get(m, m) for m, _ in pairs], fontsize=8)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel("Δ average EM vs the full method")
    ax.set_title("Ablations")
    ax.legend(fontsize=8)
    ax.invert_yaxis()
    fig.tight_layout()
    save_png(fig, out_png, dpi=110, tight=False)


def save_png(fig, out_png: Path, dpi: int, tight: bool = True) -> None:
    """Write ``fig`` to ``out_png`` atomically and free it."""
    import matplotlib.pyplot as plt

    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi, bbox_inches="tight" if tight else None)
    plt.close(fig)


def series_colors(n: int) -> list:
    """``n`` distinct colours: matplotlib's default cycle repeats after 10 series, and the
    paper report draws 16 methods (13 presets), so beyond 10 take tab20's 20 colours."""
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def legend_outside(ax) -> None:
    """The legend to the right of ``ax``: inside, a long one covers the bars and curves."""
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def bar_chart(
    results: dict[str, dict[str, Any]], in_domain: list[str], out_png: Path, labels: dict[str, str] | None = None
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    sources = sorted({s for r in results.values() for s in r["by_source"]}, key=lambda s: (s not in in_domain, s))
    methods = list(results)
    width = 0.8 / max(len(methods), 1)
    fig, ax = plt.subplots(figsize=(2.2 + 1.6 * len(sources) + 0.3 * len(methods), 4))
    x = np.arange(len(sources))
    for i, (m, color) in enumerate(zip(methods, series_colors(len(methods)))):
        ems = [results[m]["by_source"].get(s, {}).get("em", 0.0) for s in sources]
        label = {**DISPLAY, **(labels or {})}.get(m, m)
        bars = ax.bar(x + (i - (len(methods) - 1) / 2) * width, ems, width, label=label, color=color)
        # upright numbers collide once the bars are narrower than "0.33"
        ax.bar_label(bars, fmt="%.2f", fontsize=7 if len(methods) <= 6 else 6, rotation=0 if len(methods) <= 6 else 90)
    ax.set_xticks(x, [f"{s}\n({'in' if s in in_domain else 'out-of'}-domain)" for s in sources])
    ax.set_ylabel("exact match (greedy)")
    ax.set_ylim(0, 1)
    ax.set_title("Held-out EM by data source")
    legend_outside(ax)
    fig.tight_layout()
    save_png(fig, out_png, dpi=120)


CURVES = (
    ("train/reward", "training reward (mean per trajectory)"),
    ("train/answer_rate", "answer rate (training rollouts)"),
    ("eval/em", "validation EM (greedy, in-training evals)"),
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


def mean_curve(tsvs: list[Path]) -> tuple[list[int], list[float]]:
    """Several runs' curves of one metric as their mean at the steps all of them logged."""
    curves = [dict(zip(*read_curve(t))) for t in tsvs]
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    return steps, [sum(c[s] for c in curves) / len(curves) for s in steps]


def training_curves(live_dir: Path, out_png: Path, names: tuple[str, ...] | None = None) -> list[str]:
    """One panel per metric of CURVES, one line per experiment (dvclive/<experiment>/; the mean
    over its seeds for a presets file's dvclive/<experiment>.seed<k>/).

    ``names`` (the params' experiments) leaves out the history of a removed or renamed
    experiment; ``None`` plots every folder."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = sorted(p for p in live_dir.glob("*") if (p / "plots" / "metrics").is_dir()) if live_dir.is_dir() else []
    runs: dict[str, list[Path]] = {}
    for p in found:
        runs.setdefault(split_seeded(p.name)[0], []).append(p)
    experiments = [n for n in runs if names is None or n in names]
    for stale in sorted(set(runs) - set(experiments) - {"curve"}):
        log.warning("%s: no experiment %r in params, left out of the curves", live_dir / stale, stale)
    fig, axes = plt.subplots(1, len(CURVES), figsize=(5 * len(CURVES) + 2.5, 3.6))  # + the legend
    colors = series_colors(len(experiments))
    for ax, (metric, title) in zip(axes, CURVES):
        for exp, color in zip(experiments, colors):
            tsvs = [t for d in runs[exp] if (t := d / "plots" / "metrics" / f"{metric}.tsv").exists()]
            if tsvs:
                steps, values = mean_curve(tsvs)
                label = exp if len(tsvs) == 1 else f"{exp} (mean of {len(tsvs)})"
                ax.plot([s + 1 for s in steps], values, marker="o", markersize=3, label=label, color=color)
        ax.set_title(title)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    if experiments:
        legend_outside(axes[-1])
    fig.tight_layout()
    save_png(fig, out_png, dpi=110)
    return experiments


def curve_points(live: Path, metric: str) -> list[tuple[int, float]]:
    """A dvclive metric of one run as (RL step, value): dvclive's step k is logged after k + 1 RL steps."""
    tsv = live / "plots" / "metrics" / f"{metric}.tsv"
    steps, values = read_curve(tsv) if tsv.exists() else ([], [])
    return [(s + 1, v) for s, v in zip(steps, values)]


def rolling_mean(values: list[float], window: int) -> list[float]:
    """The mean of each value and the ``window - 1`` before it (fewer at the start)."""
    means = []
    for i in range(len(values)):
        last = values[max(0, i + 1 - window) : i + 1]
        means.append(sum(last) / len(last))
    return means


def learning_curve(
    live: Path, out_png: Path, start_em: float | None = None, n: int | None = None
) -> list[tuple[int, float]]:
    """One long run's curves (``live``: its dvclive folder) drawn to ``out_png``: training reward by
    RL step (with its 10-step rolling mean: one step's few questions make it noisy) and validation
    EM, from ``start_em`` (the starting model's) at step 0; with ``n`` (validation questions),
    ±1 binomial SE bars and the budget :func:`budget_by_rule` reads off it. Returns the
    validation EM as (RL step, EM) points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_em) = plt.subplots(1, 2, figsize=(11, 3.6))
    reward = curve_points(live, "train/reward")
    if reward:
        steps, values = zip(*reward)
        ax_r.plot(steps, values, marker="o", markersize=2, linewidth=0.6, alpha=0.35, label="per step")
        ax_r.plot(steps, rolling_mean(list(values), 10), linewidth=2, label="10-step mean")
        ax_r.legend(fontsize=8)
    points = ([(0, start_em)] if start_em is not None else []) + curve_points(live, "eval/em")
    if points:
        steps, values = zip(*points)
        se = [math.sqrt(v * (1 - v) / n) for v in values] if n else None
        ax_em.errorbar(steps, values, yerr=se, marker="o", markersize=3, capsize=2)
        if n:
            budget = budget_by_rule(points, n)[0]
            ax_em.axvline(budget, linestyle="--", color="gray", linewidth=1)
            ax_em.annotate(f"budget: {budget} steps", (budget, min(values)), fontsize=8, xytext=(4, 0),
                           textcoords="offset points")
    for ax, title in ((ax_r, "training reward (mean per trajectory)"), (ax_em, "validation EM (greedy, ±1 SE)")):
        ax.set_title(title)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    save_png(fig, out_png, dpi=110)
    return points


def budget_by_rule(points: list[tuple[int, float]], n: int) -> tuple[int, float, float]:
    """The step budget read off a validation curve: the earliest step whose EM is within one
    standard error of the best, SE = sqrt(best (1 - best) / n) for ``n`` questions (the
    one-standard-error rule: no more steps than the curve can tell apart from the best).
    ``points``: (RL step, EM), non-empty. Returns (that step, the best EM, SE)."""
    best = max(em for _, em in points)
    se = math.sqrt(best * (1 - best) / n)
    return min(step for step, em in points if em >= best - se - 1e-12), best, se


def behaviour_table(results: dict[str, dict], names: dict[str, str]) -> str:
    """One row per method: how it behaved (answer rate, turns, tool calls, invalid calls)."""
    detail = ["| Method | n | answer rate | turns | tool calls | invalid-call rate |", "|---|---|---|---|---|---|"]
    for m, r in results.items():
        detail.append(
            f"| {names.get(m, m)} | {r['n']} | {r.get('answer_rate', 1.0):.3f} | {r.get('mean_turns', 1):.2f} "
            f"| {r.get('mean_tool_calls', 0):.2f} | {r.get('invalid_call_rate', 0):.3f} |"
        )
    return "\n".join(detail)


def load_outcomes(
    outcomes_dir: Path, methods: list[str], baseline_dir: Path | None = None,
    seeds: dict[str, list[int]] | None = None,
) -> dict[str, list[list[dict[str, Any]]]]:
    """``{method: runs}``, each run a list of per-question rows, for the ``methods`` that have any
    (``<method>.jsonl``, or ``<method>.seed<k>.jsonl`` for each seed in ``seeds``; the baselines
    and the warm start from ``baseline_dir`` when given)."""
    out = {}
    for m in methods:
        folder = baseline_dir if baseline_dir is not None and m in BASELINE_ORDER else outcomes_dir
        if runs := load_outcome_runs(folder, m, (seeds or {}).get(m)):
            out[m] = runs
    return out


def comparisons(methods: list[str], ablation_of: dict[str, str]) -> list[tuple[str, str]]:
    """(A, B) pairs to test: every trained run that is not an ablation against the warm start and
    the baselines, each ablation against the run it ablates, and the trained runs pairwise."""
    full = [m for m in methods if m not in BASELINE_ORDER and m not in ablation_of]
    pairs = [(m, b) for m in full for b in BASELINE_ORDER[::-1] if b in methods]
    pairs += [(m, base) for m, base in ablation_of.items() if m in methods and base in methods]
    return pairs + [(a, b) for i, a in enumerate(full) for b in full[i + 1 :]]


def _bold_resolved(cells: list[str]) -> list[str]:
    """(Δ, p) cell pairs with each p below RESOLVED_P in bold."""
    return [f"**{c}**" if i % 2 and c != "–" and float(c) < RESOLVED_P else c for i, c in enumerate(cells)]


def paired_section(
    outcomes: dict[str, list[list[dict[str, Any]]]], in_domain: list[str], ablation_of: dict[str, str],
    names: dict[str, str],
) -> list[str]:
    """Each comparison question by question (:mod:`agent_r1.evaluation.paired`), in- and out-of-domain."""
    sources = {r["source"] for runs in outcomes.values() for rows in runs for r in rows}
    parts = (set(in_domain), sources - set(in_domain))
    header = ["A", "B", "runs A / B", "n in / out", "Δ EM in-domain [95% CI] (A only/B only)", "p", "Δ EM out-of-domain", "p"]
    rows = []
    for a, b in comparisons(list(outcomes), ablation_of):
        pairs = [paired_runs(outcomes[a], outcomes[b], part) for part in parts]
        cells = _bold_resolved([c for p in pairs for c in describe(p)])
        n = " / ".join(str(p.n) if p else "0" for p in pairs)
        runs = f"{len(outcomes[a])} / {len(outcomes[b])}"
        rows.append([names.get(a, a), names.get(b, b), runs, n, *cells])
    if not rows:
        return []
    return ["## Paired comparisons",
            "A − B on the same questions, each method's EM on a question averaged over its runs (training "
            "seeds): Δ = the mean difference with its 95% CI; in brackets, on how many questions A and B did "
            "better; p = the exact two-sided sign-flip test over questions (with one run each, McNemar's "
            "exact test). Bold: p < 0.01, the difference is resolved; otherwise these questions do not tell "
            "A and B apart. The unit is the question: how far a row moves between training seeds is its "
            "`sd over seeds` in the EM table, not part of these intervals.",
            markdown_table(header, rows),
            *paired_by_source(outcomes, sorted(parts[1]), ablation_of, names)]


def paired_by_source(
    outcomes: dict[str, list[list[dict[str, Any]]]], ood_sources: list[str], ablation_of: dict[str, str],
    names: dict[str, str],
) -> list[str]:
    """The same comparisons on each out-of-domain source apart (when there are several): pooled,
    a floor row (every method at 0) would hide what another row shows."""
    if len(ood_sources) < 2:
        return []
    header = ["A", "B", *[c for s in ood_sources for c in (f"Δ EM {s}", "p")]]
    rows = []
    for a, b in comparisons(list(outcomes), ablation_of):
        cells = _bold_resolved([c for s in ood_sources for c in describe(paired_runs(outcomes[a], outcomes[b], {s}))])
        rows.append([names.get(a, a), names.get(b, b), *cells])
    return ["Out of domain, each source apart (the same test as above):", markdown_table(header, rows)]


def ablation_section(
    results: dict[str, dict],
    ablation_of: dict[str, str],
    names: dict[str, str],
    paper_em: dict[str, float],
    ablation_png: Path | None,
) -> list[str]:
    """The Table-4-shaped section (and its chart, when ``ablation_png`` is given)."""
    header, rows = ablation_table(results, ablation_of, names, paper_em)
    section = ["## Ablations (Table 4 shape)",
               "Δ = the ablation's average EM minus the full method's; a Δ within about two of its "
               "standard errors is not resolved by this many held-out questions.",
               markdown_table(header, rows)]
    if ablation_png is not None:
        ablation_chart(results, ablation_of, names, paper_em, ablation_png)
        section.append(f"![ablations]({ablation_png.name})")
    return section


def write_report(
    eval_dir: Path,
    in_domain: list[str],
    out_md: Path,
    out_png: Path,
    extra_sections: tuple[str, ...] = (),
    baseline_dir: Path | None = None,
    experiments: dict[str, Any] | None = None,
    ablation_png: Path | None = None,
    warm_start: bool = True,
    outcomes: dict[str, list[list[dict[str, Any]]]] | None = None,
    stateful: bool = False,
) -> str:
    """Write ``out_md`` (and its charts); ``experiments`` (name -> ExperimentConfig) picks the
    trained rows (``None``: every file in ``eval_dir``) and adds their labels, the paper's numbers and, for ablations, the Table-4 section.
    ``warm_start`` false (sft.enabled false) relabels the "sft" row: no SFT happened.
    ``outcomes`` (method -> per-question rows, :func:`load_outcomes`) adds the paired comparisons;
    ``stateful`` (a stateful env) says what EM and F1 mean there."""
    names = None if experiments is None else tuple(experiments)
    results = load_results(eval_dir, baseline_dir, names, run_seeds(experiments or {}))
    experiments = experiments or {}
    if not results:
        raise FileNotFoundError(f"no metrics in {eval_dir}: run the baselines/evaluate stages first")
    labels = {name: e.label for name, e in experiments.items() if e.label}
    if not warm_start:
        labels.setdefault("sft", NO_WARM_START_LABEL)
    paper_em = {name: e.paper_em for name, e in experiments.items() if e.paper_em is not None}
    ablation_of = {name: e.ablation_of for name, e in experiments.items() if e.ablation_of}
    if paper_em:
        paper_em = {**PAPER_BASELINE_EM, **paper_em}
    em_header, em_rows = results_table(results, in_domain, "em", labels, paper_em)
    f1_header, f1_rows = results_table(results, in_domain, "f1", labels)
    names = {**DISPLAY, **labels}
    sources = f"`{eval_dir}/<method>.json`" + (f" and `{baseline_dir}/` (baselines, warm start)" if baseline_dir else "")
    ablations = ablation_section(results, ablation_of, names, paper_em, ablation_png) if ablation_of else []
    text = "\n\n".join(
        [
            "# Results",
            "Held-out exact match (greedy decoding), shaped like Table 3 of Agent-R1. "
            f"In-domain sources: {', '.join(in_domain) or '–'}; the others are out-of-domain. "
            f"Every number comes from {sources}." + (f" {STATEFUL_METRICS}" if stateful else ""),
            "## Exact match",
            markdown_table(em_header, em_rows),
            "A row trained with several seeds is the mean of its runs. ± SE: the binomial standard error "
            "of Avg, sqrt(Σ p(1−p)/n) / k over the k sources: rows closer than about two SEs are not told "
            "apart by this many questions. sd over seeds: how far Avg moves between training seeds.",
            f"![EM by source]({out_png.name})",
            *ablations,
            *paired_section({m: outcomes[m] for m in results if m in (outcomes or {})}, in_domain, ablation_of, names),
            "## F1",
            markdown_table(f1_header, f1_rows),
            "## Behaviour",
            behaviour_table(results, names),
            *extra_sections,
        ]
    )
    bar_chart(results, in_domain, out_png, labels)
    write_text(out_md, text + "\n")
    return text
