"""Packed actor updates and ZeRO bucket sizes, on a tiny random Llama (seconds).

Packing concatenates a micro-batch's rows into one row with attention per
row: the log-probs, entropies and gradients must equal the padded
computation's (float rounding aside), and no padding may be computed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from train_tiny import VOCAB, tiny_llama  # noqa: E402

from agent_r1.config import Params  # noqa: E402
from agent_r1.rollout.trajectory import TrajectoryBatch  # noqa: E402
from agent_r1.training.buckets import DEFAULT_BUCKET, bucket_elements  # noqa: E402
from agent_r1.training.models import ds_config, make_trainable  # noqa: E402
from agent_r1.training.batching import computed_positions, micro_batches, minibatches  # noqa: E402
from agent_r1.training.logprobs import PACKED_ATTENTION, token_logprobs, use_packed_attention  # noqa: E402
from agent_r1.training.loop import build_models, update_from_rollout  # noqa: E402


def padded_batch(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask and a score mask (~70% of the real tokens)."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    am = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
    ids = torch.randint(3, VOCAB, am.shape, generator=g) * am
    score = (torch.rand(am.shape, generator=g) < 0.7).float() * am
    return ids, am, score


def logprobs_and_grads(lm: torch.nn.Module, packed: bool, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
    ids, am, score = args
    lm.zero_grad()
    lp, ent = token_logprobs(lm, ids, am, return_entropy=True, score_mask=score, temperature=0.7, packed=packed)
    (lp.sum() + 0.3 * ent.sum()).backward()
    grads = torch.cat([p.grad.flatten() for p in lm.parameters()])
    return lp.detach(), ent.detach(), grads


@pytest.mark.parametrize("switched", [False, True], ids=["sdpa", "packed-attention"])
def test_packed_logprobs_entropy_and_gradients_equal_the_padded_ones(switched: bool) -> None:
    lm = tiny_llama(seed=0)
    lm.config._attn_implementation = "sdpa"
    batch = padded_batch([20, 7, 13, 1, 16, 2])
    ref = logprobs_and_grads(lm, False, *batch)
    if switched:  # per-row attention; without it HF masks the packed row block-diagonally
        use_packed_attention(lm)
        assert lm.config._attn_implementation == PACKED_ATTENTION
    lp, ent, grads = logprobs_and_grads(lm, True, *batch)
    torch.testing.assert_close(lp, ref[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ref[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads, ref[2], rtol=1e-4, atol=1e-6)
    assert (lp[batch[2] == 0] == 0).all() and (lp[batch[2] > 0] != 0).any()  # scored under the mask only
    if switched:  # the padded path of a switched model is plain SDPA, unchanged
        torch.testing.assert_close(logprobs_and_grads(lm, False, *batch)[2], ref[2], rtol=0, atol=0)


def test_packed_micro_batches_fit_the_budget_without_padding() -> None:
    lengths = [400, 130, 700, 450, 150, 980, 300, 620, 140, 460, 90, 1100]
    for budget in (1024, 2048, 4096):
        groups = micro_batches(lengths, budget, packed=True)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        assert all(sum(lengths[i] for i in g) <= budget or len(g) == 1 for g in groups)
        assert computed_positions(lengths, groups, packed=True) == sum(lengths)
        padded = micro_batches(lengths, budget)
        assert computed_positions(lengths, padded) > sum(lengths)  # what packing saves here
        assert len(groups) <= len(padded)
    assert micro_batches(lengths, 1024, packed=True) == micro_batches(lengths, 1024, packed=True)  # deterministic


def trajectory_batch(lengths: list[int]) -> TrajectoryBatch:
    ids, am, _ = padded_batch(lengths, seed=1)
    action = am.clone()
    action[:, :3] = 0  # a 3-token prompt, then the agent's tokens
    rewards = torch.zeros(am.shape)
    for i, n in enumerate(lengths):
        rewards[i, n - 1] = float(i % 2)
    return TrajectoryBatch(
        input_ids=ids, attention_mask=am, action_mask=action, turn_index=torch.where(action.bool(), 0, -1),
        token_rewards=rewards, rollout_logprobs=torch.zeros(am.shape), group_id=torch.arange(len(lengths)) // 2,
        prompt_length=torch.full((len(lengths),), 3), info=[{}] * len(lengths),
    )


def test_a_packed_rl_step_updates_like_the_padded_one(tmp_path: Path) -> None:
    tiny_llama(seed=0).save_pretrained(tmp_path / "tiny")
    lengths = [24, 9, 17, 30, 12, 5, 28, 20]
    steps = {}
    for pack in (False, True):
        p = Params()
        params = p.model_copy(update={
            "train": p.train.model_copy(update={"mini_batch_size": 8, "micro_batch_tokens": 64, "bf16": False,
                                                "pack": pack, "actor_lr": 1e-3, "lora": None}),
            "algorithm": p.algorithm.model_copy(update={"entropy_coef": 0.01, "kl_coef": 0.001}),  # every loss term
        })  # fmt: skip
        models = build_models(params, tmp_path / "tiny")
        metrics = update_from_rollout(params, models, trajectory_batch(lengths))
        weights = torch.cat([v.flatten().float() for v in models.actor.module.state_dict().values()])
        steps[pack] = metrics, weights
    (padded, w_padded), (packed, w_packed) = steps[False], steps[True]
    assert packed["padding_share"] == 0.0 and padded["padding_share"] > 0.1
    for key in ("pg_loss", "entropy", "grad_norm"):
        assert packed[key] == pytest.approx(padded[key], rel=1e-5), key
    # Adam's first step moves each weight by ~lr * sign(grad): 1% of a step allows for the
    # near-zero gradients whose rounding differs, and still catches any real difference
    torch.testing.assert_close(w_packed, w_padded, rtol=0, atol=1e-5)


def test_minibatches_pack_when_asked() -> None:
    lengths = [40, 20, 20, 10, 30, 5]
    (_, padded), = minibatches(lengths, epochs=1, rows=6, token_budget=45, seed=0)
    (_, packed), = minibatches(lengths, epochs=1, rows=6, token_budget=45, seed=0, packed=True)
    assert len(packed) == 3 and len(padded) == 4  # [40, 5] [30, 10] [20, 20] vs [40] [30] [20, 20] [10, 5]


def test_zero_buckets_are_sized_to_the_model() -> None:
    """DeepSpeed's default buckets are 5e8 elements (2 GB of fp32 staging for ZeRO-2) whatever the model."""
    lm = tiny_llama(seed=0)
    n = sum(p.numel() for p in lm.parameters())
    largest = max(p.numel() for p in lm.parameters())
    cfg = Params().train.model_copy(update={"bf16": False})
    zero = ds_config(cfg, 1e-4, model=lm)["zero_optimization"]
    assert largest <= zero["reduce_bucket_size"] == zero["allgather_bucket_size"] <= max(n, 1 << 20)
    assert ds_config(cfg, 1e-4)["zero_optimization"]["reduce_bucket_size"] == DEFAULT_BUCKET
    smollm = bucket_elements(134_515_008, 28_311_552)  # SmolLM2-135M: a quarter of it, ~135 MB of fp32
    assert 28_311_552 <= smollm <= 134_515_008 // 4 + (1 << 20) and smollm % (1 << 20) == 0
    assert bucket_elements(10**10, 10**8) == DEFAULT_BUCKET
    engine = make_trainable(lm, cfg, 1e-4)  # what the running engine allocates from
    assert engine.optimizer.reduce_bucket_size <= max(n, 1 << 20)
    assert engine.optimizer.allgather_bucket_size <= max(n, 1 << 20)
