"""Losses: hand-worked PPO clip cases, value clip, KL kinds, entropy, aggregation, and exact gradient masking."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_r1.algorithms import aggregate_loss, entropy_from_logits, kl, loss_mask, policy_loss, value_loss

LAYOUT = torch.tensor([[0, 0, 1, 1, 0, 0, 1, 1]])  # prompt 2, turn 1, observation 2, turn 2
ATTENTION = torch.ones(1, 8, dtype=torch.long)


def logs(*ratios: float) -> torch.Tensor:
    return torch.tensor([[math.log(r) for r in ratios]])


# -------------------------------------------------------------- aggregation
def test_aggregation_modes() -> None:
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert float(aggregate_loss(loss, mask, "token-mean")) == pytest.approx(7 / 3)  # (1 + 2 + 4) / 3
    assert float(aggregate_loss(loss, mask, "seq-mean-token-sum")) == pytest.approx(3.5)  # (3 + 4) / 2
    assert float(aggregate_loss(loss, mask, "seq-mean-token-mean")) == pytest.approx(2.75)  # (1.5 + 4) / 2
    # a sequence without masked tokens does not count
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    assert float(aggregate_loss(loss, mask, "seq-mean-token-sum")) == pytest.approx(3.0)
    assert float(aggregate_loss(loss, mask, "seq-mean-token-mean")) == pytest.approx(1.5)
    # gradient accumulation: a fixed denominator
    assert float(aggregate_loss(loss, mask, "token-mean", denominator=6)) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="unknown loss aggregation 'mean'"):
        aggregate_loss(loss, mask, "mean")


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_empty_mask_gives_zero_not_nan(agg: str) -> None:
    loss = torch.tensor([[1.0, float("inf")], [float("nan"), 2.0]], requires_grad=True)
    out = aggregate_loss(loss, torch.zeros(2, 2), agg)
    out.backward()
    assert float(out.detach()) == 0.0 and torch.equal(loss.grad, torch.zeros(2, 2))


# ------------------------------------------------------------- policy loss
def test_ratio_one_gives_minus_mean_advantage() -> None:
    lp = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    adv = torch.tensor([[1.0, -2.0, 0.5, 7.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, metrics = policy_loss(lp, lp.clone(), adv, mask)
    assert float(loss) == pytest.approx(-(1.0 - 2.0 + 0.5) / 3)
    assert metrics["clipfrac"] == 0.0 and metrics["approx_kl"] == 0.0


def test_ppo_clip_hand_worked() -> None:
    # A = 1, 1, -1, -1; ratio = 1.5, .5, 1.5, .5; clip .2 -> [.8, 1.2]
    # L1 = -A*rho = -1.5 -.5 1.5 .5;  L2 = -A*clip(rho) = -1.2 -.8 1.2 .8;  max = -1.2 -.5 1.5 .8
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    old = torch.zeros(1, 4)
    loss, metrics = policy_loss(logs(1.5, 0.5, 1.5, 0.5), old, adv, torch.ones(1, 4))
    assert float(loss) == pytest.approx((-1.2 - 0.5 + 1.5 + 0.8) / 4)
    assert metrics["clipfrac"] == pytest.approx(0.5)  # tokens 0 and 3
    # approx_kl = mean(old - new) = -(ln 1.5 + ln .5 + ln 1.5 + ln .5) / 4 = -ln(.75) / 2
    assert metrics["approx_kl"] == pytest.approx(-math.log(0.75) / 2)
    assert "dual_clipfrac" not in metrics


def test_asymmetric_clip() -> None:
    # clip range [1 - .2, 1 + .28]: A = 1, rho 1.5 -> -1.28; A = -1, rho .5 -> .8
    adv = torch.tensor([[1.0, -1.0]])
    loss, _ = policy_loss(logs(1.5, 0.5), torch.zeros(1, 2), adv, torch.ones(1, 2), clip_ratio=0.2, clip_ratio_high=0.28)
    assert float(loss) == pytest.approx((-1.28 + 0.8) / 2)


def test_dual_clip() -> None:
    # c = 3. A = -1, rho 5: max(5, 1.2) = 5 -> min(5, 3) = 3 (dual-clipped)
    #        A = -1, rho 2: max(2, 1.2) = 2 < 3 -> 2
    #        A = +1, rho 5: max(-5, -1.2) = -1.2 (positive advantage: no dual clip)
    adv = torch.tensor([[-1.0, -1.0, 1.0]])
    loss, metrics = policy_loss(logs(5.0, 2.0, 5.0), torch.zeros(1, 3), adv, torch.ones(1, 3), dual_clip=3.0)
    assert float(loss) == pytest.approx((3.0 + 2.0 - 1.2) / 3)
    assert metrics["dual_clipfrac"] == pytest.approx(1 / 3)
    assert metrics["clipfrac"] == pytest.approx(1 / 3)  # only the third token has L2 > L1
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        policy_loss(logs(1.0), torch.zeros(1, 1), adv[:, :1], torch.ones(1, 1), dual_clip=0.5)


def test_log_ratio_is_clamped() -> None:
    loss, metrics = policy_loss(torch.tensor([[100.0]]), torch.zeros(1, 1), torch.tensor([[-1.0]]), torch.ones(1, 1))
    assert float(loss) == pytest.approx(math.exp(20.0)) and metrics["approx_kl"] == -20.0


def test_loss_mask_gives_exactly_zero_gradient_off_the_actions() -> None:
    """Observation tokens (and the prompt) get gradient exactly 0 with the paper's loss mask, and a
    non-zero one with it off; garbage logprobs off the mask cannot leak a NaN."""
    old = torch.full((1, 8), -1.0)
    adv = torch.tensor([[3.0, 3.0, 1.0, -2.0, 5.0, -5.0, 0.5, 1.5]])
    start = torch.tensor([2])
    for use_action_mask in (True, False):
        mask = loss_mask(LAYOUT, ATTENTION, start, use_action_mask)
        values = [-1e9, float("nan"), -0.9, -1.1, -1.2, -0.8, -1.0, -1.05] if use_action_mask else [-1.0] * 2 + [-0.9, -1.1, -1.2, -0.8, -1.0, -1.05]
        lp = torch.tensor([values], requires_grad=True)
        loss, _ = policy_loss(lp, old, adv, mask, dual_clip=3.0)
        entropy_like = aggregate_loss(kl(lp, old, "k3"), mask)
        (loss + entropy_like).backward()
        grad = lp.grad[0]
        assert torch.isfinite(loss) and torch.isfinite(grad).all()
        assert (grad[:2] == 0).all()  # the prompt never
        assert (grad[[2, 3, 6, 7]] != 0).all()
        if use_action_mask:
            assert (grad[[4, 5]] == 0).all()
        else:
            assert (grad[[4, 5]] != 0).all()


def test_loss_mask_switch() -> None:
    attention = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 1, 0, 0]])
    action = torch.tensor([[0, 0, 1, 1, 0, 0, 1, 1, 0, 0]])
    assert torch.equal(loss_mask(action, attention, 2, True), action)
    assert loss_mask(action, attention, 2, False).tolist() == [[0, 0, 1, 1, 1, 1, 1, 1, 0, 0]]


# -------------------------------------------------------------- value loss
def test_value_loss_clip_hand_worked() -> None:
    # v = 1, old = .5, clip .2 -> clipped v .7
    # R = 2: plain (1 - 2)^2 = 1, clipped (.7 - 2)^2 = 1.69 -> 1.69 (clip active)
    # R = 0: plain 1, clipped .49 -> 1
    v = torch.tensor([[1.0, 1.0, 7.0]])
    loss, metrics = value_loss(v, torch.tensor([[0.5, 0.5, 0.0]]), torch.tensor([[2.0, 0.0, 0.0]]), torch.tensor([[1, 1, 0]]), clip=0.2)
    assert float(loss) == pytest.approx(0.5 * (1.69 + 1.0) / 2)
    assert metrics["vf_clipfrac"] == pytest.approx(0.5)
    # inside the clip range both branches agree: 1/2 (v - R)^2
    loss, metrics = value_loss(torch.tensor([[0.6]]), torch.tensor([[0.5]]), torch.tensor([[0.0]]), torch.ones(1, 1), clip=0.2)
    assert float(loss) == pytest.approx(0.5 * 0.36) and metrics["vf_clipfrac"] == 0.0


# ---------------------------------------------------------------------- KL
def test_kl_kinds() -> None:
    lp = torch.tensor([-1.0, -2.0, -60.0])
    ref = torch.tensor([-2.0, -1.0, -1.0])
    # diff = logp - ref = 1, -1, -59
    torch.testing.assert_close(kl(lp, ref, "k1"), torch.tensor([1.0, -1.0, -59.0]))
    torch.testing.assert_close(kl(lp, ref, "k2"), torch.tensor([0.5, 0.5, 0.5 * 59**2]))
    # k3: x = ref - logp = -1, 1, 59 -> clamp 20; exp(x) - x - 1 = e^-1, e - 2, (huge -> clamp 10)
    torch.testing.assert_close(kl(lp, ref, "k3"), torch.tensor([math.exp(-1), math.e - 2, 10.0]))
    torch.testing.assert_close(kl(lp, ref, "abs"), torch.tensor([1.0, 1.0, 59.0]))
    torch.testing.assert_close(kl(lp, ref, "low_var_kl"), kl(lp, ref, "k3"))
    with pytest.raises(ValueError, match="unknown KL kind 'k4'"):
        kl(lp, ref, "k4")


# ----------------------------------------------------------------- entropy
def test_entropy_from_logits() -> None:
    uniform = torch.zeros(2, 3, 4)
    torch.testing.assert_close(entropy_from_logits(uniform), torch.full((2, 3), math.log(4)))
    peaked = torch.tensor([[100.0, 0.0, 0.0]])
    assert float(entropy_from_logits(peaked)) == pytest.approx(0.0, abs=1e-6)
    logits = torch.randn(3, 5, 11, requires_grad=True)
    reference = torch.distributions.Categorical(logits=logits).entropy()
    chunked = entropy_from_logits(logits, chunk_size=2)
    torch.testing.assert_close(chunked, reference)
    chunked.sum().backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()


# -------------------------------------------------------------- properties
@settings(max_examples=50, deadline=None)
@given(
    st.integers(1, 4),
    st.integers(1, 8),
    st.sampled_from(["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]),
    st.data(),
)
def test_property_policy_loss_finite_and_mask_exact(b: int, t: int, agg: str, data) -> None:
    floats = st.floats(-5, 5)
    lp = torch.tensor(data.draw(st.lists(st.lists(floats, min_size=t, max_size=t), min_size=b, max_size=b)), requires_grad=True)
    old = torch.tensor(data.draw(st.lists(st.lists(floats, min_size=t, max_size=t), min_size=b, max_size=b)))
    adv = torch.tensor(data.draw(st.lists(st.lists(floats, min_size=t, max_size=t), min_size=b, max_size=b)))
    mask = torch.tensor(data.draw(st.lists(st.lists(st.integers(0, 1), min_size=t, max_size=t), min_size=b, max_size=b)))
    loss, metrics = policy_loss(lp, old, adv, mask, dual_clip=3.0, agg=agg)
    loss.backward()
    assert loss.dim() == 0 and torch.isfinite(loss) and torch.isfinite(lp.grad).all()
    assert (lp.grad[mask == 0] == 0).all()
    assert 0.0 <= metrics["clipfrac"] <= 1.0 and 0.0 <= metrics["dual_clipfrac"] <= 1.0


def test_without_the_loss_mask_observations_take_their_turns_advantage() -> None:
    """prompt | a0 a0 | o0 o0 | a1 | o1 | pad: observations copy the action before them, the prompt
    and padding stay 0, actions keep their own advantage."""
    from agent_r1.algorithms.masking import response_mask, spread_to_observations

    action = torch.tensor([[0, 0, 1, 1, 0, 0, 1, 0, 0]])
    attention = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 1, 0]])
    adv = torch.tensor([[0.0, 0.0, 0.5, 0.7, 0.0, 0.0, -0.2, 0.0, 0.0]])
    out = spread_to_observations(adv, action, response_mask(attention, 2))
    assert torch.equal(out, torch.tensor([[0.0, 0.0, 0.5, 0.7, 0.7, 0.7, -0.2, -0.2, 0.0]]))
