"""The RL loop and the warm start, end to end on a tiny random Llama that shares
the real tokenizer (so the real chat template, env and rollout run unchanged)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from agent_r1.config import AlgorithmConfig, Params, RetrievalConfig, SyntheticConfig
from agent_r1.data.synthetic import generate
from agent_r1.env import SearchTool, ToolEnv
from agent_r1.retrieval import build_index, load_index
from agent_r1.rollout.trajectory import TrajectoryBatch
from agent_r1.training.expert import expert_plan
from agent_r1.training.sft import expert_demonstrations, keep_grounded, train_sft
from agent_r1.training.batching import global_denominator, minibatches
from agent_r1.training.models import unwrap
from agent_r1.training.loop import build_models, iteration_questions, shard, train_rl, update_from_rollout


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[pd.DataFrame, Path]:
    questions, corpus = generate(SyntheticConfig(n_train=40, n_test=20, n_test_ood=10, n_test_ood_2hop=10, n_test_paraphrase=10, entities_per_type=40), seed=5)
    index_dir = tmp_path_factory.mktemp("index") / "bm25"
    build_index("bm25", corpus, index_dir, RetrievalConfig())
    return questions, index_dir


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory: pytest.TempPathFactory, policy_dir: Path) -> Path:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(policy_dir)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    out = tmp_path_factory.mktemp("tiny") / "policy"
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def tiny_params(**train: object) -> Params:
    p = Params()
    return p.model_copy(update={
        "env": p.env.model_copy(update={"one_shot": False, "max_turns": 3}),
        "rollout": p.rollout.model_copy(update={"n": 2, "max_new_tokens": 12, "max_total_tokens": 600}),
        "train": p.train.model_copy(update={"steps": 2, "questions_per_step": 2, "mini_batch_size": 4,
                                            "save_every": 1, "eval_every": 2, "micro_batch_tokens": 512,
                                            "bf16": False, "lora": None, **train}),  # full fine-tuning unless given
        "sft": p.sft.model_copy(update={"n_demos": 4, "batch_size": 2}),
        # a KL term (params.yaml has none on CPU), so every run here builds and checkpoints the reference too
        "algorithm": p.algorithm.model_copy(update={"kl_coef": 0.001}),
    })


def records(questions: pd.DataFrame, split: str) -> list[dict]:
    return questions[questions["split"] == split].to_dict("records")


# ------------------------------------------------------------------ pure helpers
def test_iteration_questions_are_seeded_and_shards_keep_groups() -> None:
    qs = [{"id": i} for i in range(50)]
    assert iteration_questions(qs, 6, 3, 0) == iteration_questions(qs, 6, 3, 0)
    assert iteration_questions(qs, 6, 3, 0) != iteration_questions(qs, 6, 4, 0)
    picked = iteration_questions(qs, 6, 3, 0)
    assert shard(picked, 0, 2) + shard(picked, 1, 2) != [] and sorted(
        q["id"] for q in shard(picked, 0, 2) + shard(picked, 1, 2)
    ) == sorted(q["id"] for q in picked)


def test_minibatches_cover_every_row_once_per_epoch() -> None:
    passes = list(minibatches([8] * 10, epochs=2, rows=4, token_budget=16, seed=0))
    assert [len(rows) for rows, _ in passes] == [4, 4, 2, 4, 4, 2]
    for rows, groups in passes:
        assert sorted(r for g in groups for r in g) == sorted(rows)
        assert all(len(g) * 8 <= 16 for g in groups)
    assert global_denominator(12.0, 1) == 12.0 and global_denominator(0.0, 1) == 1.0


# ------------------------------------------------------------------ warm start
def test_expert_demonstrations_are_grounded_token_exact(world, policy_dir: Path) -> None:
    from transformers import AutoTokenizer

    questions, index_dir = world
    tok = AutoTokenizer.from_pretrained(policy_dir)
    params = tiny_params()
    env = ToolEnv([SearchTool(load_index(index_dir), 3)], params.env)
    recs = records(questions, "train")[:6]
    demos = expert_demonstrations(params, tok, env, recs)
    # gold sub-queries surface every supporting doc almost always (retrieval is not perfect)
    assert len(keep_grounded(demos)) >= 5
    for i, rec in enumerate(recs):
        acted = tok.decode(demos.input_ids[i][demos.action_mask[i].bool()].tolist())
        assert acted == "".join(expert_plan(rec, "tags"))  # the action tokens are exactly the plan
        assert demos.info[i]["em"] == 1.0 and demos.info[i]["turns"] == len(expert_plan(rec, "tags"))


def test_sft_lowers_the_demonstrations_nll(world, tiny_policy: Path, tmp_path: Path) -> None:
    questions, index_dir = world
    params = tiny_params()
    params = params.model_copy(update={"sft": params.sft.model_copy(update={"lr": 1e-2, "epochs": 5})})
    out = tmp_path / "sft"
    summary = train_sft(params, init_model=tiny_policy, index_path=index_dir,
                        train_questions=records(questions, "train"), out_model=out)
    assert summary["grounded_demos"] == 4 and summary["optimizer_steps"] == 10
    assert summary["final_nll"] < summary["first_nll"] * 0.75  # from ~10.8 (uniform over the vocabulary)
    assert (out / "model.safetensors").exists()


# ------------------------------------------------------------------ RL
def two_samples() -> TrajectoryBatch:
    """Two samples of one question (random tokens, actions at 4..9), rewards 1 and 0."""
    ids = torch.randint(10, 1000, (2, 12))
    action = torch.zeros(2, 12, dtype=torch.long)
    action[:, 4:10] = 1
    rewards = torch.zeros(2, 12)
    rewards[0, 9] = 1.0
    return TrajectoryBatch(
        input_ids=ids, attention_mask=torch.ones_like(ids), action_mask=action,
        turn_index=torch.where(action.bool(), 0, -1), token_rewards=rewards, rollout_logprobs=torch.zeros(2, 12),
        group_id=torch.tensor([0, 0]), prompt_length=torch.tensor([4, 4]), info=[{}, {}],
    )


def test_grpo_step_moves_logprobs_towards_the_better_sample(tiny_policy: Path) -> None:
    """Two samples of one question, rewards 1 and 0: one update raises the first's
    logprob and lowers the second's (the direction of the policy gradient)."""
    from agent_r1.training.logprobs import batched_token_logprobs

    params = tiny_params()
    params = params.model_copy(update={"train": params.train.model_copy(update={"actor_lr": 1e-3})})
    models = build_models(params, tiny_policy)
    batch = two_samples()

    def seq_logprob() -> torch.Tensor:
        return (batched_token_logprobs(models.actor, batch.input_ids, batch.attention_mask, 512) * batch.action_mask).sum(-1)

    before = seq_logprob()
    metrics = update_from_rollout(params, models, batch)
    after = seq_logprob()
    assert after[0] > before[0] and after[1] < before[1]
    assert metrics["clipfrac"] == 0.0  # exactly on-policy: ratio 1


PLUGIN_ESTIMATORS = """
def td_error(token_rewards, values, action_mask):
    return (token_rewards - values) * action_mask, token_rewards

td_error.needs_critic = True

def outcome(token_rewards, action_mask):
    adv = token_rewards.sum(-1, keepdim=True) * action_mask
    return adv, adv
"""


def test_a_plugin_estimator_trains_with_a_critic_when_it_asks_for_one(
    tiny_policy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``algorithm.name: module:fn`` from the user's code: its ``needs_critic`` decides the critic."""
    (tmp_path / "trainer_estimators.py").write_text(PLUGIN_ESTIMATORS)
    monkeypatch.syspath_prepend(str(tmp_path))
    batch = two_samples()
    for name, critic in (("trainer_estimators:td_error", True), ("trainer_estimators:outcome", False)):
        params = tiny_params().model_copy(update={"algorithm": AlgorithmConfig(name=name, kl_coef=0.0)})
        models = build_models(params, tiny_policy)
        assert (models.critic is not None) is critic, name
        metrics = update_from_rollout(params, models, batch)
        assert ("value_loss" in metrics) is critic and metrics["advantage_abs"] > 0, name


def test_a_plugin_estimators_code_is_part_of_the_run_fingerprint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Editing the user's estimator is a change of training code: its checkpoint is not resumed."""
    from agent_r1.training.checkpoint import code_hash, run_fingerprint

    plugin = tmp_path / "fingerprinted_estimators.py"
    plugin.write_text(PLUGIN_ESTIMATORS)
    monkeypatch.syspath_prepend(str(tmp_path))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    params = tiny_params().model_copy(
        update={"algorithm": AlgorithmConfig(name="fingerprinted_estimators:outcome")})

    def code(p: Params) -> str:
        return run_fingerprint(p, model, "http://index", [], [])["code"]

    before = code(params)
    assert code(tiny_params()) == code_hash() != before
    plugin.write_text(PLUGIN_ESTIMATORS + "\n# edited\n")
    assert code(params) != before


def test_train_rl_runs_checkpoints_resumes_and_exports(world, tiny_policy: Path, tmp_path: Path) -> None:
    questions, index_dir = world
    test = records(questions, "test")[:3]
    kw = dict(init_model=tiny_policy, index_path=index_dir, train_questions=records(questions, "train"),
              eval_questions=test, out_model=tmp_path / "out", checkpoint_dir=tmp_path / "ckpt",
              live_dir=tmp_path / "live")
    train_rl(tiny_params(steps=1), **kw)
    assert json.loads((tmp_path / "ckpt" / "latest.json").read_text())["step"] == 1
    second = train_rl(tiny_params(steps=2), **kw)  # more steps, same run: resumes at step 1
    assert second["steps"] == 2 and second["start_step"] == 1
    rewards = (tmp_path / "live/plots/metrics/train/reward.tsv").read_text().strip().splitlines()
    assert len(rewards) == 1 + 2  # header + one row per step, none repeated
    # as a 2-step run evaluates (eval_every 2): at step 2 only, not at the 1-step run's end
    assert (tmp_path / "live/plots/metrics/eval/em.tsv").read_text().splitlines()[1:] == [
        f"1\t{second['last']['eval/em']}"
    ]
    assert (tmp_path / "out/model.safetensors").exists()
    for key in ("reward", "answer_rate", "tool_calls", "pg_loss", "grad_norm", "time/rollout_s", "tokens_per_s"):
        assert key in second["last"], key
    # other params: the checkpoint is not resumed
    third = train_rl(tiny_params(steps=2, actor_lr=1e-4), **kw)
    assert third["start_step"] == 0


def test_ppo_trains_a_critic(world, tiny_policy: Path, tmp_path: Path) -> None:
    questions, index_dir = world
    params = tiny_params(steps=1)
    params = params.model_copy(update={"algorithm": params.algorithm.model_copy(update={"name": "ppo", "kl_coef": 0.01})})
    out = train_rl(params, init_model=tiny_policy, index_path=index_dir, train_questions=records(questions, "train"),
                   eval_questions=records(questions, "test")[:2], out_model=tmp_path / "out",
                   checkpoint_dir=tmp_path / "ckpt", live_dir=tmp_path / "live")
    for key in ("value_loss", "vf_clipfrac", "explained_variance", "kl"):
        assert key in out["last"], key


def test_train_rl_with_lora_syncs_checkpoints_resumes_and_exports_the_merged_model(
    world, tiny_policy: Path, tmp_path: Path
) -> None:
    """train.lora end to end: the rollout samples with the merged weights (its log-probs match the
    trainer's after an update that moved them), a killed run resumes from its checkpoint and ends like
    an uninterrupted one, and the exported folder is a plain model (no adapter keys)."""
    from transformers import AutoModelForCausalLM

    from agent_r1.config import LoRAConfig

    params = tiny_params(steps=2, actor_lr=1e-2, lora=LoRAConfig(rank=4, alpha=16))
    # an entropy bonus: the tiny random policy earns no reward, and the KL to the base is 0 at first
    params = params.model_copy(update={"algorithm": params.algorithm.model_copy(update={"entropy_coef": 0.01})})
    ref = train_rl(params, **run_kw(world, tiny_policy, tmp_path / "ref"))
    assert 0 < ref["last"]["rollout_mismatch"] < 1e-4  # stale or unmerged weights: ~lr-sized differences
    train_rl(params.model_copy(update={"train": params.train.model_copy(update={"steps": 1})}),
             **run_kw(world, tiny_policy, tmp_path / "run"))
    resumed = train_rl(params, **run_kw(world, tiny_policy, tmp_path / "run"))
    assert resumed["start_step"] == 1
    assert_same_run(tmp_path / "ref", ref, tmp_path / "run", resumed)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "ref" / "model")
    assert not any("lora" in k or "base_layer" in k for k in model.state_dict())
    init = exported(tiny_policy)
    moved = exported(tmp_path / "ref" / "model")
    assert moved.keys() - {"lm_head.weight"} == init.keys()  # exports write the tied head too, LoRA or not
    assert any(not torch.equal(moved[k], init[k]) for k in init)
    assert torch.equal(moved["model.embed_tokens.weight"], init["model.embed_tokens.weight"])  # not adapted


# All in the slow suite (20-60 s each of `make test`): two ranks are checked in `make test` by
# test_deepspeed_ranks.py (ZeRO-2 updates against one rank, kill -9 and resume) and test_weight_sync.py
# (each rank's engine gets the full weights, ZeRO-2 and ZeRO-3); ZeRO-3 on one rank by test_training_infra.py;
# test_lora.py checks the merged sync buckets on one rank.
@pytest.mark.slow
@pytest.mark.parametrize("stage,lora", [(2, False), (3, False), (3, True)], ids=["zero2", "zero3", "zero3-lora"])
def test_train_rl_on_two_ranks(stage: int, lora: bool, world, tiny_policy: Path, tmp_path: Path) -> None:
    """The whole RL loop under the deepspeed launcher: 2 CPU ranks, ZeRO-2 and ZeRO-3
    (weights gathered from shards for the rollout engine, merged when LoRA trains), checkpoint and export."""
    from agent_r1.config import LoRAConfig

    import os
    import subprocess
    import sys

    from agent_r1.training.distributed import free_port
    from tasks.dvc_stage import DISTRIBUTED_VARS

    questions, index_dir = world
    qfile = tmp_path / "questions.parquet"
    questions.to_parquet(qfile)
    pfile = tmp_path / "params.json"
    lora_cfg = LoRAConfig(rank=4) if lora else None
    pfile.write_text(tiny_params(steps=2, zero_stage=stage, num_procs=2, lora=lora_cfg).model_dump_json())
    root = Path(__file__).resolve().parents[1]
    cmd = [
        str(Path(sys.executable).parent / "deepspeed"), "--num_accelerators", "2", "--master_port", str(free_port()),
        str(root / "tests/scripts/rl_ranks.py"), "--params", str(pfile), "--policy", str(tiny_policy),
        "--index", str(index_dir), "--questions", str(qfile), "--out", str(tmp_path / "run"),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_VARS}
    env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONPATH=str(root))
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    run = tmp_path / "run"
    summaries = [json.loads((run / f"summary_rank{r}.json").read_text()) for r in (0, 1)]
    assert [s["steps"] for s in summaries] == [2, 2]
    # metrics are all-reduced over ranks: both ranks log the same step
    assert summaries[0]["last"]["reward"] == pytest.approx(summaries[1]["last"]["reward"])
    assert json.loads((run / "ckpt" / "latest.json").read_text())["step"] == 2
    assert (run / "model" / "model.safetensors").exists()
    assert len((run / "live/plots/metrics/train/reward.tsv").read_text().strip().splitlines()) == 1 + 2


# ------------------------------------------------------------------ what a re-run reuses
TIMING = ("time/", "tokens_per_s")


def untimed(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not any(t in k for t in TIMING)}


def live_rows(live_dir: Path) -> dict[str, str]:
    """Every dvclive metric history but the timings (rows are `step<TAB>value`)."""
    tsvs = {p.relative_to(live_dir).as_posix(): p for p in sorted(live_dir.rglob("*.tsv"))}
    return {name: p.read_text() for name, p in tsvs.items() if "/time/" not in name and "tokens_per_s" not in name}


def live_summary(live_dir: Path) -> dict:
    summary = json.loads((live_dir / "metrics.json").read_text())
    summary.pop("time", None)
    summary["train"].pop("tokens_per_s", None)
    return summary


def exported(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(model_dir / "model.safetensors")


def assert_same_run(ref: Path, ref_summary: dict, run: Path, run_summary: dict) -> None:
    """Same exported weights (bitwise), same metrics and dvclive history (timings aside)."""
    a, b = exported(ref / "model"), exported(run / "model")
    assert a.keys() == b.keys()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    assert untimed(run_summary["last"]) == untimed(ref_summary["last"])
    rows = live_rows(ref / "live")
    assert {"plots/metrics/train/grad_norm.tsv", "plots/metrics/eval/em.tsv"} <= set(rows)
    assert live_rows(run / "live") == rows
    assert live_summary(run / "live") == live_summary(ref / "live")


def run_kw(world, init: Path, out: Path) -> dict:
    questions, index_dir = world
    return dict(init_model=init, index_path=index_dir, train_questions=records(questions, "train"),
                eval_questions=records(questions, "test")[:2], out_model=out / "model",
                checkpoint_dir=out / "ckpt", live_dir=out / "live")


def test_a_checkpoint_of_another_init_model_or_code_is_not_resumed(world, tiny_policy: Path, tmp_path: Path, caplog) -> None:
    """Same params and init *path*: new weights there, or other training code, start afresh and say why."""
    import shutil

    from safetensors.torch import load_file, save_file

    init = tmp_path / "init"
    shutil.copytree(tiny_policy, init)
    kw = run_kw(world, init, tmp_path / "run")
    assert train_rl(tiny_params(steps=1), **kw)["start_step"] == 0
    assert train_rl(tiny_params(steps=1), **kw)["start_step"] == 1  # the same run: reused
    weights = load_file(init / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name] + 1e-3  # the warm start was re-trained: same path, same size
    save_file(weights, init / "model.safetensors", metadata={"format": "pt"})
    caplog.set_level("WARNING", logger="agent_r1.training.checkpoint")
    assert train_rl(tiny_params(steps=1), **kw)["start_step"] == 0
    assert "other init model" in caplog.text
    latest = kw["checkpoint_dir"] / "latest.json"
    stored = json.loads(latest.read_text())
    stored["fingerprint"]["code"] = "written by other training code"
    latest.write_text(json.dumps(stored))
    caplog.clear()
    assert train_rl(tiny_params(steps=1), **kw)["start_step"] == 0
    assert "other training code" in caplog.text and "init model" not in caplog.text


def test_the_code_hash_covers_the_training_code_only(tmp_path: Path) -> None:
    import shutil

    import agent_r1
    from agent_r1.training.checkpoint import code_hash

    package = tmp_path / "agent_r1"
    shutil.copytree(Path(agent_r1.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__"))
    before = code_hash(package)
    (package / "stages" / "report.py").write_text("# a report change does not touch training\n")
    assert code_hash(package) == before
    with open(package / "algorithms" / "advantages.py", "a") as fh:
        fh.write("\n# a change of the RL objective's code\n")
    assert code_hash(package) != before


def test_lowering_steps_exports_exactly_the_run_params_describe(world, tiny_policy: Path, tmp_path: Path, caplog) -> None:
    """A 2-step run's folder, re-run with steps 1, ends as a fresh 1-step run: its kept
    step-1 checkpoint, metrics and dvclive history (with the final evaluation the 2-step
    run did not do at step 1); below every kept checkpoint it re-trains."""
    from safetensors.torch import load_file

    kw = run_kw(world, tiny_policy, tmp_path / "run")
    train_rl(tiny_params(steps=2, eval_every=2), **kw)
    lowered = train_rl(tiny_params(steps=1, eval_every=2), **kw)
    assert lowered["start_step"] == 1
    ref_kw = run_kw(world, tiny_policy, tmp_path / "ref")
    ref = train_rl(tiny_params(steps=1, eval_every=2), **ref_kw)
    assert "eval/em" in ref["last"]
    assert_same_run(tmp_path / "ref", ref, tmp_path / "run", lowered)
    caplog.set_level("WARNING", logger="agent_r1.training.checkpoint")
    none = train_rl(tiny_params(steps=0), **ref_kw)  # below the only kept checkpoint (step 1)
    assert none["start_step"] == 0 and "below every kept checkpoint" in caplog.text
    init, out = load_file(tiny_policy / "model.safetensors"), exported(tmp_path / "ref" / "model")
    assert all(torch.equal(init[k], out[k]) for k in init)


# ------------------------------------------------------------------ kill -9 of the real loop
def kill_params(steps: int) -> Params:
    """PPO (actor, critic, reference engines), 2 epochs x 2 mini-batches (shuffles), LR warm-up."""
    p = tiny_params(steps=steps, ppo_epochs=2, mini_batch_size=2, actor_lr=1e-3, critic_lr=1e-3, warmup_steps=2)
    return p.model_copy(update={"algorithm": p.algorithm.model_copy(update={"name": "ppo", "kl_coef": 0.01})})


def run_killed(world, policy: Path, params: Params, out: Path, kills: list[tuple[str, int]]) -> dict:
    """tests/scripts/rl_kill.py in a subprocess, SIGKILLed at each of ``kills`` in turn, then
    run to the end in the same folders; returns the last run's summary."""
    import os
    import signal
    import subprocess
    import sys

    from tasks.dvc_stage import DISTRIBUTED_VARS

    questions, index_dir = world
    out.mkdir(parents=True)
    questions.to_parquet(out / "questions.parquet")
    (out / "params.json").write_text(params.model_dump_json())
    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, str(root / "tests/scripts/rl_kill.py"), "--params", str(out / "params.json"),
           "--policy", str(policy), "--index", str(index_dir), "--questions", str(out / "questions.parquet"),
           "--out", str(out), "--threads", str(torch.get_num_threads())]
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_VARS}
    env.update(DS_ACCELERATOR="cpu", PYTHONPATH=str(root))
    for kill, step in [*kills, (None, 0)]:
        extra = [] if kill is None else ["--kill", kill, "--kill-step", str(step)]
        proc = subprocess.run(cmd + extra, cwd=root, env=env, capture_output=True, text=True)
        expected = 0 if kill is None else -signal.SIGKILL
        assert proc.returncode == expected, f"{kill}@{step}: rc {proc.returncode}\n{(proc.stdout + proc.stderr)[-4000:]}"
    return json.loads((out / "summary.json").read_text())


def uninterrupted(world, policy: Path, params: Params, out: Path) -> dict:
    questions, _ = world
    kw = run_kw(world, policy, out)
    kw["eval_questions"] = records(questions, "test")[:2]  # as rl_kill.py
    return train_rl(params, **kw)


# Slow suite: three subprocess runs of the PPO loop (1-2 min). The fast suite's kill -9 + resume is
# tests/test_deepspeed_ranks.py's (bit-identical), its in-process resume test_train_rl_runs_checkpoints_resumes_and_exports.
@pytest.mark.slow
def test_kill_9_mid_rollout_and_before_export_then_resume_ends_like_an_uninterrupted_run(
    world, tiny_policy: Path, tmp_path: Path
) -> None:
    """Killed in step 2's rollout, then again after the last checkpoint but before the
    export: the third run ends with the uninterrupted run's weights, metrics and history."""
    params = kill_params(steps=2)
    ref = uninterrupted(world, tiny_policy, params, tmp_path / "ref")
    resumed = run_killed(world, tiny_policy, params, tmp_path / "killed", [("rollout", 2), ("export", 0)])
    assert resumed["start_step"] == 2
    assert_same_run(tmp_path / "ref", ref, tmp_path / "killed", resumed)


@pytest.mark.slow
@pytest.mark.parametrize("kill", ["rollout", "save", "publish"])
def test_kill_9_at_every_point_of_a_step_then_resume_ends_like_an_uninterrupted_run(
    kill: str, world, tiny_policy: Path, tmp_path: Path
) -> None:
    """Mid-rollout, mid-way through DeepSpeed's checkpoint files, and with the files written
    but latest.json not yet updated: all resume from step 1 and end where an uninterrupted run ends."""
    params = kill_params(steps=3)
    ref = uninterrupted(world, tiny_policy, params, tmp_path / "ref")
    resumed = run_killed(world, tiny_policy, params, tmp_path / "killed", [(kill, 2)])
    assert resumed["start_step"] == 1
    assert_same_run(tmp_path / "ref", ref, tmp_path / "killed", resumed)


def test_a_same_dtype_rollout_engine_samples_with_the_actors_own_weights(tiny_policy: Path) -> None:
    """ZeRO-2, fp32 both sides: no second copy of the weights, and each optimizer step is what the
    next rollout sees; a bf16 engine gets a copy, as before."""
    from agent_r1.rollout import TransformersEngine
    from agent_r1.training.weight_sync import sync_rollout_weights

    params = tiny_params(actor_lr=1e-3)
    models = build_models(params, tiny_policy)
    shared, copied = TransformersEngine(tiny_policy, dtype="float32"), TransformersEngine(tiny_policy, dtype="bfloat16")
    for engine in (shared, copied):
        sync_rollout_weights(models.actor, engine)
    actor = dict(unwrap(models.actor).named_parameters())
    assert all(p.data_ptr() == actor[n].data_ptr() for n, p in shared.model.named_parameters())
    assert not any(p.data_ptr() == actor[n].data_ptr() for n, p in copied.model.named_parameters())

    before = {n: p.detach().clone() for n, p in actor.items()}
    update_from_rollout(params, models, two_samples())
    moved = [n for n, p in actor.items() if not torch.equal(p, before[n])]
    assert moved and all(torch.equal(dict(shared.model.named_parameters())[n], actor[n]) for n in moved)
    assert torch.equal(shared.head_weight, unwrap(models.actor).get_output_embeddings().weight)


def turn_samples(turns: int) -> TrajectoryBatch:
    """Two samples of one question: a 4-token prompt, then ``turns`` turns of 3 action tokens (each but
    the last followed by a 3-token observation); outcome rewards 1 and 0 on the last action token."""
    length = 4 + 3 * turns + 3 * (turns - 1)
    ids = torch.randint(10, 1000, (2, length))
    action, turn = torch.zeros(2, length, dtype=torch.long), torch.full((2, length), -1)
    for k in range(turns):
        start = 4 + 6 * k
        action[:, start:start + 3] = 1
        turn[:, start:start + 6] = k
    rewards = torch.zeros(2, length)
    rewards[0, length - 1] = 1.0
    return TrajectoryBatch(
        input_ids=ids, attention_mask=torch.ones_like(ids), action_mask=action, turn_index=turn,
        token_rewards=rewards, rollout_logprobs=torch.zeros(2, length), group_id=torch.tensor([0, 0]),
        prompt_length=torch.tensor([4, 4]), info=[{}, {}],
    )


def test_step_representation_with_one_step_per_episode_is_the_flat_update(tiny_policy: Path) -> None:
    """One turn per episode: a step sample is the trajectory itself and step GRPO is flat GRPO,
    so both representations leave the actor with the same weights."""
    batch = turn_samples(1)
    weights = []
    for representation in ("flat", "step"):
        params = tiny_params(actor_lr=1e-3)
        params = params.model_copy(update={"algorithm": params.algorithm.model_copy(
            update={"representation": representation, "kl_coef": 0.0})})
        models = build_models(params, tiny_policy)
        metrics = update_from_rollout(params, models, batch)
        assert metrics["advantage_abs"] > 0
        weights.append({n: p.detach().clone() for n, p in unwrap(models.actor).named_parameters()})
    assert all(torch.allclose(weights[0][n], weights[1][n], atol=1e-6) for n in weights[0])


def test_step_representation_trains_each_turn_as_its_own_sample(tiny_policy: Path) -> None:
    from agent_r1.rollout.steps import steps_from_trajectories
    from agent_r1.training.logprobs import batched_token_logprobs

    params = tiny_params(actor_lr=1e-3)
    params = params.model_copy(update={"algorithm": params.algorithm.model_copy(update={"representation": "step"})})
    models = build_models(params, tiny_policy)
    batch = turn_samples(3)
    steps = steps_from_trajectories(batch)
    assert len(steps) == 3 * len(batch)  # one sample per turn

    def episode_logprob() -> torch.Tensor:
        lp = batched_token_logprobs(models.actor, steps.input_ids, steps.attention_mask, 512) * steps.action_mask
        return torch.zeros(len(batch)).index_add_(0, steps.episode, lp.sum(-1))

    before = episode_logprob()
    metrics = update_from_rollout(params, models, batch)
    after = episode_logprob()
    assert metrics["samples"] == len(steps) and after[0] > before[0] and after[1] < before[1]


def test_step_representation_trains_a_critic_with_one_value_per_step(tiny_policy: Path) -> None:
    """PPO on steps: the critic's value of a step is read at its last prompt token (the state it acts
    from), step-level GAE turns those into returns, and one update moves each step's value towards them."""
    from agent_r1.training.loop import estimator_settings, update_settings
    from agent_r1.training.samples import step_samples
    from agent_r1.training.update import critic_values

    params = tiny_params(actor_lr=1e-3, critic_lr=1e-3)
    params = params.model_copy(update={"algorithm": params.algorithm.model_copy(
        update={"name": "ppo", "representation": "step", "gamma": 0.9, "lam": 0.95})})
    models = build_models(params, tiny_policy)
    assert models.critic is not None
    batch = turn_samples(3)
    samples = step_samples(batch)
    steps, vmask = samples.credit.steps, samples.value_mask.bool()

    def values_and_credit() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        values = critic_values(models, samples, update_settings(params))
        return values, *samples.credit.advantages(values, estimator_settings(params))

    values, advantages, returns = values_and_credit()
    assert vmask.sum(-1).tolist() == [1] * len(steps)
    assert (vmask.nonzero()[:, 1] == steps.prompt_length - 1).all()
    assert ((values != 0) <= vmask).all() and ((returns != 0) <= vmask).all()
    assert (advantages[steps.action_mask == 0] == 0).all()

    metrics = update_from_rollout(params, models, batch)
    after, _, _ = values_and_credit()
    error = lambda v: (v - returns)[vmask].abs().mean()  # noqa: E731
    assert "value_loss" in metrics and "explained_variance" in metrics
    assert error(after) < error(values)


def test_grpo_without_the_loss_mask_trains_observations_with_their_turns_advantage() -> None:
    """The ablation is not a rescale: the loss reads observation tokens, and they carry the advantage."""
    from agent_r1.training.loop import estimator_settings
    from agent_r1.training.samples import flat_samples

    batch = turn_samples(2)
    est = estimator_settings(tiny_params())
    on_samples, off_samples = flat_samples(batch, loss_masked=True), flat_samples(batch, loss_masked=False)
    on, _ = on_samples.credit.advantages(None, est)
    off, _ = off_samples.credit.advantages(None, est)
    obs = (batch.action_mask == 0) & (batch.turn_index >= 0)
    assert (on[obs] == 0).all() and (off[obs] != 0).all()
    assert torch.equal(off[batch.action_mask == 1], on[batch.action_mask == 1])
    assert torch.equal(off[:, 7:10], on[:, 6:7].expand(-1, 3))  # turn 0's observation: its action's advantage
    assert (off_samples.loss_mask[obs] == 1).all() and (on_samples.loss_mask[obs] == 0).all()


# The default engine (transformers, float32) and the trainer (DeepSpeed, packed micro-batches) compute
# the same float32 log-probs up to rounding: measured mean ~1e-6. A misplaced position, a stale
# weight or a logprob at the wrong temperature gives 1e-2 to 1.
ROLLOUT_MISMATCH_TOL = 1e-4


# step in the slow suite: its samples are the same tokens re-cut per turn (tests/test_steps.py), scored by the same code
@pytest.mark.parametrize("representation", ["flat", pytest.param("step", marks=pytest.mark.slow)])
def test_the_default_engines_logprobs_match_the_trainers(representation: str, world, policy_dir: Path) -> None:
    """The real policy, a real multi-turn rollout with the default engine, then the update: its
    ``rollout_mismatch`` (engine vs trainer log-probs of the sampled tokens) is within the tolerance."""
    from agent_r1.env import make_env
    from agent_r1.rollout import make_rollout_engine, run_episodes

    questions, index_dir = world
    params = Params()
    params = params.model_copy(update={
        "rollout": params.rollout.model_copy(update={"n": 2, "max_new_tokens": 24}),
        "env": params.env.model_copy(update={"max_turns": 2}),
        "algorithm": params.algorithm.model_copy(update={"representation": representation}),
        "train": params.train.model_copy(update={"mini_batch_size": 2}),
    })
    engine = make_rollout_engine(policy_dir, params.rollout)
    batch = run_episodes(engine, make_env(params, index_dir), engine.tokenizer, records(questions, "train")[:1],
                         params.rollout)
    assert int(batch.action_mask.sum()) > 0
    metrics = update_from_rollout(params, build_models(params, policy_dir), batch)
    print(f"\n{representation}: rollout_mismatch {metrics['rollout_mismatch']:.2e}")
    assert 0 < metrics["rollout_mismatch"] < ROLLOUT_MISMATCH_TOL
