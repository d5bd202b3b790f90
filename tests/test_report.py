"""Metrics aggregation and the Table-3-shaped report (pure functions, hand-checked numbers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_r1.evaluation.summary import summarize_episodes
from agent_r1.evaluation.report import write_report


def ep(source: str, em: float, f1: float, **kw) -> dict:
    return {"source": source, "type": kw.pop("type", "bridge"), "em": em, "f1": f1, **kw}


def test_summarize_episodes_shape_and_numbers() -> None:
    rows = [
        ep("synthetic", 1, 1, answered=True, turns=3, tool_calls=2, invalid_calls=0),
        ep("synthetic", 0, 0.5, answered=True, turns=2, tool_calls=1, invalid_calls=1),
        ep("synthetic_3hop", 0, 0, answered=False, turns=4, tool_calls=4, invalid_calls=1, type="compositional"),
    ]
    m = summarize_episodes(rows, "x")
    assert m["n"] == 3 and m["em"] == pytest.approx(1 / 3, abs=1e-4) and m["f1"] == pytest.approx(0.5)
    assert m["by_source"] == {
        "synthetic": {"em": 0.5, "f1": 0.75, "n": 2},
        "synthetic_3hop": {"em": 0.0, "f1": 0.0, "n": 1},
    }
    assert m["by_type"]["compositional"]["n"] == 1
    assert m["answer_rate"] == pytest.approx(2 / 3, abs=1e-4)
    assert m["mean_turns"] == 3.0 and m["mean_tool_calls"] == pytest.approx(7 / 3, abs=1e-4)
    assert m["invalid_call_rate"] == pytest.approx(2 / 7, abs=1e-4)
    json.dumps(m)  # serialisable as is


def test_outcomes_are_one_line_per_question_sorted_by_id(tmp_path: Path) -> None:
    from agent_r1.evaluation.summary import OUTCOME_KEYS, write_outcomes

    episodes = [
        {"question_id": "q2", "source": "s", "type": "bridge", "em": 1.0, "f1": 1.0, "answer": "Quorvale",
         "tool_calls": 2, "turns": 3, "termination": "answer", "extra": "dropped"},
        {"id": "q1", "source": "s", "type": "comparison", "em": 0.0, "f1": 0.5, "answer": None, "tool_calls": 0},
    ]
    write_outcomes(tmp_path / "o.jsonl", episodes)
    rows = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["q1", "q2"] and all(list(r) == list(OUTCOME_KEYS) for r in rows)
    assert rows[1]["answer"] == "Quorvale" and rows[0]["answer"] is None and rows[0]["turns"] is None


def test_summarize_episodes_rejects_empty() -> None:
    with pytest.raises(ValueError, match="no episodes"):
        summarize_episodes([], "x")


def test_report_table_and_chart(tmp_path: Path) -> None:
    eval_dir = tmp_path / "eval"
    eval_dir.mkdir()
    results = {
        "base_tool_call": [ep("synthetic", 0, 0), ep("synthetic_3hop", 0, 0)],
        "naive_rag": [ep("synthetic", 1, 1), ep("synthetic_3hop", 0, 0)],
        "grpo": [ep("synthetic", 1, 1), ep("synthetic_3hop", 1, 1)],
    }
    for method, rows in results.items():
        (eval_dir / f"{method}.json").write_text(json.dumps(summarize_episodes(rows, method)))
    md, png = tmp_path / "r" / "results.md", tmp_path / "r" / "results.png"
    text = write_report(eval_dir, ["synthetic"], md, png)
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    assert lines[0] == "| Method | synthetic | synthetic_3hop | In-domain avg | Out-of-domain avg | Avg | ± SE |"
    # baselines first, in the paper's order, then the trained methods
    assert [line.split(" | ")[0] for line in lines[1:4]] == ["| Naive RAG", "| Base Tool Call", "| grpo"]
    assert "| Naive RAG | 1.0000 | 0.0000 | 1.0000 | 0.0000 | 0.5000 | 0.0000 |" in text
    assert md.read_text().startswith("# Results")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("warm_start", [True, False])
def test_warm_start_row_says_whether_sft_ran(tmp_path: Path, warm_start: bool) -> None:
    eval_dir = tmp_path / "eval"
    eval_dir.mkdir()
    (eval_dir / "sft.json").write_text(json.dumps(summarize_episodes([ep("synthetic", 1, 1)], "sft")))
    text = write_report(eval_dir, ["synthetic"], tmp_path / "r.md", tmp_path / "r.png", warm_start=warm_start)
    label = "SFT warm start (no RL)" if warm_start else "Base model, RL prompt (no warm start, no RL)"
    assert f"| {label} | 1.0000 |" in text
    assert ("SFT warm start" in text) == warm_start


def test_average_se_is_the_binomial_se_of_the_mean_over_sources() -> None:
    from agent_r1.evaluation.report import average_se

    # sqrt(0.5 * 0.5 / 4 + 0 * 1 / 10) / 2 sources
    assert average_se({"by_source": {"a": {"em": 0.5, "n": 4}, "b": {"em": 0.0, "n": 10}}}) == pytest.approx(0.125)
    # EM 0.32 over 75 questions: sqrt(0.32 * 0.68 / 75), i.e. about 4 questions
    assert average_se({"by_source": {"a": {"em": 0.32, "n": 75}}}) == pytest.approx(0.05386, abs=1e-5)
    assert average_se({"by_source": {}}) == 0.0


def test_report_without_metrics_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "eval").mkdir()
    with pytest.raises(FileNotFoundError, match="no metrics"):
        write_report(tmp_path / "eval", [], tmp_path / "r.md", tmp_path / "r.png")


@pytest.mark.parametrize("header", ["step\treward", "timestamp\tstep\treward"])
def test_training_curves_read_dvclive_files(tmp_path: Path, header: str) -> None:
    from agent_r1.evaluation.report import read_curve, training_curves

    d = tmp_path / "dvclive" / "grpo" / "plots" / "metrics" / "train"
    d.mkdir(parents=True)
    rows = ["0\t-0.9", "1\t0.25"] if header.startswith("step") else ["17\t0\t-0.9", "18\t1\t0.25"]
    (d / "reward.tsv").write_text("\n".join([header, *rows]) + "\n")
    assert read_curve(d / "reward.tsv") == ([0, 1], [-0.9, 0.25])
    assert training_curves(tmp_path / "dvclive", tmp_path / "t.png") == ["grpo"]
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"


def test_learning_curve_starts_at_the_starting_models_validation_em(tmp_path: Path) -> None:
    """dvclive's step k is an eval after k + 1 RL steps; the starting model's EM is step 0."""
    from agent_r1.stages.report import learning_curve_section

    d = tmp_path / "curve" / "plots" / "metrics" / "eval"
    d.mkdir(parents=True)
    (d / "em.tsv").write_text("step\tem\n9\t0.28\n19\t0.32\n")
    (tmp_path / "start.json").write_text('{"em": 0.31, "f1": 0.4, "n": 100}')
    section = learning_curve_section(tmp_path / "curve", tmp_path / "c.png", tmp_path / "start.json",
                                     steps_by_preset={"grpo": 20})
    assert section[3].splitlines() == ["- step 0: validation EM 0.310 (the starting model)",
                                       "- step 10: validation EM 0.280", "- step 20: validation EM 0.320"]
    # best 0.32, SE 0.0466: step 0 (0.31) is within one SE, so the rule says RL steps buy nothing here
    assert "so **0 steps**" in section[4] and "more than the rule's 0: re-choose" in section[4]
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    assert learning_curve_section(tmp_path / "curve", tmp_path / "c.png")[-1].startswith("- step 10:")


@pytest.mark.parametrize(("points", "step"), [
    ([(0, 0.32), (10, 0.28), (30, 0.39), (70, 0.49), (80, 0.51)], 70),  # SE 0.050: 0.49 >= 0.46
    ([(0, 0.32), (10, 0.28), (30, 0.39), (70, 0.45), (80, 0.51)], 80),
    ([(0, 0.5), (10, 0.45)], 0),
])
def test_budget_is_the_earliest_step_within_one_se_of_the_best(points: list, step: int) -> None:
    from agent_r1.evaluation.report import budget_by_rule

    chosen, best, se = budget_by_rule(points, 100)
    assert chosen == step and best == max(em for _, em in points)
    assert se == pytest.approx((best * (1 - best) / 100) ** 0.5)


def test_budget_line_names_the_presets_with_a_budget_of_their_own() -> None:
    """A preset that sets its own train.steps is named; the shared budget is the one checked against the rule."""
    from agent_r1.stages.report import curve_budget_line

    points = [(0, 0.32), (10, 0.35), (20, 0.36), (30, 0.38)]  # best 0.38, SE 0.0485: step 10 is within it
    line = curve_budget_line(points, 100, {"grpo": 10, "ppo": 10, "grpo-long": 70})
    assert "so **10 steps**" in line and "The presets train `budget.steps` = 10." in line
    assert line.endswith("Presets with a budget of their own (steps): `grpo-long` 70.")
    stale = curve_budget_line(points, 100, {"grpo": 20, "ppo": 20})
    assert "The presets train 20 steps, more than the rule's 10: re-choose `budget.steps`." in stale
    assert "of their own" not in stale
    capped = curve_budget_line([(0, 0.32), (40, 0.36), (50, 0.41)], 100, {"grpo": 40})  # 0.36 < 0.41 - 0.0492
    assert "so **50 steps**" in capped and "`budget.steps` = 40, fewer than the rule's 50: a cap" in capped


def test_curve_section_pairs_the_trained_policy_with_its_start(tmp_path: Path) -> None:
    """The end-of-curve evaluation against step 0, question by question (McNemar), and by type."""
    from agent_r1.stages.report import learning_curve_section, outcomes_beside

    d = tmp_path / "curve" / "plots" / "metrics" / "eval"
    d.mkdir(parents=True)
    (d / "em.tsv").write_text("step\tem\n9\t0.4\n19\t0.6\n")
    for name, right in (("start", {0, 1}), ("end", {0, 1, 2, 3, 4, 5})):
        rows = [{"id": f"q{i}", "source": "s", "type": "bridge", "em": float(i in right)} for i in range(10)]
        outcomes_beside(tmp_path / f"{name}.json").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        em = len(right) / 10
        (tmp_path / f"{name}.json").write_text(json.dumps(
            {"em": em, "n": 10, "by_type": {"bridge": {"em": em, "n": 10}}}))
    section = learning_curve_section(tmp_path / "curve", tmp_path / "c.png", tmp_path / "start.json",
                                     tmp_path / "end.json", {"grpo": 20, "ppo": 20})
    assert "so **20 steps**" in section[4] and "The presets train `budget.steps` = 20." in section[4]
    # 4 questions only the trained policy got right, none the other way: McNemar p = 2 / 2^4
    assert "Δ EM +0.400 [" in section[5] and "(4/0)" in section[5] and "p = 0.125" in section[5]
    assert section[6] == "By question type: bridge 0.20 -> 0.60 (n 10)."


def test_presets_report_has_paper_column_and_ablation_deltas(tmp_path: Path) -> None:
    """A presets report: baselines and the warm start from the shared dir, Table 4 deltas hand-checked."""
    from agent_r1.config import ExperimentConfig

    shared, presets = tmp_path / "metrics" / "eval", tmp_path / "paper" / "eval"
    shared.mkdir(parents=True)
    presets.mkdir(parents=True)
    em = {  # method -> (in-domain EM, out-of-domain EM): averages 0.5, 0.25, 0.75, 0.25
        "naive_rag": (1, 0), "sft": (0.5, 0), "grpo": (1, 0.5), "grpo-no-loss-mask": (0.5, 0),
    }
    for method, (ind, ood) in em.items():
        rows = [ep("synthetic", ind, ind), ep("synthetic_3hop", ood, ood)]
        (shared if method in ("naive_rag", "sft") else presets).joinpath(f"{method}.json").write_text(
            json.dumps(summarize_episodes(rows, method))
        )
    (shared / "grpo.json").write_text("{}")  # the default run's own experiment: not part of the presets report
    experiments = {
        "grpo": ExperimentConfig(label="GRPO", paper_em=0.3877),
        "grpo-no-loss-mask": ExperimentConfig(label="GRPO w/o loss mask", ablation_of="grpo", paper_em=0.3722),
    }
    md, png, abl = tmp_path / "r" / "results.md", tmp_path / "r" / "results.png", tmp_path / "r" / "ablations.png"
    text = write_report(presets, ["synthetic"], md, png, baseline_dir=shared, experiments=experiments, ablation_png=abl)
    assert "| Naive RAG | 1.0000 | 0.0000 | 1.0000 | 0.0000 | 0.5000 | 0.0000 | 0.1328 |" in text
    assert "| SFT warm start (no RL) | 0.5000 | 0.0000 | 0.5000 | 0.0000 | 0.2500 | 0.2500 | – |" in text
    assert "| GRPO | 1.0000 | 0.5000 | 1.0000 | 0.5000 | 0.7500 | 0.2500 | 0.3877 |" in text
    # Table 4: 0.25 - 0.75 = -0.5 ours, SE hypot(0.25, 0.25) = 0.3536; 0.3722 - 0.3877 = -0.0155 in the paper
    assert "| GRPO w/o loss mask | GRPO | 0.2500 | 0.7500 | -0.5000 | 0.3536 | -0.0155 |" in text
    assert abl.read_bytes()[:4] == b"\x89PNG"


def test_presets_report_rows_follow_the_presets_order(tmp_path: Path) -> None:
    from agent_r1.config import ExperimentConfig

    eval_dir = tmp_path / "eval"
    eval_dir.mkdir()
    for method in ("grpo", "rloo", "sft", "extra"):
        (eval_dir / f"{method}.json").write_text(json.dumps(summarize_episodes([ep("synthetic", 1, 1)], method)))
    experiments = {"rloo": ExperimentConfig(label="RLOO"), "grpo": ExperimentConfig(label="GRPO")}
    text = write_report(eval_dir, ["synthetic"], tmp_path / "r.md", tmp_path / "r.png", experiments=experiments)
    em_rows = text.split("## Exact match")[1].split("![")[0]
    methods = [line.split(" | ")[0][2:] for line in em_rows.splitlines() if line.startswith("| ") and "Method" not in line]
    assert methods == ["SFT warm start (no RL)", "RLOO", "GRPO"]  # "extra" is in no params: left out


def test_report_stage_leaves_out_removed_experiments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An experiment renamed in params.yaml (old -> grpo) leaves metrics/eval/old.json and
    dvclive/old behind: the report stage must show neither, only what params describe."""
    from agent_r1.config import Params, SyntheticConfig
    from agent_r1.data.synthetic import generate
    from agent_r1.io import write_parquet
    from agent_r1.stages.report import report

    monkeypatch.chdir(tmp_path)
    questions, _ = generate(SyntheticConfig(n_train=20, n_test=4, n_test_ood=2, n_test_ood_2hop=2, n_test_paraphrase=2, entities_per_type=20), seed=0)
    write_parquet("data/prepared/train.parquet", questions[questions["split"] == "train"])
    Path("metrics/eval").mkdir(parents=True)
    for method in ("sft", "grpo", "old"):
        Path(f"metrics/eval/{method}.json").write_text(json.dumps(summarize_episodes([ep("synthetic", 1, 1)], method)))
        d = Path(f"dvclive/{method}/plots/metrics/train")
        d.mkdir(parents=True)
        (d / "reward.tsv").write_text("step\treward\n0\t0.5\n")
    report(Params())  # the default params: one experiment, grpo
    text = Path("reports/results.md").read_text()
    methods = [line.split(" | ")[0][2:] for line in text.split("## Exact match")[1].split("![")[0].splitlines()
               if line.startswith("| ") and "Method" not in line]
    assert methods == ["SFT warm start (no RL)", "grpo"]
    assert "old" not in text.split("## Training curves")[1]
    Path("notes.md").write_text("## What these runs cannot show\n\nA hand-written limit.\n")
    report(Params(), notes=Path("notes.md"))  # the paper's report ends with its notes
    assert Path("reports/results.md").read_text().rstrip().endswith("## What these runs cannot show\n\nA hand-written limit.")


def test_ablation_of_must_name_an_experiment() -> None:
    from agent_r1.config import ParamsError, parse_params

    with pytest.raises(ParamsError, match="experiments.b.ablation_of: 'a' is not an experiment here"):
        parse_params({"experiments": {"b": {"ablation_of": "a", "overrides": {"env": {"one_shot": False}}}}})


def test_every_series_gets_its_own_colour() -> None:
    from agent_r1.evaluation.report import series_colors

    # 16 methods: the paper report's 13 presets, two baselines and the warm start
    for n in (3, 10, 16, 20):
        assert len(set(series_colors(n))) == n


def test_mcnemar_and_paired_em_hand_worked() -> None:
    from agent_r1.evaluation.paired import mcnemar_p, paired_em

    assert mcnemar_p(0, 0) == 1.0 and mcnemar_p(3, 3) == 1.0
    assert mcnemar_p(9, 1) == pytest.approx(2 * 11 / 1024)  # P[Bin(10, 1/2) <= 1] = 11/1024, two-sided
    assert mcnemar_p(10, 0) == pytest.approx(2 / 1024)
    # A right on q0..q3, B right on q0 and q4; q5 both wrong; q9 only A answered (not paired)
    a = [{"id": f"q{i}", "source": "s", "em": float(i < 4)} for i in range(6)] + [{"id": "q9", "source": "s", "em": 1.0}]
    b = [{"id": f"q{i}", "source": "s", "em": float(i in (0, 4))} for i in range(6)]
    p = paired_em(a, b)
    d = [0, 1, 1, 1, -1, 0]
    sd = (sum((x - 1 / 3) ** 2 for x in d) / 5) ** 0.5
    assert (p.n, p.wins, p.losses) == (6, 3, 1) and p.delta == pytest.approx(2 / 6)
    assert p.ci_high - p.delta == pytest.approx(1.959964 * sd / 6 ** 0.5)
    assert p.p == pytest.approx(mcnemar_p(3, 1)) == pytest.approx(2 * 5 / 16)
    assert paired_em(a, b, {"other"}) is None


def test_report_compares_methods_question_by_question(tmp_path: Path) -> None:
    from agent_r1.config import ExperimentConfig
    from agent_r1.evaluation.report import comparisons, load_outcomes

    eval_dir, out_dir = tmp_path / "eval", tmp_path / "outcomes"
    eval_dir.mkdir(), out_dir.mkdir()
    right = {"sft": range(2), "grpo": range(14), "grpo-no-loss-mask": range(13)}  # of 20 in-domain questions
    for method, ok in right.items():
        rows = [{"id": f"q{i}", "source": "synthetic", "type": "bridge", "em": float(i in ok), "f1": 0.0}
                for i in range(20)]
        (eval_dir / f"{method}.json").write_text(json.dumps(summarize_episodes(rows, method)))
        (out_dir / f"{method}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    experiments = {"grpo": ExperimentConfig(), "grpo-no-loss-mask": ExperimentConfig(ablation_of="grpo")}
    assert comparisons(["sft", "grpo", "grpo-no-loss-mask"], {"grpo-no-loss-mask": "grpo"}) == [
        ("grpo", "sft"), ("grpo-no-loss-mask", "grpo")]
    outcomes = load_outcomes(out_dir, ["naive_rag", "sft", *experiments])
    assert set(outcomes) == {"sft", "grpo", "grpo-no-loss-mask"}  # no naive_rag file: left out
    text = write_report(eval_dir, ["synthetic"], tmp_path / "r.md", tmp_path / "r.png",
                        experiments=experiments, outcomes=outcomes)
    section = text.split("## Paired comparisons")[1]
    # grpo vs warm start: 12 questions only grpo got, none only sft: p = 2 / 2^12, resolved
    assert "| grpo | SFT warm start (no RL) | 1 / 1 | 20 / 0 | +0.600 [+0.380, +0.820] (12/0) | **0.000488** | – | – |" in section
    assert "| grpo-no-loss-mask | grpo | 1 / 1 | 20 / 0 | -0.050 [-0.148, +0.048] (0/1) | 1 | – | – |" in section


def test_sign_flip_test_is_exact_and_pairs_several_seeds() -> None:
    from agent_r1.evaluation.paired import mcnemar_p, paired_runs, sign_flip_p

    # one run each: the sign-flip test is McNemar's exact test
    for w, l in [(3, 0), (7, 2), (5, 5), (10, 1)]:
        assert sign_flip_p([1] * w + [-1] * l + [0] * 4) == pytest.approx(mcnemar_p(w, l))
    # by hand: x = (2, 1); of the 4 sign patterns, sums 3, 1, -1, -3: |sum| >= 3 in 2 of them
    assert sign_flip_p([2, 1]) == pytest.approx(0.5) and sign_flip_p([2, -1]) == pytest.approx(1.0)

    def run(right: set[int]) -> list[dict]:
        return [{"id": f"q{i}", "source": "s", "em": float(i in right)} for i in range(4)]

    # A: 3 seeds, B: 1 run. Per question A's mean EM: q0 1, q1 2/3, q2 0, q3 1/3; B: q0 1, q1 0, q2 0, q3 1
    a, b = [run({0, 1}), run({0, 1, 3}), run({0})], [run({0, 3})]
    p = paired_runs(a, b)
    d = [0, 2 / 3, 0, -2 / 3]
    assert (p.n, p.wins, p.losses) == (4, 1, 1) and p.delta == pytest.approx(sum(d) / 4)
    assert p.p == pytest.approx(1.0)  # scaled differences (0, 2, 0, -2): every sign pattern is as extreme
    assert paired_runs([run({0, 1, 2, 3})] * 2, [run(set())]).p == pytest.approx(2 / 16)


def test_report_of_seeded_runs_shows_their_mean_and_spread(tmp_path: Path) -> None:
    from agent_r1.config import ExperimentConfig
    from agent_r1.evaluation.report import load_outcomes
    from agent_r1.paths import seeded

    eval_dir, out_dir = tmp_path / "eval", tmp_path / "outcomes"
    eval_dir.mkdir(), out_dir.mkdir()

    def write(stem: str, right: range) -> None:
        rows = [{"id": f"q{i}", "source": "synthetic", "type": "bridge", "em": float(i in right), "f1": 0.0}
                for i in range(20)]
        (eval_dir / f"{stem}.json").write_text(json.dumps(summarize_episodes(rows, stem)))
        (out_dir / f"{stem}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")

    write("sft", range(2))
    for k, n in [(0, 10), (1, 12), (2, 14)]:
        write(seeded("grpo", k), range(n))
    write(seeded("grpo", 7), range(20))  # a seed the presets no longer run: not read
    experiments = {"grpo": ExperimentConfig(seeds=[0, 1, 2])}
    outcomes = load_outcomes(out_dir, ["sft", "grpo"], seeds={"grpo": [0, 1, 2]})
    assert [len(outcomes["grpo"]), len(outcomes["sft"])] == [3, 1]
    text = write_report(eval_dir, ["synthetic"], tmp_path / "r.md", tmp_path / "r.png",
                        experiments=experiments, outcomes=outcomes)
    row = next(line for line in text.splitlines() if line.startswith("| grpo | 0.6000"))
    assert row.endswith("| 0.1000 (3 seeds) |")  # mean of 0.5, 0.6, 0.7; their sd is 0.1
    assert "| grpo | SFT warm start (no RL) | 3 / 1 | 20 / 0 | +0.500" in text


def test_validation_questions_spread_the_in_training_eval_over_sources() -> None:
    """The curve's step 0 scores the questions the trainer's in-training evals score."""
    import pandas as pd

    from agent_r1.evaluation.greedy import select_questions, validation_questions

    val = pd.DataFrame({"id": [f"q{i}" for i in range(30)], "source": ["a"] * 20 + ["b"] * 10})
    picked = validation_questions(val, 10, seed=3)
    assert [q["source"] for q in picked] == ["a"] * 5 + ["b"] * 5
    assert picked == select_questions(val, 5, 3)
    assert len(validation_questions(val, 1, seed=3)) == 2  # at least one of each source


def test_rolling_mean_averages_each_value_with_the_ones_before_it() -> None:
    from agent_r1.evaluation.report import rolling_mean

    assert rolling_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert rolling_mean([2.0, 4.0], 10) == [2.0, 3.0]


def test_out_of_domain_sources_are_also_compared_apart() -> None:
    """Pooled, a floor source (0 for both) halves another's difference; apart, each shows its own."""
    from agent_r1.evaluation.report import paired_section

    def rows(par: list[int]) -> list[dict]:
        return ([{"id": f"i{k}", "source": "synthetic", "em": 0} for k in range(4)]
                + [{"id": f"f{k}", "source": "floor", "em": 0} for k in range(4)]
                + [{"id": f"p{k}", "source": "para", "em": e} for k, e in enumerate(par)])

    outcomes = {"sft": [rows([0, 0, 0, 0])], "grpo": [rows([1, 1, 0, 0])]}
    text = "\n".join(paired_section(outcomes, ["synthetic"], {}, {}))
    assert "| grpo | sft | 1 / 1 | 4 / 8 | +0.000 [+0.000, +0.000] (0/0) | 1 | +0.250 " in text  # pooled
    assert "| A | B | Δ EM floor | p | Δ EM para | p |" in text
    assert "| grpo | sft | +0.000 [+0.000, +0.000] (0/0) | 1 | +0.500 [-0.066, +1.066] (2/0) | 0.5 |" in text
