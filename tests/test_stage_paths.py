"""Stage paths are command arguments: each dvc.yaml cmd passes the paths its stage declares."""

from __future__ import annotations

import importlib
import inspect
import shlex
from pathlib import Path, PurePosixPath

import pytest
import yaml

from agent_r1.stages.common import stage_parser

ROOT = Path(__file__).resolve().parents[1]
# Written but deliberately undeclared (the dvc.yaml files say why): checkpoints, and a preset's trained policy.
BY_PRODUCTS = {"paper/dvc.yaml": ("paper/models/trained", "paper/models/curve", "paper/checkpoints"), "dvc.yaml": ("checkpoints",),
               "textworld/dvc.yaml": ("textworld/checkpoints",)}


def _declared(stage: dict) -> tuple[set[str], set[str]]:
    """The stage's deps, and its outs + metrics + plots (entries are paths or one-key dicts)."""
    def names(key: str) -> set[str]:
        return {e if isinstance(e, str) else next(iter(e)) for e in stage.get(key, [])}

    return names("deps"), names("outs") | names("metrics") | names("plots")


def _related(a: str, b: str) -> bool:
    """Same path, or one inside the other (an argument may name a folder of declared files, or a file of a declared folder)."""
    pa, pb = PurePosixPath(a), PurePosixPath(b)
    return pa == pb or pa in pb.parents or pb in pa.parents


def _stages(dvcfile: str) -> list[tuple[str, dict]]:
    raw = yaml.safe_load((ROOT / dvcfile).read_text())["stages"]
    key = "grpo"  # an experiment of both params.yaml and paper/presets.yaml
    out = []
    for name, stage in raw.items():
        stage = stage.get("do", stage)
        out.append((name, yaml.safe_load(yaml.safe_dump(stage).replace("${key}", key))))
    return out


@pytest.mark.parametrize("dvcfile", ["dvc.yaml", "paper/dvc.yaml", "textworld/dvc.yaml"])
def test_stage_commands_pass_exactly_their_declared_paths(dvcfile: str) -> None:
    for name, stage in _stages(dvcfile):
        deps, outs = _declared(stage)
        cmds = stage["cmd"] if isinstance(stage["cmd"], list) else [stage["cmd"]]
        given: list[str] = []
        for cmd in cmds:
            argv = shlex.split(cmd)
            module = argv[2]
            body = getattr(importlib.import_module(module), module.rsplit(".", 1)[1])
            parser, path_names = stage_parser(name, body, "experiment" in inspect.signature(body).parameters)
            args = parser.parse_args(argv[3:])  # an unknown or misspelt argument fails here
            flags = {a for a in argv[3:] if a.startswith("--")}
            for n in path_names:
                if f"--{n.replace('_', '-')}" in flags:
                    value = str(getattr(args, n))
                    known = deps | outs | set(BY_PRODUCTS.get(dvcfile, ()))
                    assert any(_related(value, d) for d in known), f"{dvcfile}:{name}: --{n} {value} is not declared"
                    given.append(value)
        for out in outs:  # every output the stage declares is where the cmd tells it to write
            assert any(_related(out, g) for g in given), f"{dvcfile}:{name}: {out} is not passed in its cmd"


def test_training_stages_are_found_with_their_steps_and_curves() -> None:
    """What the flow's progress artifact follows, for every kind of stage that trains."""
    from tasks.dvc_stage import training_target

    steps = yaml.safe_load((ROOT / "params.yaml").read_text())["train"]["steps"]
    assert training_target("train@grpo", ROOT) == (steps, ROOT / "dvclive" / "grpo", "grpo")
    budget = yaml.safe_load((ROOT / "paper" / "presets.yaml").read_text())["budget"]["steps"]
    assert training_target("paper/dvc.yaml:run@grpo-no-loss-mask-2", ROOT) == (
        budget, ROOT / "paper" / "dvclive" / "grpo-no-loss-mask.seed2", "grpo-no-loss-mask")
    assert training_target("paper/dvc.yaml:extra@grpo-step-last1-0", ROOT)[1].name == "grpo-step-last1.seed0"
    curve = yaml.safe_load((ROOT / "paper" / "presets.yaml").read_text())["learning_curve"]["steps"]
    assert training_target("paper/dvc.yaml:curve", ROOT) == (curve, ROOT / "paper" / "dvclive" / "curve", "grpo")
    assert training_target("index", ROOT) is None and training_target("paper/dvc.yaml:report", ROOT) is None


def test_every_param_textworld_tracks_is_in_its_params_file() -> None:
    """DVC refuses to run a stage whose tracked param the file lacks, even one the schema defaults."""
    params = yaml.safe_load((ROOT / "textworld/params.yaml").read_text())
    for name, stage in _stages("textworld/dvc.yaml"):
        for entry in stage.get("params", []):
            for dvc_file, keys in entry.items():
                assert dvc_file == "textworld/params.yaml", f"textworld/dvc.yaml:{name} reads {dvc_file}"
                for key in keys:
                    node = params
                    for part in key.split("."):
                        assert isinstance(node, dict) and part in node, f"textworld/dvc.yaml:{name}: {key} missing"
                        node = node[part]


@pytest.mark.parametrize("dvcfile", ["dvc.yaml", "paper/dvc.yaml"])
def test_stages_that_search_depend_on_the_one_index_they_search(dvcfile: str) -> None:
    """Not on every index: the dense one's bytes follow the CPU, BM25's do not, and the default agent searches BM25."""
    searching = 0
    for name, stage in _stages(dvcfile):
        deps, _ = _declared(stage)
        cmds = stage["cmd"] if isinstance(stage["cmd"], list) else [stage["cmd"]]
        on_indexes = {d for d in deps if d == "indexes" or d.startswith("indexes/")}
        if not any("--indexes" in cmd for cmd in cmds):
            continue
        searching += 1
        assert on_indexes == {"indexes/${retrieval.index}"}, (dvcfile, name, on_indexes)
        tracked = {p for p in stage["params"] if isinstance(p, str)}
        assert {"retrieval.index", "retrieval.url"} <= tracked, (dvcfile, name)
    assert searching >= 3
