"""The real DVC pipeline and the Prefect flow, in a temporary git repo on tiny params.

One repo is shared by the tests of this module (building it runs every stage
once); each test states what it expects of the repo's state.

Its policy is a random 2-layer Llama with the real one's tokenizer and chat
template (``agent_r1.smoke.tiny_policy``): what is tested here is the
orchestration (every stage's code run by DVC under Prefect, caching, reports,
artifacts), and decoding with the 135M policy would be most of the suite's
time. The real policy runs through each stage's code in the tests of that code
(tests/test_engine.py, test_rollout_loop.py, test_trainer.py, test_compute_less.py).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tasks.dvc_stage import stage_env

ROOT = Path(__file__).resolve().parents[1]

TINY_DATA = {
    "source": "synthetic",
    "seed": 3,
    "val_questions": 4,
    "synthetic": {"n_train": 40, "n_test": 20, "n_test_ood": 10, "n_test_ood_2hop": 10, "n_test_paraphrase": 10, "entities_per_type": 40},
}
# Every stage for real, at toy sizes: 2 demos, 2 RL steps of 2 questions x 2 samples, 3 eval questions per source;
# every evaluation's 12 episodes in one wave of slots (batch_size), and one validation, at the run's end.
# One checkpoint per run (save_every = steps).
TINY = {
    "data": TINY_DATA,
    "rollout": {"n": 2, "max_new_tokens": 32, "max_total_tokens": 700, "batch_size": 12},
    "env": {"max_turns": 3},
    "eval": {"questions_per_source": 3, "naive_rag_max_new_tokens": 32},
    "sft": {"n_demos": 2, "batch_size": 2},
    "train": {"steps": 2, "questions_per_step": 2, "mini_batch_size": 4, "save_every": 2, "eval_every": 2,
              "eval_questions": 2, "micro_batch_tokens": 2048, "gradient_checkpointing": False},
}
STAGES = ["download", "prepare", "index", "baselines", "sft", "evaluate_sft", "train@grpo", "evaluate@grpo", "report"]


def sh(cmd: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(stage_env(), PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def dvc(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return sh([sys.executable, "-m", "dvc", *args], repo, check)


def _merge(base: dict, over: dict) -> dict:
    for k, v in over.items():
        base[k] = _merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return base


def write_params(repo: Path, **overrides: object) -> None:
    params = _merge(yaml.safe_load((ROOT / "params.yaml").read_text()), TINY)
    for dotted, value in overrides.items():
        node = params
        *parents, leaf = dotted.split("__")
        for key in parents:
            node = node[key]
        node[leaf] = value
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def make_repo(repo: Path, policy_dir: Path, encoder_dir: Path, **overrides: object) -> Path:
    """A git + DVC repo at ``repo`` holding the project's code and tiny params (``overrides`` on top)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for pkg in ("agent_r1", "tasks", "flows", "plugins", "examples"):
        shutil.copytree(ROOT / pkg, repo / pkg, ignore=ignore)
    for f in ("dvc.yaml", ".dvcignore", ".gitignore"):
        shutil.copy(ROOT / f, repo / f)
    write_params(repo, model__path=str(policy_dir), retrieval__encoder__path=str(encoder_dir), **overrides)
    sh(["git", "init", "-q"], repo)
    sh(["git", "config", "user.email", "t@example.com"], repo)
    sh(["git", "config", "user.name", "test"], repo)
    dvc(repo, "init", "-q")
    dvc(repo, "config", "cache.type", "reflink,hardlink,copy")
    sh(["git", "add", "-A"], repo)
    sh(["git", "commit", "-qm", "pipeline"], repo)
    return repo


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, policy_dir: Path, encoder_dir: Path) -> Path:
    from agent_r1.smoke import tiny_policy

    policy = tiny_policy(policy_dir, tmp_path_factory.mktemp("tiny") / "policy")
    return make_repo(tmp_path_factory.mktemp("pipeline"), policy, encoder_dir)


@pytest.fixture(scope="module")
def prefect_harness(prefect_api: tuple[str, dict[str, str]]):
    """The flows of this module report to the session's real Prefect server (conftest.py)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: prefect_api[0]}):
        yield


def test_flow_runs_every_stage_then_reports_all_cached(repo: Path, prefect_harness: None) -> None:
    from flows.pipeline import pipeline
    from tasks.dvc_stage import pipeline_stages

    stages = pipeline_stages(str(repo))
    assert stages == STAGES

    before = {a.id for found in _artifacts().values() for a in found}  # the server is shared: others' are there too
    first = pipeline(repo=str(repo))
    assert [(r.stage, r.ran) for r in first] == [(s, True) for s in stages]
    assert (repo / "models/policy/model.safetensors").exists()
    assert (repo / "indexes/bm25/index.json").exists() and (repo / "indexes/dense/index.json").exists()
    data = json.loads((repo / "metrics/data.json").read_text())
    assert data["train"]["n"] == 36 and data["val"]["n"] == 4 and data["test"]["n"] == 50
    retrieval = json.loads((repo / "metrics/retrieval.json").read_text())
    assert retrieval["top_k"] == 3 and {"bm25", "dense"} <= set(retrieval)
    for method in ("naive_rag", "base_tool_call", "sft", "grpo"):
        result = json.loads((repo / f"metrics/eval/{method}.json").read_text())
        assert result["n"] == 12 and set(result["by_source"]) == {
            "synthetic", "synthetic_3hop", "synthetic_2hop_ood", "synthetic_2hop_paraphrase"}
        outcomes = [json.loads(line) for line in (repo / f"outcomes/{method}.jsonl").read_text().splitlines()]
        assert len(outcomes) == 12 and {"id", "source", "type", "em", "f1", "tool_calls", "answer"} <= set(outcomes[0])
        assert sum(o["em"] for o in outcomes) / 12 == pytest.approx(result["em"], abs=1e-4)
    assert (repo / "models/trained/grpo/model.safetensors").exists()
    assert json.loads((repo / "checkpoints/grpo/latest.json").read_text())["step"] == 2  # the final one
    assert (repo / "dvclive/grpo/plots/metrics/train/reward.tsv").exists()
    report = (repo / "reports/results.md").read_text()
    assert "| Naive RAG |" in report and "| grpo |" in report
    assert "| grpo | SFT warm start (no RL) | 1 / 1 | 3 / 9 |" in report.split("## Paired comparisons")[1]
    assert (repo / "reports/results.png").exists() and (repo / "reports/training.png").exists()

    second = pipeline(repo=str(repo))
    assert [(r.stage, r.ran) for r in second] == [(s, False) for s in stages]

    ours = {key for key, found in _artifacts().items() if any(a.id not in before for a in found)}
    assert {"stages", "metrics", "report", "report-results", "progress-train-grpo"} <= ours


def test_dvc_repro_is_noop_then_top_k_reruns_only_index(repo: Path) -> None:
    if not (repo / "dvc.lock").exists():
        dvc(repo, "repro")
    sh(["git", "add", "-A"], repo)
    sh(["git", "commit", "-qm", "first run", "--allow-empty"], repo)

    again = dvc(repo, "repro").stdout
    assert "didn't change, skipping" in again and "Running stage" not in again

    write_params(
        repo,
        model__path=yaml.safe_load((repo / "params.yaml").read_text())["model"]["path"],
        retrieval__encoder__path=yaml.safe_load((repo / "params.yaml").read_text())["retrieval"]["encoder"]["path"],
        retrieval__top_k=1,
    )
    out = dvc(repo, "repro").stdout
    # retrieval.top_k is the k of the retrieval metrics: index re-runs, and since the
    # indexes it rebuilds are byte-identical, nothing downstream does.
    assert "Running stage 'index'" in out
    assert [line for line in out.splitlines() if line.startswith("Running stage")] == ["Running stage 'index':"]

    params_diff = dvc(repo, "params", "diff", "--json").stdout
    top_k = json.loads(params_diff)["params.yaml"]["retrieval.top_k"]
    assert (top_k["old"], top_k["new"]) == (3, 1)
    metrics_diff = json.loads(dvc(repo, "metrics", "diff", "--json").stdout)
    assert metrics_diff["metrics/retrieval.json"]["top_k"] == {"old": 3, "new": 1, "diff": -2}


def test_a_clone_pulls_the_results_from_a_dvc_remote_and_finds_them_up_to_date(repo: Path, tmp_path: Path) -> None:
    """Results travel through a DVC remote (here a local folder; README, "Results that travel between machines"):
    a fresh clone that pulls needs to rebuild nothing, though the checkpoints stayed behind."""
    if not (repo / "dvc.lock").exists():
        dvc(repo, "repro")
    store, clone = tmp_path / "store", tmp_path / "clone"
    dvc(repo, "remote", "add", "-d", "store", str(store))
    sh(["git", "add", "-A"], repo)
    sh(["git", "commit", "-qm", "results and their remote", "--allow-empty"], repo)
    dvc(repo, "push")
    sh(["git", "clone", "-q", str(repo), str(clone)], tmp_path)
    assert "deleted" in dvc(clone, "status").stdout  # nothing pulled yet: DVC would rebuild
    dvc(clone, "pull")
    assert (clone / "models/trained/grpo/model.safetensors").exists() and not (clone / "checkpoints").exists()
    assert "up to date" in dvc(clone, "status").stdout
    assert "Running stage" not in dvc(clone, "repro", "--dry").stdout
    dvc(repo, "remote", "remove", "store")
    sh(["git", "commit", "-qam", "no remote"], repo)


def test_bad_params_fail_the_stage_naming_the_key(repo: Path) -> None:
    original = (repo / "params.yaml").read_text()
    try:
        (repo / "params.yaml").write_text(original.replace("source: synthetic", "source: wiki"))
        proc = dvc(repo, "repro", "--single-item", "prepare", "--force", check=False)
        assert proc.returncode != 0
        assert "data.source: unknown data source 'wiki'" in proc.stdout + proc.stderr
    finally:
        (repo / "params.yaml").write_text(original)
    # DVC cleared the stage's outs before running it: the cache restores the data, and
    # re-running the stage rewrites its (uncached) metrics file.
    dvc(repo, "checkout")
    assert (repo / "data/prepared/train.parquet").exists()
    dvc(repo, "repro", "--single-item", "prepare")
    assert "up to date" in dvc(repo, "status").stdout


TINY_PRESETS = {
    "seeds": [0],
    "budget": {"steps": 2},
    "overrides": {},
    "learning_curve": {"experiment": "grpo", "steps": 2, "eval_every": 1, "eval_questions": 2},
    "extra": {},
    "experiments": {
        "grpo": {"label": "GRPO", "overrides": {"env": {"one_shot": False}}, "paper_em": 0.3877},
        "grpo-no-loss-mask": {
            "label": "GRPO w/o loss mask", "ablation_of": "grpo", "paper_em": 0.3722,
            # train.num_procs is set by the test (2 ranks: the stage re-launches itself under the launcher)
            "overrides": {"env": {"one_shot": False}, "algorithm": {"loss_mask": False}},
        },
    }
}
PAPER_STAGES = ["paper/dvc.yaml:curve", "paper/dvc.yaml:curve_start", "paper/dvc.yaml:run@grpo-0",
                "paper/dvc.yaml:run@grpo-no-loss-mask-0", "paper/dvc.yaml:report"]


def _artifacts() -> dict[str, list]:
    """Every artifact the Prefect server holds, by key."""
    import asyncio

    from prefect.client.orchestration import get_client

    async def read() -> dict[str, list]:
        async with get_client() as client:
            out: dict[str, list] = {}
            for a in await client.read_artifacts():
                out.setdefault(a.key, []).append(a)
            return out

    return asyncio.run(read())


def add_paper_presets(repo: Path, ranks: int) -> None:
    """paper/dvc.yaml and TINY_PRESETS (the ablation on ``ranks`` ranks), committed."""
    if not (repo / "dvc.lock").exists():
        dvc(repo, "repro")
    shutil.rmtree(repo / "paper", ignore_errors=True)  # every variant trains its presets from scratch
    (repo / "paper").mkdir()
    for name in ("dvc.yaml", "notes.md"):  # the report stage reads the notes
        shutil.copy(ROOT / "paper" / name, repo / "paper" / name)
    presets = copy.deepcopy(TINY_PRESETS)
    presets["experiments"]["grpo-no-loss-mask"]["overrides"]["train"] = {"num_procs": ranks}
    (repo / "paper" / "presets.yaml").write_text(yaml.safe_dump(presets, sort_keys=False))
    sh(["git", "add", "-A"], repo)
    sh(["git", "commit", "-qm", "paper presets"], repo)


def test_paper_presets_are_planned_apart_from_the_default_pipeline(repo: Path) -> None:
    """`make test`'s share of the paper pipeline (training the presets is `make test-slow`'s):
    DVC's status of paper/dvc.yaml lists every preset and its report, and `dvc repro` of the
    default pipeline runs none of them."""
    add_paper_presets(repo, ranks=1)
    assert "Running stage" not in dvc(repo, "repro").stdout
    # (`dvc repro --dry` cannot plan the report: its inputs do not exist until the presets run)
    assert sorted(json.loads(dvc(repo, "status", "paper/dvc.yaml", "--json").stdout)) == sorted(PAPER_STAGES)
    from flows.plan import describe, paper_plan

    plan = paper_plan(repo)  # what `make paper` prints before it starts
    assert [p.stage for p in plan] == PAPER_STAGES and [p.steps for p in plan] == [2, 0, 2, 2, 0]
    text = describe(plan)  # estimated from the default pipeline's GRPO run: no preset has run yet
    assert "5 stage(s) to run" in text and "not measured" not in text and "(step time of its kind)" in text
    shutil.rmtree(repo / "paper")
    sh(["git", "add", "-A"], repo)
    sh(["git", "commit", "-qm", "no paper presets"], repo)


def test_plan_estimates_a_run_from_its_own_runs_else_its_kind_else_every_run() -> None:
    from flows.plan import Measurements, Planned, describe, per_step, questions_scored

    # a run resumed at step 5, and one from before the stages timed themselves
    assert per_step([{"steps": 10, "start_step": 5, "seconds": 300.0}, {"steps": 4, "last": {"time/step_s": 100.0}}]) == [
        60.0, 100.0]
    # seconds per trajectory of a step: runs of 24 trajectories a step at 50 and 60 s a step, ...
    grpo, ppo, rloo = ("grpo", "flat", False), ("ppo", "flat", False), ("rloo", "flat", False)
    known = Measurements(trajectory_s={"grpo": [50 / 24, 60 / 24]},
                         kind_trajectory_s={grpo: [50 / 24, 60 / 24, 40 / 24], ppo: [90 / 24]},
                         question_s=[0.5, 0.7], questions=400)
    evaluation = 0.6 * 400
    assert known.estimate("grpo", grpo, 20 * 24, 400) == (pytest.approx(20 * 55.0 + evaluation), "its own runs")
    # ... so a run of half the trajectories a step takes half the time a step
    assert known.estimate("grpo", grpo, 20 * 12, 400) == (pytest.approx(20 * 27.5 + evaluation), "its own runs")
    assert known.estimate("grpo-no-loss-mask", grpo, 10 * 24, 400) == (pytest.approx(500 + evaluation), "its kind")
    assert known.estimate("ppo-no-masks", ppo, 10 * 24, 0) == (pytest.approx(900.0), "its kind")
    # a kind not measured yet: its algorithm's other runs (PPO's critic), else every run
    ppo_step = ("ppo", "step", False)
    assert known.estimate("ppo-step", ppo_step, 10 * 24, 0) == (pytest.approx(900.0), "its algorithm")
    assert known.estimate("rloo", rloo, 4 * 24, 400) == (pytest.approx(4 * 60.0 + evaluation), "all runs")
    assert Measurements({}, {}, [], 0).estimate("grpo", grpo, 5, 400) == (None, "nothing measured")
    text = describe([Planned("paper/dvc.yaml:run@grpo-0", 20, 1160.0, "its kind"), Planned("paper/dvc.yaml:report", 0, 0.0)])
    assert "run@grpo-0" in text and "~19 min  (step time of its kind)" in text and "total: ~0.3 h estimated" in text
    # a run out of date only because the warm start came out with other bytes (a CPU model it is not portable to)
    from flows.plan import only_the_warm_start_changed

    warm = describe([Planned("paper/dvc.yaml:run@grpo-0", 20, 1160.0, "its kind", warm_start_only=True)])
    assert "1 of them only because models/sft came out with other bytes" in warm and "only because" not in text
    assert only_the_warm_start_changed([{"changed deps": {"models/sft": "modified"}}])
    assert not only_the_warm_start_changed([{"changed deps": {"models/sft": "modified", "agent_r1/env": "modified"}}])
    # the curve scores its validation questions at step 0, every eval_every steps and at the end
    from agent_r1.config import LearningCurveConfig

    curve = LearningCurveConfig(experiment="grpo", steps=60, eval_every=10, eval_questions=100)
    assert questions_scored(curve, 500) == (6 + 2) * 100 and questions_scored(None, 500) == 500


def test_plan_leaves_out_what_runs_out_of_date_measured(tmp_path: Path) -> None:
    """A paper run whose stage is out of date for more than the warm start was trained with other
    params or code (another budget, on another machine): its seconds do not estimate the re-run."""
    from agent_r1.config import load_params, with_presets
    from flows.plan import Measurements, outdated_runs, trajectories_per_step

    status = {"paper/dvc.yaml:run@ppo-2": [{"changed deps": {"agent_r1/training": "modified"}}],
              "paper/dvc.yaml:run@rloo-0": [{"changed deps": {"models/sft": "modified"}}],
              "paper/dvc.yaml:report": [{"changed deps": {"paper/metrics/eval": "modified"}}]}
    assert outdated_runs(ROOT, list(status), status) == {"ppo.seed2"}
    default = load_params(ROOT / "params.yaml")
    paper = with_presets(default, ROOT / "paper" / "presets.yaml")
    for kind, runs in (("train", {"ppo.seed0": 2400.0, "ppo.seed2": 800.0}), ("eval", {"ppo.seed0": 600.0, "ppo.seed2": 200.0})):
        (tmp_path / "paper" / "metrics" / kind).mkdir(parents=True)
        for stem, seconds in runs.items():
            metrics = {"seconds": seconds, "steps": 40} if kind == "train" else {"seconds": seconds, "n": 500}
            (tmp_path / "paper" / "metrics" / kind / f"{stem}.json").write_text(json.dumps(metrics))
    every = Measurements.read(tmp_path, paper, default)
    current = Measurements.read(tmp_path, paper, default, frozenset({"ppo.seed2"}))
    assert len(every.trajectory_s["ppo"]) == 2 and len(every.question_s) == 2
    per_trajectory = 2400.0 / 40 / trajectories_per_step(paper, "ppo")
    assert current.trajectory_s["ppo"] == [pytest.approx(per_trajectory)] and current.question_s == [1.2]




def test_plan_counts_the_stages_up_to_date_at_the_seconds_they_recorded(tmp_path: Path) -> None:
    """The plan's last line is the whole set's cost: what the finished stages recorded (their JSON
    outputs' ``seconds``, found through the lock) plus the estimates of what is left to run."""
    from flows.plan import Planned, describe, locked_outputs, recorded_seconds

    lock = {"schema": "2.0", "stages": {"run@grpo-0": {"cmd": "x", "outs": [
        {"path": "paper/metrics/train/grpo.seed0.json"}, {"path": "paper/metrics/eval/grpo.seed0.json"},
        {"path": "paper/dvclive/grpo.seed0/metrics.json"}, {"path": "paper/outcomes/grpo.seed0.jsonl"}]}}}
    (tmp_path / "paper").mkdir()
    (tmp_path / "paper" / "dvc.lock").write_text(yaml.safe_dump(lock))
    outputs = {"metrics/train/grpo.seed0.json": {"seconds": 1000.0, "steps": 40},
               "metrics/eval/grpo.seed0.json": {"seconds": 500.0, "n": 500},
               "dvclive/grpo.seed0/metrics.json": {"time": {"step_s": 25.0}}}  # no seconds of its own
    for path, data in outputs.items():
        (tmp_path / "paper" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "paper" / path).write_text(json.dumps(data))
    outputs = locked_outputs(tmp_path, "paper/dvc.yaml")
    assert list(outputs) == ["paper/dvc.yaml:run@grpo-0"] and recorded_seconds(outputs["paper/dvc.yaml:run@grpo-0"]) == 1500.0
    assert locked_outputs(tmp_path, "other/dvc.yaml") == {} and recorded_seconds([]) == 0.0  # no lock yet
    done = [Planned("paper/dvc.yaml:run@grpo-0", 40, 1500.0, done=True), Planned("paper/dvc.yaml:report", 0, 0.0, done=True)]
    finished = describe(done)
    assert "nothing to run" in finished and "the whole set took ~0.4 h" in finished and "its 2 stages" in finished
    left = describe([*done, Planned("paper/dvc.yaml:run@grpo-1", 40, 5700.0, "its own runs"),
                     Planned("paper/dvc.yaml:run@ppo-0", 40, None, "nothing measured")])
    assert "2 stage(s) to run" in left and "run@grpo-0" not in left
    assert "the whole set: ~2.0 h and 1 run(s) not measured yet, ~0.4 h of it recorded by the 2 stages up to date" in left
# In `make test-slow` (about 3 min a variant): trains the presets for real, one rank and two
# (the stage re-launches itself under the deepspeed launcher with --presets).
@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_paper_presets_run_apart_from_the_default_pipeline(repo: Path, prefect_harness: None, ranks: int) -> None:
    from flows.pipeline import pipeline

    add_paper_presets(repo, ranks)
    # `dvc repro` of the default pipeline never trains a preset
    assert "Running stage" not in dvc(repo, "repro").stdout

    runs = pipeline(repo=str(repo), paper=True)
    assert [r.stage for r in runs if r.ran] == PAPER_STAGES  # the default stages were all cached
    for name in ("grpo.seed0", "grpo-no-loss-mask.seed0"):
        assert json.loads((repo / f"paper/metrics/eval/{name}.json").read_text())["n"] == 12  # 3 a source
        assert (repo / f"paper/outcomes/{name}.jsonl").exists()
        assert (repo / f"paper/dvclive/{name}/plots/metrics/eval/em.tsv").exists()
    curve = (repo / "paper/dvclive/curve/plots/metrics/eval/em.tsv").read_text().splitlines()
    assert len(curve) == 1 + 2  # a validation eval at each of the 2 steps
    report = (repo / "paper/reports/results.md").read_text()
    assert "| SFT warm start (no RL) |" in report and "| GRPO |" in report and "0.3877 |" in report
    assert "## Ablations (Table 4 shape)" in report and "| GRPO w/o loss mask | GRPO |" in report and "-0.0155 |" in report
    assert "## Learning curve (validation split)" in report and "- step 2: validation EM" in report
    assert "- step 0: validation EM" in report  # curve_start: the warm start on the same questions
    assert "Budget rule (the earliest eval within one standard error of the best)" in report
    assert "Trained (end of the curve, exported and re-scored" in report  # paired with curve_start
    for png in ("results", "training", "ablations", "learning_curve"):
        assert (repo / f"paper/reports/{png}.png").read_bytes()[:4] == b"\x89PNG"
    artifacts = _artifacts()
    assert {"paper-report", "paper-report-results", "report", "report-results"} <= set(artifacts)
    progress = artifacts["progress-run-grpo-no-loss-mask-0"]
    assert progress[-1].data == 100.0

    # running it again does nothing (the default stages' cached runs are the flow test's business)
    again = pipeline(PAPER_STAGES, repo=str(repo), paper=True)
    assert not [r.stage for r in again if r.ran]
    sh(["git", "add", "-A"], repo)
    sh(["git", "commit", "-qm", "paper run"], repo)

    # one preset's learning rate changes: only its runs, the curve (of that preset) and the report re-run. Asked of
    # DVC's own repro plan (`--dry`) rather than re-trained: the flow runs each stage with
    # `dvc repro --single-item`, whose ran/cached outcome both runs above exercised, and a
    # tiny preset costs ~100 s of the CI budget.
    presets = yaml.safe_load((repo / "paper/presets.yaml").read_text())
    presets["experiments"]["grpo"]["overrides"]["train"] = {"actor_lr": 2.0e-5}
    (repo / "paper/presets.yaml").write_text(yaml.safe_dump(presets, sort_keys=False))
    plan = dvc(repo, "repro", "--dry", "paper/dvc.yaml").stdout
    planned = [line for line in plan.splitlines() if line.startswith("Running stage")]
    # (the learning curve runs the grpo preset: its curve is stale too)
    assert planned == ["Running stage 'paper/dvc.yaml:curve':", "Running stage 'paper/dvc.yaml:curve_start':",
                       "Running stage 'paper/dvc.yaml:run@grpo-0':",
                       "Running stage 'paper/dvc.yaml:report':"]
    # the budget, chosen on the curve, changes: every run and the report re-run, the curve does not
    sh(["git", "checkout", "paper/presets.yaml"], repo)
    presets = yaml.safe_load((repo / "paper/presets.yaml").read_text())
    presets["budget"] = {"steps": 1}
    (repo / "paper/presets.yaml").write_text(yaml.safe_dump(presets, sort_keys=False))
    plan = dvc(repo, "repro", "--dry", "paper/dvc.yaml").stdout
    planned = [line for line in plan.splitlines() if line.startswith("Running stage")]
    assert planned == ["Running stage 'paper/dvc.yaml:run@grpo-0':", "Running stage 'paper/dvc.yaml:run@grpo-no-loss-mask-0':",
                       "Running stage 'paper/dvc.yaml:report':"]
    sh(["git", "checkout", "paper/presets.yaml"], repo)
    # what git holds is enough: without the trained policies and checkpoints (a fresh clone
    # after the default pipeline), the presets already run are up to date
    shutil.rmtree(repo / "paper/models")
    shutil.rmtree(repo / "paper/checkpoints")
    assert "Running stage" not in dvc(repo, "repro", "paper/dvc.yaml").stdout


# Slow suite: a minute of `make test`'s 15 on 2 cores (a queued DVC experiment runs the pipeline's
# index stage again); the sweep's points, schema checks and table are tested in tests/test_sweep.py.
@pytest.mark.slow
def test_sweep_queues_dvc_experiments_and_tabulates_them(repo: Path, prefect_harness: None) -> None:
    from flows.sweep import sweep

    if not (repo / "dvc.lock").exists():
        dvc(repo, "repro")
    sh(["git", "add", "-A"], repo)
    sh(["git", "commit", "-qm", "before sweep", "--allow-empty"], repo)
    # a cheap sweep (the index stage's k): the mechanism is the same for training params
    rows = sweep({"retrieval.top_k": ["2", "4"]}, targets=["index"], name="k", repo=str(repo))
    assert [r["experiment"] for r in rows] == ["HEAD", "k-0", "k-1"]
    assert [r["retrieval.top_k"] for r in rows] == ["", "2", "4"]
    # every evaluation's EM, carried over: the default pipeline's GRPO, not the paper preset of the same name
    grpo_em = json.loads((repo / "metrics/eval/grpo.json").read_text())["em"]
    assert [r["grpo.em"] for r in rows] == [grpo_em] * 3
    assert not any(k.startswith("paper/") for r in rows for k in r)  # unchanged by the sweep
    shown = dvc(repo, "exp", "show", "--json").stdout
    assert '"k-0"' in shown and '"k-1"' in shown
    # each experiment ran with its own params and has its own metrics, as DVC recorded them
    diff = json.loads(dvc(repo, "params", "diff", "HEAD", "k-1", "--json").stdout)
    assert diff["params.yaml"]["retrieval.top_k"]["new"] == 4
    metrics = json.loads(dvc(repo, "metrics", "diff", "HEAD", "k-0", "--json").stdout)
    assert metrics["metrics/retrieval.json"]["top_k"]["new"] == 2
    assert "sweep" in _artifacts()


# Slow suite: a minute of `make test`'s 15 on 2 cores, and the step representation and the managed
# context already train in-process in tests/test_trainer.py; this checks their DVC wiring.
@pytest.mark.slow
def test_step_level_training_with_a_managed_context_runs_through_dvc(repo: Path) -> None:
    """A second experiment from params alone: step representation, older observations by title.
    Only its own train and evaluate stages run; it trains one sample per step (more samples than
    episodes), and its evaluation plays the same managed context."""
    if not (repo / "dvc.lock").exists():
        dvc(repo, "repro")
    original = (repo / "params.yaml").read_text()
    params = yaml.safe_load(original)
    params["experiments"]["grpo_step"] = {"init": "sft", "overrides": {  # one RL step: the suite's time is short
        "env": {"one_shot": False, "context": {"keep_last": 1}}, "algorithm": {"representation": "step"},
        "train": {"steps": 1, "save_every": 1}}}
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        out = dvc(repo, "repro", "evaluate@grpo_step").stdout
        ran = [line for line in out.splitlines() if line.startswith("Running stage")]
        assert ran == ["Running stage 'train@grpo_step':", "Running stage 'evaluate@grpo_step':"]
        last = json.loads((repo / "metrics/train/grpo_step.json").read_text())["last"]
        assert last["samples"] == pytest.approx(4 * last["turns"])  # one sample per turn of 2 x 2 episodes
        assert json.loads((repo / "checkpoints/grpo_step/latest.json").read_text())["step"] == 1
        assert json.loads((repo / "metrics/eval/grpo_step.json").read_text())["n"] == 12  # 3 a source
        assert len((repo / "outcomes/grpo_step.jsonl").read_text().splitlines()) == 12
        flat = json.loads((repo / "metrics/train/grpo.json").read_text())["last"]
        assert flat["samples"] == 4  # one sample per episode
    finally:
        (repo / "params.yaml").write_text(original)


# The example task (examples/arithmetic.py) from params alone, at toy size. In `make test-slow`:
# it runs every stage up to evaluate@grpo again on a second repo.
EXAMPLE_TASK = {
    "data__source": "examples.arithmetic:ArithmeticProblems",
    "data__options": {"n_train": 24, "n_test": 8},
    "data__val_questions": 4,
    "env__tools": ["examples.arithmetic:Calculator"],
    "env__reward__scheme": "examples.arithmetic:numeric_reward",
    "sft__enabled": False,
    "plugins__code": "examples",
}


@pytest.mark.slow
def test_the_example_task_trains_through_dvc_from_params_alone(
    tmp_path_factory: pytest.TempPathFactory, policy_dir: Path, encoder_dir: Path
) -> None:
    repo = make_repo(tmp_path_factory.mktemp("example"), policy_dir, encoder_dir, **EXAMPLE_TASK)
    dvc(repo, "repro", "evaluate@grpo")
    data = json.loads((repo / "metrics/data.json").read_text())
    assert data["train"]["by_source"] == {"arithmetic": 20} and data["test"]["by_source"] == {"arithmetic": 8}
    assert json.loads((repo / "checkpoints/grpo/latest.json").read_text())["step"] == 2
    result = json.loads((repo / "metrics/eval/grpo.json").read_text())
    assert set(result["by_source"]) == {"arithmetic"} and result["n"] == 3
    history = (repo / "dvclive/grpo/plots/metrics/train/reward.tsv").read_text().splitlines()
    assert len(history) == 3  # header + one row per RL step

    # The plugin is code the stages depend on: editing it re-runs what uses it, and only that.
    with (repo / "examples/arithmetic.py").open("a") as f:
        f.write("\n# edited\n")
    status = dvc(repo, "status", "--json").stdout
    changed = set(json.loads(status))
    assert {"prepare", "train@grpo", "evaluate@grpo"} <= changed and "index" not in changed


@pytest.mark.slow
def test_a_plugin_stateful_env_trains_through_dvc_from_params_alone(
    tmp_path_factory: pytest.TempPathFactory, policy_dir: Path, encoder_dir: Path
) -> None:
    """A stateful environment of the user's own (written here into the repo's plugins package: the
    guess-the-number env and its games), trained and evaluated by `dvc repro` from params alone."""
    repo = make_repo(
        tmp_path_factory.mktemp("stateful"), policy_dir, encoder_dir,
        data__source="plugins.guess:GuessingGames", data__options={"n_train": 24, "n_test": 8},
        data__val_questions=4, env__name="plugins.guess:GuessNumber", env__options={"high": 20},
        env__max_turns=3, sft__enabled=False,
    )  # fmt: skip
    (repo / "plugins" / "guess.py").write_text((ROOT / "examples" / "guess_number.py").read_text())
    dvc(repo, "repro", "evaluate@grpo")
    assert json.loads((repo / "checkpoints/grpo/latest.json").read_text())["step"] == 2
    outcomes = [json.loads(line) for line in (repo / "outcomes/grpo.jsonl").read_text().splitlines()]
    assert len(outcomes) == 3 and {o["source"] for o in outcomes} == {"guess"}
    assert all(o["tool_calls"] >= 1 for o in outcomes)  # every turn is an action the env judged
    history = (repo / "dvclive/grpo/plots/metrics/train/reward.tsv").read_text().splitlines()
    assert len(history) == 3


# The text-world experiment at toy size: 6 small games, the same stages as textworld/params.yaml's.
TINY_TEXTWORLD = {
    "data": {"val_questions": 1, "options": {"n_train": 3, "n_test": 2, "n_ood": 1, "workers": 1,
                                             "world": {"rooms": 2, "objects": 2, "quest_length": 2},
                                             "ood_world": {"rooms": 3, "objects": 3, "quest_length": 3}}},
    "env": {"max_turns": 3},
    "rollout": {"n": 2, "batch_size": 8},
    "sft": {"n_demos": 2, "batch_size": 2, "question_types": ["quest2"]},
    "train": {"steps": 2, "questions_per_step": 2, "mini_batch_size": 4, "save_every": 2, "eval_every": 1,
              "eval_questions": 1},
}


@pytest.mark.slow
def test_the_text_world_experiment_runs_end_to_end_through_dvc(
    tmp_path_factory: pytest.TempPathFactory, policy_dir: Path, encoder_dir: Path
) -> None:
    """`dvc repro textworld/dvc.yaml`: games, the random and untrained baselines, the walkthrough warm
    start, GRPO and the report with success rates side by side, from its params file alone."""
    repo = make_repo(tmp_path_factory.mktemp("textworld"), policy_dir, encoder_dir)
    shutil.copytree(ROOT / "textworld", repo / "textworld",
                    ignore=shutil.ignore_patterns("data", "models", "checkpoints", "*.lock", "dvclive", "metrics",
                                                  "outcomes", "reports", ".gitignore"))
    params = _merge(yaml.safe_load((ROOT / "textworld/params.yaml").read_text()), copy.deepcopy(TINY_TEXTWORLD))
    (repo / "textworld/params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    dvc(repo, "repro", "textworld/dvc.yaml")
    games = sorted(p.name for p in (repo / "textworld/data/prepared/games").glob("*.z8"))
    assert len(games) == 6 and not (repo / "indexes").exists()  # no index: the env searches none
    for method in ("random", "base_tool_call", "sft", "grpo"):
        result = json.loads((repo / f"textworld/metrics/eval/{method}.json").read_text())
        assert result["n"] == 3 and set(result["by_source"]) == {"textworld", "textworld-ood"}
    assert json.loads((repo / "textworld/metrics/sft.json").read_text())["grounded_demos"] == 2  # both walkthroughs won
    assert json.loads((repo / "textworld/checkpoints/grpo/latest.json").read_text())["step"] == 2
    report = (repo / "textworld/reports/results.md").read_text()
    assert "EM is the success rate" in report and "| Random legal action |" in report
    assert "| grpo | SFT warm start (no RL) |" in report.split("## Paired comparisons")[1]
    assert "textworld/dvc.yaml:report" not in dvc(repo, "status", "textworld/dvc.yaml").stdout
