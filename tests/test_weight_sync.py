"""Weight sync by tensors: the trainer's ZeRO-3 buckets on 2 gloo ranks, and the engines' bucketed updates.

The multi-rank run (tests/scripts/sync_ranks.py, one launcher run for both
checks) trains tiny_llama one step under ZeRO-3 and ZeRO-2 and syncs each
rank's own TransformersEngine with Python object collectives made to raise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agent_r1.rollout.transformers_engine import TransformersEngine
from agent_r1.training.distributed import free_port
from tasks.dvc_stage import DISTRIBUTED_VARS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "scripts"))
from train_tiny import VOCAB, tiny_llama  # noqa: E402

BUCKET = 10_000  # elements: the 2-layer tiny Llama (106k) syncs in 11 buckets, its layers split across them


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny_llama(seed=0) as a model folder, with a word-level tokenizer of its vocabulary (engines need one)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    out = tmp_path_factory.mktemp("sync") / "tiny"
    tiny_llama(seed=0).save_pretrained(out)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0").save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def two_ranks(tiny_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/scripts/sync_ranks.py under the deepspeed launcher, 2 CPU (gloo) ranks; its output folder."""
    out = tmp_path_factory.mktemp("sync_ranks")
    cmd = [
        str(Path(sys.executable).parent / "deepspeed"), "--num_accelerators", "2", "--master_port", str(free_port()),
        str(ROOT / "tests/scripts/sync_ranks.py"), "--policy", str(tiny_folder), "--out", str(out),
        "--bucket", str(BUCKET),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_VARS}
    env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return out


def assert_engine_holds(engine: dict[str, torch.Tensor], actor: dict[str, torch.Tensor], init: dict[str, torch.Tensor]) -> None:
    """The engine's weights are exactly the actor's (every one of them moved by the step), its head too."""
    assert set(actor) <= set(engine), sorted(set(actor) - set(engine))
    for name, tensor in actor.items():
        assert torch.equal(engine[name], tensor), name
        if name in init:
            assert not torch.equal(engine[name], init[name]), f"{name} did not move: the step or the sync did nothing"
    assert torch.equal(engine["_head"], actor["model.embed_tokens.weight"])  # the tied head, refreshed once


@pytest.mark.parametrize("zero", [3, 2])
def test_each_rank_engine_gets_the_full_actor_weights_without_pickling(zero: int, two_ranks: Path, tiny_folder: Path) -> None:
    """ZeRO-3: gathered in buckets on every rank (no rank-0 funnel, no object collective); ZeRO-2: as before."""
    actor = torch.load(two_ranks / f"zero{zero}_actor.pt")
    init = load_file(tiny_folder / "model.safetensors")
    for rank in (0, 1):
        assert_engine_holds(torch.load(two_ranks / f"zero{zero}_engine_rank{rank}.pt"), actor, init)
    calls = [json.loads((two_ranks / f"zero{zero}_buckets_rank{r}.json").read_text()) for r in (0, 1)]
    assert calls[0] == calls[1]  # the same buckets in the same order: every rank joins each gather
    if zero == 3:
        assert len(calls[0]) >= 5 and sorted(n for c in calls[0] for n in c) == sorted(actor)
    else:
        assert calls[0] == []  # ZeRO-2, same dtype: the engine samples with the actor's own tensors


def test_a_bucketed_sync_loads_like_one_call_and_checks_names(tiny_folder: Path) -> None:
    """Buckets that split a layer give the same weights as one call; a repeated or unknown name is
    refused before anything loads, and a sync that leaves a weight out fails at its end."""
    engine = TransformersEngine(tiny_folder, dtype="float32")
    new = {k: v + 0.5 for k, v in engine.model.state_dict().items()}
    names = list(new)
    with engine.weight_sync():
        for start in range(0, len(names), 3):
            engine.update_weights({k: new[k] for k in names[start : start + 3]})
        with pytest.raises(KeyError, match="repeated keys"):
            engine.update_weights({names[0]: new[names[0]]})
    assert all(torch.equal(v, new[k]) for k, v in engine.model.state_dict().items())
    assert torch.equal(engine.head_weight, new["model.embed_tokens.weight"])  # refreshed at the end of the sync

    with pytest.raises(KeyError, match="unexpected keys"):
        engine.update_weights({"not.a.weight": torch.zeros(1)})
    with pytest.raises(KeyError, match="missing keys"):
        with engine.weight_sync():
            engine.update_weights({names[0]: new[names[0]]})
    with pytest.raises(RuntimeError, match="already in progress"):
        with engine.weight_sync(), engine.weight_sync():
            pass
