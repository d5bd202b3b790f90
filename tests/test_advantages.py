"""Advantage estimators: hand-worked numbers on small multi-turn trajectories, plus property tests.

The running layout (T = 8): prompt 2, turn 1 (2 action tokens), tool
observation 2, turn 2 (2 action tokens):

    position     0  1  2  3  4  5  6  7
    action_mask  0  0  1  1  0  0  1  1
    reward             .  p  .  .  .  o      (p: process reward of turn 1, o: outcome)
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_r1.algorithms import compute_advantages, gae, grpo, reinforce_pp, reinforce_pp_baseline, rloo
from agent_r1.algorithms.masking import (
    advantage_mask,
    collapse_rewards,
    masked_whiten,
    response_mask,
    returns_to_go,
    span_mask,
)
from agent_r1.registry import ESTIMATORS

LAYOUT = [0, 0, 1, 1, 0, 0, 1, 1]
TURN1, OBS, TURN2 = [2, 3], [4, 5], [6, 7]


def traj(rows: int, rewards: list[tuple[float, float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(token_rewards, action_mask) for ``rows`` trajectories in LAYOUT with (p, o) per row."""
    mask = torch.tensor([LAYOUT] * rows)
    r = torch.zeros(rows, 8)
    for i, (p, o) in enumerate(rewards):
        r[i, 3], r[i, 7] = p, o
    return r, mask


def close(actual: torch.Tensor, expected: list, tol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=tol, rtol=0)


# ------------------------------------------------------------------- masks
def test_masks_and_returns_to_go() -> None:
    attention = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0, 0]])
    close(response_mask(attention, torch.tensor([2, 3])).float(), [[0, 0, 1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 0, 0, 0]])
    action = torch.tensor([[0, 0, 1, 1, 0, 0, 1, 0], [0, 0, 0, 0, 0, 0, 0, 0]])
    close(span_mask(action).float(), [[0, 0, 1, 1, 1, 1, 1, 0], [0] * 8])
    assert torch.equal(advantage_mask(action, True), action)
    assert torch.equal(advantage_mask(action, False, attention), attention)
    r, m = traj(1, [(0.5, 1.0)])
    # p and o both land on the last action token (7): 0.5 + 1.0
    close(collapse_rewards(r, m), [[0, 0, 0, 0, 0, 0, 0, 1.5]])
    # reward-to-go: turn 1 (and its observation) 1.5, turn 2 1.0, the prompt the total
    close(returns_to_go(r, m), [[1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 1.0, 1.0]])


def test_whitening_matches_hand_computation_with_bessel() -> None:
    x = torch.tensor([[1.0, 2.0, 99.0], [3.0, 4.0, -7.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    # masked values 1, 2, 3, 4: mean 2.5, unbiased var (2.25 + .25 + .25 + 2.25) / 3 = 5/3
    s = math.sqrt(5 / 3 + 1e-8)
    close(masked_whiten(x, mask), [[-1.5 / s, -0.5 / s, 0], [0.5 / s, 1.5 / s, 0]])
    # fewer than two tokens: zeros, never NaN
    close(masked_whiten(x, torch.tensor([[0, 1, 0], [0, 0, 0]])), [[0, 0, 0], [0, 0, 0]])
    close(masked_whiten(x, torch.zeros(2, 3)), [[0, 0, 0], [0, 0, 0]])


# --------------------------------------------------------------------- GAE
VALUES = torch.tensor([[0.0, 0.0, 0.1, 0.2, 9.0, 9.0, 0.3, 0.4]])  # observations valued 9


def test_gae_aligned_hand_worked() -> None:
    r, m = traj(1, [(0.5, 1.0)])
    adv, ret = gae(r, VALUES, m, gamma=0.9, lam=0.8)
    # recursion over positions 2, 3, 6, 7 (the observations' values 9 never enter); gamma*lam = 0.72
    # d7 = 1 + 0 - .4 = .6                 A7 = .6
    # d6 = 0 + .9*.4 - .3 = .06            A6 = .06 + .72*.6 = .492
    # d3 = .5 + .9*.3 - .2 = .57           A3 = .57 + .72*.492 = .92424
    # d2 = 0 + .9*.2 - .1 = .08            A2 = .08 + .72*.92424 = .7454528
    raw = [0, 0, 0.7454528, 0.92424, 0, 0, 0.492, 0.6]
    close(ret, [[0, 0, 0.8454528, 1.12424, 0, 0, 0.792, 1.0]])  # raw + V on action tokens
    close(adv, masked_whiten(torch.tensor([raw]), m).tolist())
    assert (adv[0, [0, 1, 4, 5]] == 0).all()


def test_gae_unaligned_hand_worked() -> None:
    r, m = traj(1, [(0.5, 1.0)])
    adv, ret = gae(r, VALUES, m, gamma=0.9, lam=0.8, align=False)
    # recursion over positions 2..7, observations with their own values and zero rewards:
    # A7 = .6, A6 = .492 (as aligned)
    # d5 = 0 + .9*.3 - 9 = -8.73          A5 = -8.73 + .72*.492 = -8.37576
    # d4 = 0 + .9*9 - 9 = -.9             A4 = -.9 + .72*(-8.37576) = -6.9305472
    # d3 = .5 + .9*9 - .2 = 8.4           A3 = 8.4 + .72*(-6.9305472) = 3.410006016
    # d2 = .08                            A2 = .08 + .72*3.410006016 = 2.535204332
    raw = [0, 0, 2.535204332, 3.410006016, -6.9305472, -8.37576, 0.492, 0.6]
    close(ret - VALUES * span_mask(m), [raw], tol=1e-4)
    close(adv, masked_whiten(torch.tensor([raw]), span_mask(m)).tolist(), tol=1e-4)


def test_gae_aligned_equals_gae_on_compacted_actions() -> None:
    r, m = traj(2, [(0.5, 1.0), (0.0, -1.0)])
    values = torch.tensor([[5.0, 5.0, 0.1, 0.2, 9.0, 9.0, 0.3, 0.4], [1.0, 2.0, 0.5, -0.2, 3.0, 4.0, 0.7, 0.1]])
    adv, ret = gae(r, values, m, gamma=0.95, lam=0.9)
    keep = [2, 3, 6, 7]
    adv_c, ret_c = gae(r[:, keep], values[:, keep], torch.ones(2, 4, dtype=torch.long), gamma=0.95, lam=0.9)
    torch.testing.assert_close(adv[:, keep], adv_c)
    torch.testing.assert_close(ret[:, keep], ret_c)


def test_gae_padding_is_inert() -> None:
    """A right-padded short row gives the same numbers as on its own, whatever the pad values."""
    r, m = traj(1, [(0.5, 1.0)])
    padded_r = torch.cat([r, torch.zeros(1, 3)], 1)
    padded_m = torch.cat([m, torch.zeros(1, 3, dtype=torch.long)], 1)
    long_r = torch.zeros(1, 11)
    long_r[0, 10] = 2.0
    long_m = torch.tensor([[0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]])
    values = torch.randn(2, 11)
    _, ret_batch = gae(torch.cat([padded_r, long_r]), values, torch.cat([padded_m, long_m]), gamma=0.9, lam=0.8)
    _, ret_alone = gae(r, values[:1, :8], m, gamma=0.9, lam=0.8)
    torch.testing.assert_close(ret_batch[:1, :8], ret_alone)
    assert (ret_batch[0, 8:] == 0).all()


def test_advantage_mask_switch_for_gae() -> None:
    """align=False: observation tokens get advantages, and the raw advantages of the action tokens
    *before* an observation change when gamma*lam < 1 (the observations add recursion steps and their
    values enter), even with observation values 0. With gamma = lam = 1 GAE telescopes to
    reward-to-go - V(t): the raw advantages of action tokens do not change, whatever the observation
    values. Tokens after the last observation never change."""
    r, m = traj(1, [(0.5, 1.0)])
    for obs_value in (0.0, 9.0):
        values = VALUES.clone()
        values[0, OBS] = obs_value
        _, ret_on = gae(r, values, m, gamma=1.0, lam=1.0)
        _, ret_off = gae(r, values, m, gamma=1.0, lam=1.0, align=False)
        torch.testing.assert_close(ret_on[:, TURN1 + TURN2], ret_off[:, TURN1 + TURN2])
        adv_on, ret_on = gae(r, values, m, gamma=0.9, lam=0.8)
        adv_off, ret_off = gae(r, values, m, gamma=0.9, lam=0.8, align=False)
        assert (adv_on[0, OBS] == 0).all() and (adv_off[0, OBS] != 0).all()
        torch.testing.assert_close(ret_on[:, TURN2], ret_off[:, TURN2])
        assert (ret_on[0, TURN1] != ret_off[0, TURN1]).all()
        # raw A3 unaligned (aligned: .92424). obs 0: d5 = .27, A5 = .62424, d4 = 0, A4 = .4494528,
        # d3 = .5 - .2 = .3, A3 = .3 + .72 * .4494528 = .623606016; obs 9: see test_gae_unaligned_hand_worked
        expected = {0.0: 0.623606016, 9.0: 3.410006016}[obs_value]
        assert float(ret_off[0, 3] - values[0, 3]) == pytest.approx(expected, abs=1e-5)


def test_gae_process_rewards_switch() -> None:
    r, m = traj(1, [(0.5, 1.0)])
    values = torch.zeros(1, 8)
    _, ret = gae(r, values, m, gamma=1.0, lam=1.0)
    close(ret, [[0, 0, 1.5, 1.5, 0, 0, 1.0, 1.0]])  # turn 1 sees p + o, turn 2 sees o
    _, ret = gae(r, values, m, gamma=1.0, lam=1.0, process_rewards=False)
    close(ret, [[0, 0, 1.5, 1.5, 0, 0, 1.5, 1.5]])  # everything moved to the end


# -------------------------------------------------------------- REINFORCE++
def test_reinforce_pp_discounting() -> None:
    r, m = traj(1, [(0.5, 1.0)])
    # gamma .5 over action tokens 2, 3, 6, 7: G7 = 1, G6 = .5, G3 = .5 + .5*.5 = .75, G2 = .375
    adv, ret = reinforce_pp(r, m, gamma=0.5)
    close(ret, [[0, 0, 0.375, 0.75, 0, 0, 0.5, 1.0]])
    # whitened over the four: mean .65625, deviations -.28125 .09375 -.15625 .34375
    var = (0.28125**2 + 0.09375**2 + 0.15625**2 + 0.34375**2) / 3
    s = math.sqrt(var + 1e-8)
    close(adv, [[0, 0, -0.28125 / s, 0.09375 / s, 0, 0, -0.15625 / s, 0.34375 / s]])
    # align=False: the observations count as steps: G5 = .25, G4 = .125, G3 = .5 + .0625, G2 = .28125
    _, ret = reinforce_pp(r, m, gamma=0.5, align=False)
    close(ret, [[0, 0, 0.28125, 0.5625, 0.125, 0.25, 0.5, 1.0]])


# ------------------------------------------------------ group estimators
def test_grpo_outcome_only_is_standard() -> None:
    # group 7: scores 1, 0, .5 -> mean .5, unbiased std sqrt((.25 + .25 + 0) / 2) = .5; group 9: one sample
    r, m = traj(4, [(0, 1.0), (0, 0.0), (0, 0.5), (0, 3.0)])
    gid = torch.tensor([7, 7, 7, 9])
    adv, ret = grpo(r, m, gid)
    z = 0.5 / (0.5 + 1e-6)
    close(adv, [[0, 0, z, z, 0, 0, z, z], [0, 0, -z, -z, 0, 0, -z, -z], [0] * 8, [0] * 8])
    assert torch.equal(adv, ret)
    # without std: score - mean
    adv, _ = grpo(r, m, gid, norm_by_std=False)
    close(adv[:3], [[0, 0, 0.5, 0.5, 0, 0, 0.5, 0.5], [0, 0, -0.5, -0.5, 0, 0, -0.5, -0.5], [0] * 8])
    # advantage mask off: broadcast over the response (observations 4, 5 too)
    adv, _ = grpo(r, m, gid, align=False)
    close(adv[0], [0, 0, z, z, z, z, z, z])


def test_grpo_all_equal_rewards_give_zero() -> None:
    r, m = traj(3, [(0, 1.0)] * 3)
    adv, _ = grpo(r, m, torch.zeros(3, dtype=torch.long))
    assert torch.equal(adv, torch.zeros(3, 8))


def test_grpo_process_reward_on_turn_one() -> None:
    # A: p = .5, o = 1 (total 1.5); B: nothing (total 0). mean .75
    # centred reward-to-go: A turn 1 .75, turn 2 .25; B -.75
    # spread: A (.75^2 + .75^2 + .25^2 + .25^2) / 4 = .3125; B .5625; var = (.3125 + .5625) / 1 = .875
    r, m = traj(2, [(0.5, 1.0), (0.0, 0.0)])
    adv, _ = grpo(r, m, torch.tensor([0, 0]))
    s = math.sqrt(0.875) + 1e-6
    close(adv, [[0, 0, 0.75 / s, 0.75 / s, 0, 0, 0.25 / s, 0.25 / s], [0, 0, -0.75 / s, -0.75 / s, 0, 0, -0.75 / s, -0.75 / s]])
    assert adv[0, 2] - adv[0, 6] == pytest.approx(0.5 / s, abs=1e-6)  # exactly p, normalised
    # off: all of A's tokens see 1.5; var = (.75^2 + .75^2) / 1 = 1.125
    adv, _ = grpo(r, m, torch.tensor([0, 0]), process_rewards=False)
    z = 0.75 / (math.sqrt(1.125) + 1e-6)
    close(adv, [[0, 0, z, z, 0, 0, z, z], [0, 0, -z, -z, 0, 0, -z, -z]])


def test_grpo_equal_totals_with_process_rewards_stay_bounded() -> None:
    # both: p = .5, o = .5 (total 1). turn 1 centred 0, turn 2 -.5; spread (0 + 0 + .25 + .25) / 4 = .125 each
    # var = .25 / 1 -> std .5: turn 2 gets -1 (the std of the totals, 0, would give -.5 / 1e-6)
    r, m = traj(2, [(0.5, 0.5)] * 2)
    adv, _ = grpo(r, m, torch.tensor([0, 0]))
    close(adv, [[0, 0, 0, 0, 0, 0, -1 / 1.000002, -1 / 1.000002]] * 2)


def test_rloo_hand_worked() -> None:
    # scores 1, 0, .5: A_i = S_i - mean of the others: 1 - .25, 0 - .75, .5 - .5; singleton -> 0
    r, m = traj(4, [(0, 1.0), (0, 0.0), (0, 0.5), (0, 3.0)])
    adv, ret = rloo(r, m, torch.tensor([7, 7, 7, 9]))
    close(adv, [[0, 0, 0.75, 0.75, 0, 0, 0.75, 0.75], [0, 0, -0.75, -0.75, 0, 0, -0.75, -0.75], [0] * 8, [0] * 8])
    assert torch.equal(adv, ret)
    # process reward: A (p .5, o 1) vs B (0): A turn 1 = 1.5 - 0, turn 2 = 1 - 0; B = 0 - 1.5
    r, m = traj(2, [(0.5, 1.0), (0.0, 0.0)])
    adv, _ = rloo(r, m, torch.tensor([0, 0]))
    close(adv, [[0, 0, 1.5, 1.5, 0, 0, 1.0, 1.0], [0, 0, -1.5, -1.5, 0, 0, -1.5, -1.5]])


def test_reinforce_pp_baseline_hand_worked() -> None:
    # group 7 centred 0.5, -0.5, 0 on 4 action tokens each: 12 tokens, mean 0, var (8 * .25) / 11;
    # the singleton (group 9) is left out of the statistics and gets 0
    r, m = traj(4, [(0, 1.0), (0, 0.0), (0, 0.5), (0, 3.0)])
    adv, ret = reinforce_pp_baseline(r, m, torch.tensor([7, 7, 7, 9]))
    z = 0.5 / math.sqrt(2 / 11 + 1e-8)
    close(adv, [[0, 0, z, z, 0, 0, z, z], [0, 0, -z, -z, 0, 0, -z, -z], [0] * 8, [0] * 8])
    assert torch.equal(adv, ret)
    # process reward (A: p .5, o 1; B: 0): centred A .75 .75 .25 .25, B -.75 x4; mean -.125
    # deviations .875 x2, .375 x2, -.625 x4: var (2*.765625 + 2*.140625 + 4*.390625) / 7 = 3.375 / 7
    r, m = traj(2, [(0.5, 1.0), (0.0, 0.0)])
    adv, _ = reinforce_pp_baseline(r, m, torch.tensor([0, 0]))
    s = math.sqrt(3.375 / 7 + 1e-8)
    close(adv, [[0, 0, 0.875 / s, 0.875 / s, 0, 0, 0.375 / s, 0.375 / s], [0, 0, -0.625 / s, -0.625 / s, 0, 0, -0.625 / s, -0.625 / s]])
    assert adv[0, 2] - adv[0, 6] == pytest.approx(0.5 / s, abs=1e-5)


@pytest.mark.parametrize("estimator", [grpo, rloo])
def test_advantage_mask_switch_for_group_estimators(estimator) -> None:
    """align=False keeps the action tokens' advantages and gives each observation its turn's value."""
    r, m = traj(2, [(0.5, 1.0), (0.0, 0.0)])
    gid = torch.tensor([0, 0])
    on, _ = estimator(r, m, gid)
    off, _ = estimator(r, m, gid, align=False)
    torch.testing.assert_close(off[:, TURN1 + TURN2], on[:, TURN1 + TURN2])
    assert (on[:, OBS] == 0).all()
    torch.testing.assert_close(off[:, OBS], on[:, [3, 3]])  # the observation after turn 1 shares turn 1's value
    assert (off[:, :2] == 0).all()  # never the prompt


@pytest.mark.parametrize("name", sorted(ESTIMATORS.names()))
def test_outcome_only_rewards_make_process_switch_a_no_op(name: str) -> None:
    r, m = traj(4, [(0, 1.0), (0, 0.0), (0, 0.5), (0, 0.25)])
    common = dict(token_rewards=r, action_mask=m, group_id=torch.tensor([0, 0, 1, 1]), values=torch.randn(4, 8), gamma=0.9, lam=0.95)
    on = compute_advantages(name, **common, process_rewards=True)
    off = compute_advantages(name, **common, process_rewards=False)
    torch.testing.assert_close(on, off, rtol=0, atol=0)


@pytest.mark.parametrize("name", sorted(ESTIMATORS.names()))
def test_process_reward_separates_turns_in_every_estimator(name: str) -> None:
    """Turn 1 above turn 2 in sample A with process rewards on; equal with them off (gamma = lam = 1, V = 0)."""
    r, m = traj(2, [(0.5, 1.0), (0.0, 0.0)])
    common = dict(token_rewards=r, action_mask=m, group_id=torch.tensor([0, 0]), values=torch.zeros(2, 8))
    adv, _ = compute_advantages(name, **common)
    assert adv[0, 2] > adv[0, 6] and adv[0, 3] == adv[0, 2] and adv[0, 7] == adv[0, 6]
    adv, _ = compute_advantages(name, **common, process_rewards=False)
    assert adv[0, 2] == pytest.approx(float(adv[0, 6]), abs=1e-6)


# ------------------------------------------------------------------ adapter
def test_compute_advantages_adapter() -> None:
    r, m = traj(2, [(0, 1.0), (0, 0.0)])
    gid = torch.tensor([0, 0])
    torch.testing.assert_close(compute_advantages("grpo", token_rewards=r, action_mask=m, group_id=gid, lam=0.3), grpo(r, m, gid))
    torch.testing.assert_close(compute_advantages("ppo", token_rewards=r, action_mask=m, group_id=None, values=torch.ones(2, 8)), gae(r, torch.ones(2, 8), m, 1.0, 1.0))
    with pytest.raises(ValueError, match="'gae' needs values"):
        compute_advantages("gae", token_rewards=r, action_mask=m, group_id=gid)
    with pytest.raises(ValueError, match="'rloo' needs group_id"):
        compute_advantages("rloo", token_rewards=r, action_mask=m, group_id=None)
    with pytest.raises(ValueError, match="unknown advantage estimator 'a2c'"):
        compute_advantages("a2c", token_rewards=r, action_mask=m, group_id=gid)
    with pytest.raises(TypeError, match="bogus"):
        compute_advantages("grpo", token_rewards=r, action_mask=m, group_id=gid, bogus=1)


def test_reward_off_the_action_tokens_is_an_error() -> None:
    r, m = traj(1, [(0, 1.0)])
    r[0, 4] = 0.3
    with pytest.raises(ValueError, match=r"token_rewards\[0, 4\] = 0.3"):
        grpo(r, m, torch.tensor([0]))
    with pytest.raises(ValueError, match=r"response_mask\[0, 2\] is 0 on an action token"):
        gae(traj(1, [(0, 1.0)])[0], torch.zeros(1, 8), m, 1.0, 1.0, align=False, response_mask=torch.zeros(1, 8))


# ---------------------------------------------------------------- properties
@st.composite
def batches(draw):
    b = draw(st.integers(1, 6))
    t = draw(st.integers(1, 10))
    mask = torch.tensor(draw(st.lists(st.lists(st.integers(0, 1), min_size=t, max_size=t), min_size=b, max_size=b)))
    rewards = torch.tensor(draw(st.lists(st.lists(st.sampled_from([-1.0, 0.0, 0.0, 0.5, 1.0]), min_size=t, max_size=t), min_size=b, max_size=b)))
    rewards = rewards * mask
    group_id = torch.tensor(draw(st.lists(st.integers(0, 3), min_size=b, max_size=b)))
    values = torch.tensor(draw(st.lists(st.lists(st.floats(-2, 2), min_size=t, max_size=t), min_size=b, max_size=b)))
    return rewards, mask, group_id, values


@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from(sorted(ESTIMATORS.names())), st.booleans(), st.booleans())
def test_properties_shapes_finite_zero_off_mask(batch, name, align, process) -> None:
    rewards, mask, group_id, values = batch
    adv, ret = compute_advantages(
        name, token_rewards=rewards, action_mask=mask, group_id=group_id, values=values,
        gamma=0.9, lam=0.8, align=align, process_rewards=process,
    )
    where = advantage_mask(mask, align)
    for x in (adv, ret):
        assert x.shape == rewards.shape and x.dtype == torch.float32
        assert torch.isfinite(x).all()
        assert (x[where == 0] == 0).all()


@settings(max_examples=40, deadline=None)
@given(batches())
def test_property_gae_aligned_is_gae_on_each_compacted_row(batch) -> None:
    rewards, mask, _, values = batch
    _, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    for i in range(rewards.shape[0]):
        keep = mask[i] > 0
        if keep.any():
            _, ret_i = gae(rewards[i : i + 1, keep], values[i : i + 1, keep], torch.ones(1, int(keep.sum()), dtype=torch.long), gamma=0.9, lam=0.8)
            torch.testing.assert_close(ret[i, keep], ret_i[0])


# ------------------------------------------------------------------ plugins (algorithm.name: package.module:fn)
PLUGIN = '''
import torch

def outcome_minus_half(token_rewards, action_mask, *, process_rewards=True):
    adv = (token_rewards.sum(-1, keepdim=True) - 0.5) * action_mask
    return adv, adv

def td_error(token_rewards, values, action_mask):
    return (token_rewards - values) * action_mask, token_rewards

td_error.needs_critic = True

not_a_function = 3

def renamed(rewards, mask):
    return rewards, rewards

def needs_beta(token_rewards, action_mask, beta):
    return token_rewards, token_rewards
'''


@pytest.fixture
def plugin_module(tmp_path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "user_estimators.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "user_estimators"


def test_a_plugin_estimator_is_named_in_params_and_computes_the_advantages(plugin_module: str) -> None:
    from agent_r1.config import parse_params

    name = parse_params({"algorithm": {"name": f"{plugin_module}:outcome_minus_half"}}).algorithm.name
    assert ESTIMATORS.meta(name, "needs_critic", False) is False
    r, m = traj(2, [(0, 1.0), (0, 0.0)])
    adv, ret = compute_advantages(name, token_rewards=r, action_mask=m, group_id=torch.tensor([0, 0]), gamma=0.9)
    close(adv, [[0, 0, 0.5, 0.5, 0, 0, 0.5, 0.5], [0, 0, -0.5, -0.5, 0, 0, -0.5, -0.5]])
    torch.testing.assert_close(ret, adv)

    critic = parse_params({"algorithm": {"name": f"{plugin_module}:td_error"}}).algorithm.name
    assert ESTIMATORS.meta(critic, "needs_critic", False) is True
    values = torch.full((2, 8), 0.25)
    adv, _ = compute_advantages(critic, token_rewards=r, action_mask=m, group_id=None, values=values)
    close(adv, [[0, 0, -0.25, -0.25, 0, 0, -0.25, 0.75], [0, 0, -0.25, -0.25, 0, 0, -0.25, -0.25]])
    with pytest.raises(ValueError, match="needs values"):
        compute_advantages(critic, token_rewards=r, action_mask=m, group_id=None)


@pytest.mark.parametrize(("ref", "why"), [
    ("no_such_module:fn", "could not be imported: ModuleNotFoundError"),
    ("user_estimators:missing", "could not be imported: ImportError: module 'user_estimators' has no attribute 'missing'"),
    ("user_estimators:not_a_function", "must be a function, got 3"),
    ("user_estimators:renamed", "must take the arguments token_rewards, action_mask"),
    ("user_estimators:needs_beta", "requires beta"),
    ("a2c", "unknown advantage estimator 'a2c'; one of ppo, gae, grpo"),
])
def test_a_bad_estimator_fails_the_params_check_naming_the_key(plugin_module: str, ref: str, why: str) -> None:
    from agent_r1.config import ParamsError, parse_params

    with pytest.raises(ParamsError, match=re.escape("algorithm.name: ") + ".*" + re.escape(why)):
        parse_params({"algorithm": {"name": ref}})
