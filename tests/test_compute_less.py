"""Computing less without changing the update, on a real multi-turn rollout of the real policy.

The update runs on the real 135M policy in the slow suite, and on a random
2-layer Llama with its tokenizer (``agent_r1.smoke.tiny_policy``) in the fast
one: what is checked (which tokens are computed, shared or skipped) does not
depend on the network's size, and the real one's update is most of a minute.

* Prefix sharing (train.share_prefix): the shared prefixes of a packed
  micro-batch (system prompt, question, step k's context inside step k+1) are
  computed once; the log-probs and every parameter gradient must equal the
  unshared packed computation's, flat and step-level.
* Zero-signal skipping (train.skip_zero_signal): samples whose advantages are
  0 on every token are not forwarded; one optimizer step must give the same
  weights as forwarding them.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from agent_r1.config import Params, RetrievalConfig, SyntheticConfig
from agent_r1.data.synthetic import generate
from agent_r1.retrieval import build_index
from agent_r1.rollout.trajectory import TrajectoryBatch
from agent_r1.training.batching import minibatches
from agent_r1.training.logprobs import token_logprobs, token_values, use_packed_attention
from agent_r1.training.loop import build_models, update_from_rollout
from agent_r1.training.models import ValueModel
from agent_r1.training.packing import shared_layout, shared_micro_batches
from agent_r1.training.samples import make_samples

# fp32 on the real 135M model, 24 layers of rounding in another order: measured ~1e-6 on the
# log-probs and ~1e-6 relative on the gradients; a wrong position, mask or path is 1e-2 or more.
LOGPROB_TOL = 1e-4
GRAD_RTOL = 1e-3

MODELS = ["tiny", pytest.param("real", marks=pytest.mark.slow)]  # the model updated (module docstring)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory, policy_dir: Path) -> Path:
    from agent_r1.smoke import tiny_policy

    return tiny_policy(policy_dir, tmp_path_factory.mktemp("tiny") / "policy")


@pytest.fixture
def model_dir(model: str, policy_dir: Path, tiny_dir: Path) -> Path:
    return policy_dir if model == "real" else tiny_dir


def rollout_params(**train: object) -> Params:
    p = Params()
    return p.model_copy(update={
        "rollout": p.rollout.model_copy(update={"n": 2, "max_new_tokens": 24}),
        "env": p.env.model_copy(update={"max_turns": 2}),
        # full fine-tuning (the exact changes are checked on every parameter's gradient), at its learning rate
        "train": p.train.model_copy(update={"mini_batch_size": 4, "lora": None, "actor_lr": 1e-5, **train}),
    })  # fmt: skip


@pytest.fixture(scope="module")
def rollout(tmp_path_factory: pytest.TempPathFactory, policy_dir: Path) -> TrajectoryBatch:
    """Two questions x 2 samples, multi-turn, sampled by the default engine from the real policy."""
    from agent_r1.env import make_env
    from agent_r1.rollout import make_rollout_engine, run_episodes

    questions, corpus = generate(SyntheticConfig(n_train=40, n_test=20, n_test_ood=10, n_test_ood_2hop=10, n_test_paraphrase=10, entities_per_type=40), seed=5)
    index_dir = tmp_path_factory.mktemp("index") / "bm25"
    build_index("bm25", corpus, index_dir, RetrievalConfig())
    records = questions[questions["split"] == "train"].to_dict("records")[:2]
    params = rollout_params()
    engine = make_rollout_engine(policy_dir, params.rollout)
    batch = run_episodes(engine, make_env(params, index_dir), engine.tokenizer, records, params.rollout)
    assert int(batch.action_mask.sum()) > 0 and pd.Series(batch.group_id.tolist()).nunique() == 2
    assert len(make_samples(batch, "step")) > len(batch)  # multi-turn: some episode took more than one step
    return batch


def logprobs_and_grads(lm: torch.nn.Module, samples, share: bool) -> tuple[torch.Tensor, torch.Tensor]:
    lm.zero_grad()
    lp = token_logprobs(lm, samples.input_ids, samples.attention_mask, score_mask=samples.loss_mask,
                        temperature=0.7, packed=True, share_prefix=share)
    (lp * samples.loss_mask).sum().backward()
    return lp.detach(), torch.cat([p.grad.flatten() for p in lm.parameters()])


# flat in the slow suite: the step samples' layout holds the flat one's shared prefixes (system prompt,
# question) and the step contexts nested below them, so step exercises every path flat does
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("representation", [pytest.param("flat", marks=pytest.mark.slow), "step"])
def test_shared_prefixes_give_the_unshared_logprobs_and_gradients(
    representation: str, rollout: TrajectoryBatch, model_dir: Path
) -> None:
    from transformers import AutoModelForCausalLM

    samples = make_samples(rollout, representation)
    tokens = samples.token_lists()
    layout = shared_layout(tokens)
    shared = 1 - layout.total / sum(map(len, tokens))
    print(f"\n{representation}: {len(tokens)} samples, {sum(map(len, tokens))} tokens, {shared:.0%} shared")
    assert shared > (0.4 if representation == "step" else 0.2)  # system prompt, questions (+ step contexts)

    lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    use_packed_attention(lm)
    lp, grads = logprobs_and_grads(lm, samples, share=False)
    lp_shared, grads_shared = logprobs_and_grads(lm, samples, share=True)
    print(f"max |dlogprob| {float((lp - lp_shared).abs().max()):.1e}, "
          f"max |dgrad| / max |grad| {float((grads - grads_shared).abs().max() / grads.abs().max()):.1e}")
    scored = samples.loss_mask.bool()
    assert (lp_shared[~scored] == 0).all() and (lp_shared[scored] != 0).float().mean() > 0.5
    torch.testing.assert_close(lp_shared, lp, rtol=0, atol=LOGPROB_TOL)
    torch.testing.assert_close(grads_shared, grads, rtol=0, atol=GRAD_RTOL * float(grads.abs().max()))

    # the critic's packed forward: the same values at every real token
    critic = ValueModel(lm.model, head_std=1.0)
    with torch.no_grad():
        plain = token_values(critic, samples.input_ids, samples.attention_mask)
        shared_values = token_values(critic, samples.input_ids, samples.attention_mask, packed=True, share_prefix=True)
    torch.testing.assert_close(shared_values, plain, rtol=0, atol=LOGPROB_TOL * float(plain.abs().max()))


@given(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=12), min_size=1, max_size=8))
def test_a_shared_layout_gives_every_row_its_own_tokens_positions_and_predictors(rows: list[list[int]]) -> None:
    """Whatever the rows: each row read back through the layout is itself, at positions 0..n-1, each
    token predicted by the row's previous one; and the layout holds each distinct prefix once."""
    layout = shared_layout(rows)
    ids = torch.full((layout.total,), -1)
    positions, predictors = layout.position_ids()[0], layout.predictors()
    for tokens, index in zip(rows, layout.row_index([len(r) for r in rows])):
        assert (ids[index] == -1).logical_or(ids[index] == torch.tensor(tokens)).all()  # shared spans agree
        ids[index] = torch.tensor(tokens)
        assert positions[index].tolist() == list(range(len(tokens)))
        assert predictors[index].tolist() == [-1] + index[:-1].tolist()
    assert layout.total == len({tuple(r[:k]) for r in rows for k in range(1, len(r) + 1)})


def test_shared_micro_batches_keep_groups_together_within_the_budget() -> None:
    prompt = list(range(100, 180))
    rows = [prompt + [q] * 20 + [q * 10 + s] * 30 for q in (1, 2, 3) for s in range(4)]
    groups = shared_micro_batches(rows, 300)
    assert sorted(r for g in groups for r in g) == list(range(12))
    assert all(shared_layout([rows[r] for r in g]).total <= 300 for g in groups)
    assert [len(g) for g in groups] == [6, 6]  # 80 + 20 + 4 * 30 per question: two questions a micro-batch
    assert shared_layout(rows).total == 80 + 3 * 20 + 12 * 30


def test_minibatches_forward_only_the_live_rows_and_keep_every_step() -> None:
    lengths = [10] * 8
    full = list(minibatches(lengths, epochs=2, rows=4, token_budget=20, seed=0))
    some = list(minibatches(lengths, epochs=2, rows=4, token_budget=20, seed=0, live=[0, 1]))
    assert [rows for rows, _ in some] == [rows for rows, _ in full]  # the same optimizer steps and normalisers
    for (rows, groups) in some:
        kept = sorted(i for g in groups for i in g)
        assert kept == sorted(set(rows) & {0, 1})
        assert groups == [[]] or [] not in groups  # a placeholder pass only where nothing is live


def one_signal_group(batch: TrajectoryBatch) -> TrajectoryBatch:
    """The same rollout with group 0's samples all given one reward on their last action (its GRPO
    advantages are then 0), and group 1's samples rewards 0 and 1 (a signal)."""
    rewards = torch.zeros_like(batch.token_rewards)
    group0 = batch.group_id == batch.group_id.min()
    for r in range(len(batch)):
        last_action = int(torch.nonzero(batch.action_mask[r]).max())
        rewards[r, last_action] = 0.5 if group0[r] else float(r % 2)
    return TrajectoryBatch(**{**batch.__dict__, "token_rewards": rewards})


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("representation", ["flat", pytest.param("step", marks=pytest.mark.slow)])
def test_skipping_zero_signal_samples_gives_the_same_optimizer_step(
    representation: str, rollout: TrajectoryBatch, model_dir: Path
) -> None:
    batch = one_signal_group(rollout)
    weights, metrics = {}, {}
    for skip in (False, True):
        params = rollout_params(skip_zero_signal=skip)
        params = params.model_copy(update={
            "algorithm": params.algorithm.model_copy(update={"representation": representation})})
        models = build_models(params, model_dir)
        metrics[skip] = update_from_rollout(params, models, batch)
        weights[skip] = torch.cat([v.flatten() for v in models.actor.module.state_dict().values()])
    assert metrics[False]["skipped_samples"] == 0.0
    assert metrics[True]["skipped_samples"] == pytest.approx(0.5, abs=0.2)  # group 0 (its turns, for step)
    assert metrics[True]["grad_norm"] == pytest.approx(metrics[False]["grad_norm"], rel=1e-4)
    diff = (weights[False] - weights[True]).abs()
    off = float((diff > 1e-7).float().mean())
    print(f"\n{representation}: skipped {metrics[True]['skipped_samples']:.0%}, max |dweight| {float(diff.max()):.1e}, "
          f"{off:.1e} of the weights off by > 1% of a step")
    # Adam's first step moves a weight by ~lr * g / (|g| + eps) (lr 1e-5), whatever the gradient's size
    # (the grad norm above checks that): a weight whose gradient is near eps (1e-8) may move by up to
    # ~lr either way on a rounding difference; any real difference of direction moves a large share.
    assert off < 1e-3
