"""Smoke test of the update benchmark's pieces in-process, on a tiny random Llama (seconds, no subprocesses).

The benchmark itself (subprocess per measurement, the deepspeed launcher) runs with
``.venv/bin/python bench/train.py --quick``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from train_tiny import VOCAB, tiny_llama  # noqa: E402

sys.path.insert(0, str(ROOT))
from bench import batches, flops, rl_ranks, tables, update  # noqa: E402


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench") / "tiny"
    tiny_llama(seed=0).save_pretrained(out)
    return out


def spec_for(model: Path, method: str, mode: str, **kw) -> dict:
    return {"model": str(model), "params": str(ROOT / "params.yaml"), "experiment": "grpo", "seed": 0,
            "min_len": 20, "max_len": 40, "action_frac": 0.12, "group_size": 2, "method": method, "mode": mode,
            "rows": 4, "reps": 1, "warmup_rows": 2, "micro_rows": 2, **kw}  # fmt: skip


def test_synthetic_batch_has_the_agents_shape() -> None:
    batch = batches.synthetic_batch(12, 300, 450, 0.12, VOCAB, 4, seed=0)
    lengths = batch.attention_mask.sum(-1)
    assert len(batch) == 12 and lengths.min() >= 300 and lengths.max() <= 450
    assert batch.action_mask.sum() / lengths.sum() == pytest.approx(0.12, abs=0.01)
    assert batch.group_id.tolist() == [i // 4 for i in range(12)]
    for i, n in enumerate(lengths.tolist()):
        assert batch.action_mask[i, n - 1] == 1 and batch.token_rewards[i, n - 1] != 0  # ends on the answer
        assert batch.action_mask[i, : int(batch.prompt_length[i])].sum() == 0
    stats = batches.batch_stats(batch)
    assert stats["tokens"] == int(lengths.sum()) and stats["scored_tokens"] == stats["tokens"] - 12


# "ours" (DeepSpeed) in the slow suite: 35 s of `make test`'s 15 min on 2 cores; the bench's pieces
# are the same for both methods, and the engine itself is tested in test_training_infra.py.
@pytest.mark.parametrize("method", [pytest.param("ours", marks=pytest.mark.slow), "naive"])
def test_update_worker_measures_throughput_and_memory(tiny_model: Path, method: str) -> None:
    ceiling = flops.matmul_gflops(64, 2)
    r = flops.throughput_row(update.worker_update(spec_for(tiny_model, method, "throughput")), ceiling)
    assert r["batch"]["rows"] == 4 and r["tokens_per_s"] > 0 and 0 < r["mfu_vs_bf16"]
    assert r["plan"]["computed_tokens"] >= r["batch"]["tokens"] and 0 < r["batch"]["loss_tokens"] < r["batch"]["tokens"]
    assert r["needed_flops"] < r["palm_flops"]  # the head only on the loss positions
    assert r["shape"]["tied_head"] and r["shape"]["n_matmul"] == r["shape"]["n_params"]
    mem = update.worker_update(spec_for(tiny_model, method, "memory"))
    assert mem["ru_maxrss_mib"] > 0 and mem["update_s"] > 0
    assert r["plan"]["padding_share"] == (0.0 if method == "ours" else pytest.approx(
        r["plan"]["computed_tokens"] / r["batch"]["tokens"] - 1))  # ours packs by default: no padding
    table = tables.format_throughput({"ours": r, "ours_padded": r, "naive": r, "speedup_tokens_per_s": 1.0,
                                     "packed_vs_padded": 1.2})
    assert "tokens/s" in table and "MFU vs bf16" in table and "padding share" in table
    assert "packed vs padded (update s)" in table and "ours, padded" in table
    assert "ratio" in tables.format_memory([{"rows": 4, "ours": mem, "naive": {"killed_above_mib": 10}}])


def test_read_live_collects_dvclive_rows_per_step(tmp_path: Path) -> None:
    root = tmp_path / "plots" / "metrics"
    (root / "time").mkdir(parents=True)
    (root / "train").mkdir()
    (root / "time" / "update_s.tsv").write_text("step\tupdate_s\n0\t2.5\n1\t3.0\n")
    (root / "train" / "tokens.tsv").write_text("step\ttokens\n0\t100\n1\t120\n")
    rows = rl_ranks.read_live(tmp_path)
    assert rows == [{"step": 0, "time/update_s": 2.5, "train/tokens": 100.0},
                    {"step": 1, "time/update_s": 3.0, "train/tokens": 120.0}]  # fmt: skip
    table = rl_ranks.format_ranks([{"ranks": 1, "world": 1, "threads_per_rank": 2, "steps": rows}])
    assert "update tok/s" in table
