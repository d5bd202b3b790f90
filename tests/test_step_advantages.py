"""Step-level credit assignment: hand-worked numbers on small step tables, padding, the flat equivalence.

The running batch (E = 4 episodes, S = 3 steps; r: step rewards, . a padded step):

    episode  group  step 0  step 1  step 2   return S
    0        7      0.5     0       1.0      1.5
    1        7      0       0       .        0
    2        7      0.75    .       .        0.75
    3        9      0       3.0     .        3.0      (a group of one)
"""

from __future__ import annotations

import math

import pytest
import torch

from agent_r1.algorithms.advantages import gae, grpo, reinforce_pp, reinforce_pp_baseline, rloo
from agent_r1.algorithms.step_advantages import broadcast_to_tokens, compute_step_advantages, step_table
from agent_r1.registry import ESTIMATORS

REWARDS = torch.tensor([[0.5, 0.0, 1.0], [0.0, 0.0, 0.0], [0.75, 0.0, 0.0], [0.0, 3.0, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 0]])
GROUPS = torch.tensor([7, 7, 7, 9])

FLAT_OF = {"gae": gae, "grpo": grpo, "rloo": rloo, "reinforce_pp": reinforce_pp, "reinforce_pp_baseline": reinforce_pp_baseline}
BUILT_IN = sorted(["ppo", *FLAT_OF])  # ppo: the registry's other name for gae


def close(actual: torch.Tensor, expected: list, tol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=tol, rtol=0)


# ------------------------------------------------------- gamma, lam over steps
def test_step_gae_three_steps_hand_worked() -> None:
    r = torch.tensor([[0.0, 0.5, 1.0]])
    v = torch.tensor([[0.5, 0.25, 0.5]])
    adv, ret = compute_step_advantages("gae", step_rewards=r, values=v, step_mask=torch.ones(1, 3, dtype=torch.long), group_id=None,
                                       gamma=0.5, lam=0.8)
    # gamma * lam = .4, one recursion step per *step*:
    # d2 = 1 + 0 - .5 = .5                    A2 = .5
    # d1 = .5 + .5*.5 - .25 = .5              A1 = .5 + .4*.5 = .7
    # d0 = 0 + .5*.25 - .5 = -.375            A0 = -.375 + .4*.7 = -.095
    close(ret, [[0.405, 0.95, 1.0]])  # A + V
    # whitened over the 3 steps: mean .368333, deviations -.463333 .331667 .131667, var .171008 (Bessel)
    s = math.sqrt(0.17100833333 + 1e-8)
    close(adv, [[-0.46333333 / s, 0.33166667 / s, 0.13166667 / s]])


def test_step_reinforce_pp_discounts_per_step_not_per_token() -> None:
    r = torch.tensor([[0.0, 0.5, 1.0]])
    adv, ret = compute_step_advantages("reinforce_pp", step_rewards=r, step_mask=torch.ones(1, 3, dtype=torch.long), group_id=None,
                                       gamma=0.5)
    # G2 = 1, G1 = .5 + .5*1 = 1, G0 = 0 + .5*1 = .5; mean 5/6, deviations -1/3 1/6 1/6, var 1/12
    close(ret, [[0.5, 1.0, 1.0]])
    s = math.sqrt(1 / 12 + 1e-8)
    close(adv, [[-1 / 3 / s, 1 / 6 / s, 1 / 6 / s]])
    # the same episode flat, two action tokens a turn (rewards on each turn's last token):
    # gamma ages per token: G = 1, .5, .5 + .25 = .75, .375, .1875, .09375 from the end
    flat_r = torch.tensor([[0.0, 0.0, 0.0, 0.5, 0.0, 1.0]])
    _, flat_ret = reinforce_pp(flat_r, torch.ones(1, 6, dtype=torch.long), gamma=0.5)
    close(flat_ret, [[0.09375, 0.1875, 0.375, 0.75, 0.5, 1.0]])  # turn 1 starts at .09375, step 0 at .5


# ------------------------------------------------------ group estimators
def test_step_grpo_hand_worked() -> None:
    # return-to-go R: ep0 1.5 1 1, ep1 0 0, ep2 .75; group 7 mean (1.5 + 0 + .75) / 3 = .75
    adv, ret = compute_step_advantages("grpo", step_rewards=REWARDS, step_mask=MASK, group_id=GROUPS, norm_by_std=False)
    close(adv, [[0.75, 0.25, 0.25], [-0.75, -0.75, 0], [0, 0, 0], [0, 0, 0]])  # ep3 alone -> 0
    assert torch.equal(adv, ret)
    # std: per-episode mean over its steps of (R - mean)^2: ep0 (.5625 + .0625 + .0625) / 3 = 11/48,
    # ep1 .5625 = 27/48, ep2 0; var = (38/48) / (3 - 1) = 19/48
    adv, _ = compute_step_advantages("grpo", step_rewards=REWARDS, step_mask=MASK, group_id=GROUPS, norm_by_std=True)
    s = math.sqrt(19 / 48) + 1e-6
    close(adv, [[0.75 / s, 0.25 / s, 0.25 / s], [-0.75 / s, -0.75 / s, 0], [0, 0, 0], [0, 0, 0]])
    # process rewards off: ep0's .5 moves to its last step, every step of ep0 sees 1.5
    adv, _ = compute_step_advantages("grpo", step_rewards=REWARDS, step_mask=MASK, group_id=GROUPS, norm_by_std=False,
                                     process_rewards=False)
    close(adv, [[0.75, 0.75, 0.75], [-0.75, -0.75, 0], [0, 0, 0], [0, 0, 0]])


def test_step_rloo_hand_worked() -> None:
    # baseline = mean return of the two others: ep0 (0 + .75) / 2 = .375, ep1 (1.5 + .75) / 2 = 1.125, ep2 .75
    adv, ret = compute_step_advantages("rloo", step_rewards=REWARDS, step_mask=MASK, group_id=GROUPS)
    close(adv, [[1.125, 0.625, 0.625], [-1.125, -1.125, 0], [0, 0, 0], [0, 0, 0]])
    assert torch.equal(adv, ret)


def test_step_reinforce_pp_baseline_hand_worked() -> None:
    # B = R - .75 on group 7's six real steps: .75 .25 .25 -.75 -.75 0; mean -1/24,
    # deviations 19 7 7 -17 -17 1 (/24): sum of squares 1038/576, var 1038/576/5; ep3 (alone) left out -> 0
    adv, ret = compute_step_advantages("reinforce_pp_baseline", step_rewards=REWARDS, step_mask=MASK, group_id=GROUPS)
    s = math.sqrt(1038 / 576 / 5 + 1e-8) * 24
    close(adv, [[19 / s, 7 / s, 7 / s], [-17 / s, -17 / s, 0], [1 / s, 0, 0], [0, 0, 0]])
    assert torch.equal(adv, ret)


def test_step_reinforce_pp_on_the_batch() -> None:
    # gamma .5: G ep0 .75 .5 1, ep1 0 0, ep2 .75, ep3 1.5 3 (no groups); 8 real steps, mean .9375,
    # sum of squared deviations 6.59375, var 6.59375 / 7
    adv, ret = compute_step_advantages("reinforce_pp", step_rewards=REWARDS, step_mask=MASK, group_id=None, gamma=0.5)
    close(ret, [[0.75, 0.5, 1.0], [0, 0, 0], [0.75, 0, 0], [1.5, 3.0, 0]])
    s = math.sqrt(6.59375 / 7 + 1e-8)
    dev = [[-0.1875, -0.4375, 0.0625], [-0.9375, -0.9375, None], [-0.1875, None, None], [0.5625, 2.0625, None]]
    close(adv, [[0.0 if d is None else d / s for d in row] for row in dev])


# ------------------------------------------------------------------ padding
@pytest.mark.parametrize("name", BUILT_IN)
def test_padding_never_leaks(name: str) -> None:
    """Two more padded steps, their values NaN: the real steps' numbers are unchanged, the padded ones 0."""
    values = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 9.0], [0.6, 9.0, 9.0], [0.7, 0.8, 9.0]])
    values = torch.where(MASK > 0, values, torch.full_like(values, float("nan")))
    common = dict(group_id=GROUPS, gamma=0.9, lam=0.8)
    adv, ret = compute_step_advantages(name, step_rewards=REWARDS, step_mask=MASK, values=values.nan_to_num(7.0), **common)
    wide = dict(step_rewards=torch.cat([REWARDS, torch.zeros(4, 2)], 1), step_mask=torch.cat([MASK, torch.zeros(4, 2, dtype=torch.long)], 1))
    adv_w, ret_w = compute_step_advantages(name, **wide, values=torch.cat([values, torch.full((4, 2), float("nan"))], 1), **common)
    torch.testing.assert_close(adv_w[:, :3], adv)
    torch.testing.assert_close(ret_w[:, :3], ret)
    for x in (adv, ret, adv_w, ret_w):
        assert (x[:, :3][MASK == 0] == 0).all() and (x[:, 3:] == 0).all() and torch.isfinite(x).all()
    assert adv[MASK > 0].abs().sum() > 0


def test_a_reward_on_a_padded_step_is_an_error() -> None:
    r = REWARDS.clone()
    r[2, 1] = 0.3
    with pytest.raises(ValueError, match=r"step reward \[2, 1\] = 0.3 is on a padded step"):
        compute_step_advantages("grpo", step_rewards=r, step_mask=MASK, group_id=GROUPS)
    with pytest.raises(ValueError, match="must be the same"):
        compute_step_advantages("grpo", step_rewards=REWARDS, step_mask=MASK[:, :2], group_id=GROUPS)


# ------------------------------------------- one step per episode == flat
def one_step_episodes(turn: int) -> dict[str, torch.Tensor]:
    """Five one-turn episodes, step table [5, 1] and flat [5, 2 + turn + 1]: prompt 2, ``turn`` action
    tokens (the reward on the last, the step's value on each), one padding token."""
    returns = torch.tensor([1.0, 0.0, 0.5, -1.0, 2.0])
    step_values = torch.tensor([0.3, -0.2, 0.1, 0.4, 0.5])
    width = 2 + turn + 1
    action = torch.zeros(5, width, dtype=torch.long)
    action[:, 2 : 2 + turn] = 1
    flat_r = torch.zeros(5, width)
    flat_r[:, 1 + turn] = returns
    flat_v = torch.full((5, width), 9.0)
    flat_v[:, 2 : 2 + turn] = step_values[:, None]
    return dict(step_r=returns[:, None], step_m=torch.ones(5, 1, dtype=torch.long), step_v=step_values[:, None],
                flat_r=flat_r, flat_m=action, flat_v=flat_v, groups=torch.tensor([0, 0, 0, 1, 1]))


def run(
    fn, rewards: torch.Tensor, mask: torch.Tensor, values: torch.Tensor, groups: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """A flat estimator with the arguments it takes (positional, as its own signature orders them)."""
    if fn is gae:
        return fn(rewards, values, mask, gamma, lam)
    if fn is reinforce_pp:
        return fn(rewards, mask, gamma)
    return fn(rewards, mask, groups)


def run_steps(name: str, e: dict[str, torch.Tensor], gamma: float, lam: float, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    """``name`` over the step table of :func:`one_step_episodes`."""
    return compute_step_advantages(name, step_rewards=e["step_r"], step_mask=e["step_m"], group_id=e["groups"], values=e["step_v"],
                                   gamma=gamma, lam=lam, **kw)


@pytest.mark.parametrize("name", list(FLAT_OF))
def test_one_step_per_episode_equals_flat_for_one_token_turns(name: str) -> None:
    """Every estimator, any gamma / lam: each step's advantage and return is the flat one on its action token."""
    e = one_step_episodes(turn=1)
    adv, ret = run_steps(name, e, 0.9, 0.8)
    flat_adv, flat_ret = run(FLAT_OF[name], e["flat_r"], e["flat_m"], e["flat_v"], e["groups"], 0.9, 0.8)
    torch.testing.assert_close(adv[:, 0], flat_adv[:, 2])
    torch.testing.assert_close(ret[:, 0], flat_ret[:, 2])
    assert adv.abs().sum() > 0


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_one_step_per_episode_equals_flat_group_estimators_for_long_turns(name: str) -> None:
    """GRPO and RLOO do not discount or whiten per token: equal on every action token of a 3-token turn."""
    e = one_step_episodes(turn=3)
    adv, _ = run_steps(name, e, 1.0, 1.0)
    flat_adv, _ = run(FLAT_OF[name], e["flat_r"], e["flat_m"], e["flat_v"], e["groups"], 1.0, 1.0)
    torch.testing.assert_close(flat_adv[:, 2:5], adv.expand(5, 3))
    if name == "grpo":  # with the std: the flat scale averages over the turn's tokens, the step one over its one step
        torch.testing.assert_close(run_steps("grpo", e, 1.0, 1.0, norm_by_std=True)[0].expand(5, 3),
                                   grpo(e["flat_r"], e["flat_m"], e["groups"], norm_by_std=True)[0][:, 2:5])


@pytest.mark.parametrize("name", ["gae", "reinforce_pp"])
def test_one_step_per_episode_long_turns_same_returns_at_gamma_one(name: str) -> None:
    """With gamma = lam = 1 the raw quantities (returns) agree on a 3-token turn; only the whitening's
    weighting (per token flat, per step here) differs."""
    e = one_step_episodes(turn=3)
    _, ret = run_steps(name, e, 1.0, 1.0)
    _, flat_ret = run(FLAT_OF[name], e["flat_r"], e["flat_m"], e["flat_v"], e["groups"], 1.0, 1.0)
    torch.testing.assert_close(flat_ret[:, 2:5], ret.expand(5, 3))


# ------------------------------------------------------------------ by name
@pytest.mark.parametrize("name", sorted(ESTIMATORS.names()))
def test_every_registered_estimator_runs_over_the_step_table(name: str) -> None:
    values = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.0], [0.6, 0.0, 0.0], [0.7, 0.8, 0.0]])
    got = compute_step_advantages(name, step_rewards=REWARDS, step_mask=MASK, group_id=GROUPS, values=values, gamma=0.9, lam=0.8, norm_by_std=True)
    # the step table is a trajectory table whose every real position is an action: the flat estimator on it
    torch.testing.assert_close(got, run(ESTIMATORS.load(name), REWARDS, MASK, values, GROUPS, 0.9, 0.8))


# --------------------------------------------------- rows <-> step table
def test_step_table_and_broadcast_to_tokens() -> None:
    # four step rows: (episode, step) = (0, 0) (0, 1) (1, 0) (0, 2), row rewards 1 2 3 4
    episode, step = torch.tensor([0, 0, 1, 0]), torch.tensor([0, 1, 0, 2])
    table, mask = step_table(torch.tensor([1.0, 2.0, 3.0, 4.0]), episode, step, episodes=3)
    close(table, [[1, 2, 4], [3, 0, 0], [0, 0, 0]])  # episode 2 has no row: no real step
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0], [0, 0, 0]]
    # each row's action tokens get its step's number, nothing else
    tokens = torch.tensor([[0, 1, 1, 0], [0, 0, 1, 1], [1, 1, 0, 0], [0, 1, 0, 1]])
    close(broadcast_to_tokens(table * 10, mask, episode, step, tokens), [[0, 10, 10, 0], [0, 0, 20, 20], [30, 30, 0, 0], [0, 40, 0, 40]])


def test_rows_that_do_not_make_a_step_table_are_errors() -> None:
    one = torch.ones(2)
    with pytest.raises(ValueError, match="step 0 of episode 1 is given by 2 rows"):
        step_table(one, torch.tensor([1, 1]), torch.tensor([0, 0]), episodes=2)
    with pytest.raises(ValueError, match="episode 0 has step 2 but no step 1"):
        step_table(one, torch.tensor([0, 0]), torch.tensor([0, 2]), episodes=1)
    with pytest.raises(ValueError, match="episode index 2 out of range for 2 episodes"):
        step_table(one, torch.tensor([0, 2]), torch.tensor([0, 0]), episodes=2)
    with pytest.raises(ValueError, match="step must be an integer"):
        step_table(one, torch.tensor([0, 1]), torch.tensor([0.0, 0.0]), episodes=2)
    table, mask = step_table(one, torch.tensor([0, 1]), torch.tensor([0, 0]), episodes=2)
    with pytest.raises(ValueError, match=r"row 1 is step 1 of episode 1, not a real step"):
        broadcast_to_tokens(table, mask, torch.tensor([0, 1]), torch.tensor([0, 1]), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"row 0 is step 0 of episode 5"):
        broadcast_to_tokens(table, mask, torch.tensor([5, 1]), torch.tensor([0, 0]), torch.ones(2, 3))
