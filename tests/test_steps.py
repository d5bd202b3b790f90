"""StepBatch: the flat trajectory cut at turn boundaries, token-exact, scored identically by a real model."""

from __future__ import annotations

from typing import Callable

import pytest
import torch

from agent_r1.rollout import (
    Step,
    StepBatch,
    TrajectoryBatch,
    broadcast_to_actions,
    episode_step_matrix,
    run_episodes,
    steps_from_trajectories,
)
from agent_r1.rollout.steps import STEP_ROW_FIELDS, STEP_TOKEN_FIELDS
from test_rollout_loop import RECORDS, ScriptedEngine, make_env, model_dir, rollout_cfg, tokenizer  # noqa: F401 (fixtures)

PAD = 2

# Episode 0, three turns: prompt | a0 | o0 | a1 | o1 | a2.  Episode 1, one turn, then an observation
# cut by max_length (it belongs to no step).
PROMPT0, A0, O0, A1, O1, A2 = [10, 11, 12], [20, 21], [30, 31], [22], [32, 33, 34], [23, 24, 25]
PROMPT1, B0, P0 = [10, 13], [26, 27], [35]


def _logprobs(actions: list[int], base: int) -> list[float]:
    """Distinct made-up logprobs on the action tokens (so a misplaced one shows), 0 elsewhere."""
    return [-(base + i) / 10 if a else 0.0 for i, a in enumerate(actions)]


def _flat_seqs() -> list[dict]:
    ids0 = PROMPT0 + A0 + O0 + A1 + O1 + A2
    act0 = [0] * 3 + [1, 1] + [0, 0] + [1] + [0, 0, 0] + [1, 1, 1]
    turn0 = [-1] * 3 + [0] * 4 + [1] * 4 + [2] * 3
    rew0 = [0.0] * 14
    rew0[4], rew0[7], rew0[13] = 0.1, -0.05, 1.0  # process rewards of turns 0, 1; turn 2's + the outcome
    ids1 = PROMPT1 + B0 + P0
    return [
        {"input_ids": ids0, "action_mask": act0, "turn_index": turn0, "token_rewards": rew0,
         "rollout_logprobs": _logprobs(act0, 1), "group_id": 0, "prompt_length": 3, "info": {"question_id": "q0"}},
        {"input_ids": ids1, "action_mask": [0, 0, 1, 1, 0], "turn_index": [-1, -1, 0, 0, 0],
         "token_rewards": [0.0, 0.0, 0.0, 0.5, 0.0], "rollout_logprobs": _logprobs([0, 0, 1, 1, 0], 20),
         "group_id": 1, "prompt_length": 2, "info": {"question_id": "q1"}},
    ]


def _flat() -> TrajectoryBatch:
    return TrajectoryBatch.from_sequences(_flat_seqs(), pad_id=PAD)


def _rows(b: StepBatch, index: list[int]) -> StepBatch:
    """The rows ``index`` of ``b`` (same episodes)."""
    picked = {name: getattr(b, name)[index] for name in (*STEP_TOKEN_FIELDS, *STEP_ROW_FIELDS)}
    return StepBatch(**picked, info=b.info)


def _real(b: StepBatch | TrajectoryBatch, row: int, name: str) -> list:
    return getattr(b, name)[row, : int(b.attention_mask[row].sum())].tolist()


def action_values(b: StepBatch | TrajectoryBatch, values: torch.Tensor, rows: list[int]) -> tuple[list[int], torch.Tensor]:
    """The action tokens of ``rows`` in order, and ``values`` ([N, L]) at them."""
    ids = [int(t) for r in rows for t in b.input_ids[r][b.action_mask[r] == 1]]
    return ids, torch.cat([values[r][b.action_mask[r] == 1] for r in rows])


def episode_rows(sb: StepBatch, e: int) -> list[int]:
    return sorted((sb.episode == e).nonzero().flatten().tolist(), key=lambda r: int(sb.turn[r]))


# ------------------------------------------------------------ (1) the cut, by hand
def test_steps_are_the_flat_trajectory_cut_at_turn_boundaries() -> None:
    sb = steps_from_trajectories(_flat())
    assert len(sb) == 4 and sb.n_episodes == 2 and sb.input_ids.shape == (4, 14)
    expected_ids = [PROMPT0 + A0, PROMPT0 + A0 + O0 + A1, PROMPT0 + A0 + O0 + A1 + O1 + A2, PROMPT1 + B0]
    assert [_real(sb, r, "input_ids") for r in range(4)] == expected_ids
    assert sb.input_ids[3].tolist() == PROMPT1 + B0 + [PAD] * 10  # the flat batch's padding id
    assert sb.prompt_length.tolist() == [3, 7, 11, 2]
    assert [_real(sb, r, "action_mask") for r in range(4)] == [
        [0, 0, 0, 1, 1], [0] * 7 + [1], [0] * 11 + [1, 1, 1], [0, 0, 1, 1]]
    assert sb.action_mask[3, 4:].sum() == 0 and sb.attention_mask.sum(-1).tolist() == [5, 8, 14, 4]
    flat_lp = _flat().rollout_logprobs
    assert [_real(sb, r, "rollout_logprobs")[int(sb.prompt_length[r]):] for r in range(4)] == [
        flat_lp[0, 3:5].tolist(), flat_lp[0, 7:8].tolist(), flat_lp[0, 11:14].tolist(), flat_lp[1, 2:4].tolist()]
    assert float(sb.rollout_logprobs[sb.action_mask == 0].abs().sum()) == 0.0
    assert sb.step_reward.tolist() == pytest.approx([0.1, -0.05, 1.0, 0.5])
    assert (sb.turn.tolist(), sb.episode.tolist(), sb.group_id.tolist()) == ([0, 1, 2, 0], [0, 0, 0, 1], [0, 0, 0, 1])
    assert sb.info == _flat().info


def test_episode_step_matrix_and_its_inverse_ignore_row_order() -> None:
    sb = _rows(steps_from_trajectories(_flat()), [2, 3, 0, 1])
    rewards, mask, group = episode_step_matrix(sb)
    assert torch.allclose(rewards, torch.tensor([[0.1, -0.05, 1.0], [0.5, 0.0, 0.0]]))
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0]] and group.tolist() == [0, 1]
    tokens = broadcast_to_actions(sb, torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]]))
    assert tokens.shape == sb.input_ids.shape
    assert [tokens[r][sb.action_mask[r] == 1].tolist() for r in range(4)] == [[3.0] * 3, [4.0] * 2, [1.0] * 2, [2.0]]
    assert float(tokens[sb.action_mask == 0].abs().sum()) == 0.0
    with pytest.raises(ValueError, match=r"expected \[episodes, steps\] = \(2, 3\)"):
        broadcast_to_actions(sb, torch.ones(2, 2))


def test_save_load_and_to_round_trip(tmp_path) -> None:
    sb = steps_from_trajectories(_flat())
    path = tmp_path / "steps.pt"
    sb.save(path)
    back = StepBatch.load(path).to("cpu")
    for name in (*STEP_TOKEN_FIELDS, *STEP_ROW_FIELDS):
        assert torch.equal(getattr(sb, name), getattr(back, name)), name
    assert back.info == sb.info
    _flat().save(path)
    with pytest.raises(ValueError, match="not a StepBatch"):
        StepBatch.load(path)


# ------------------------------------------------------------ (2) equivalence with a real model
@pytest.fixture(scope="module")
def three_turn_rollout(tokenizer) -> TrajectoryBatch:  # noqa: F811 (the fixture)
    """The real loop and ToolEnv (scripted actions): 4 episodes of 3 turns, questions of different lengths."""
    replies = ["<search>Ilsa Brandt</search>", "<search>Velmora Labs</search>", "<answer>Quorvale</answer>"]
    return run_episodes(ScriptedEngine(tokenizer, replies), make_env("tags", max_turns=3), tokenizer, RECORDS, rollout_cfg(n=2))


@pytest.fixture(scope="module")
def tiny_lm(tokenizer):  # noqa: F811 (the fixture)
    """A tiny random Llama over the real vocabulary (random weights: the check is on positions, not quality)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from agent_r1.training.logprobs import use_packed_attention

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True, attn_implementation="sdpa",
    )
    lm = LlamaForCausalLM(cfg).eval()
    use_packed_attention(lm)  # padded calls stay plain SDPA; packed ones run per row
    return lm


@pytest.mark.parametrize("packed", [False, True])
def test_action_token_logprobs_agree_between_flat_and_steps(three_turn_rollout, tiny_lm, packed: bool) -> None:
    from agent_r1.training.logprobs import token_logprobs

    flat = three_turn_rollout
    sb = steps_from_trajectories(flat)
    assert [i["turns"] for i in flat.info] == [3, 3, 3, 3] and len(sb) == 12
    assert len(set(flat.attention_mask.sum(-1).tolist())) > 1  # padding in the flat batch
    with torch.no_grad():
        # scored on action tokens only, as the trainer does: the LM head over the vocabulary is the cost
        flat_lp = token_logprobs(tiny_lm, flat.input_ids, flat.attention_mask, score_mask=flat.action_mask)
        step_lp = token_logprobs(tiny_lm, sb.input_ids, sb.attention_mask, score_mask=sb.action_mask, packed=packed)
    for e in range(len(flat)):
        rows = episode_rows(sb, e)
        want_ids, want = action_values(flat, flat_lp, [e])
        got_ids, got = action_values(sb, step_lp, rows)
        assert got_ids == want_ids, f"episode {e}: the steps' action tokens are not the flat trajectory's"
        print(f"episode {e}: {len(want)} action tokens, max |flat - step| logprob {(got - want).abs().max():.1e}")
        assert torch.allclose(got, want, rtol=0, atol=1e-5), f"episode {e}: max |diff| {(got - want).abs().max():.2e}"
        assert torch.equal(action_values(sb, sb.rollout_logprobs, rows)[1], action_values(flat, flat.rollout_logprobs, [e])[1])
        info = flat.info[e]
        assert float(sb.step_reward[rows].sum()) == pytest.approx(info["outcome_reward"] + info["process_reward"])


# ------------------------------------------------------------ (3) bad input
def _mutated(edit: Callable[[dict], None]) -> TrajectoryBatch:
    seqs = _flat_seqs()
    edit(seqs[0])
    return TrajectoryBatch.from_sequences(seqs, pad_id=PAD)


def _set(key: str, pos: int, value: float) -> Callable[[dict], None]:
    return lambda s: s[key].__setitem__(pos, value)


@pytest.mark.parametrize("edit, message", [
    (lambda s: s["turn_index"].__setitem__(slice(7, 11), [2] * 4), r"trajectory 0: position 7 has turn_index 2"),
    (lambda s: s["turn_index"].__setitem__(slice(5, 7), [1, 1]), r"trajectory 0: position 5 has turn_index 1, action_mask 0"),
    (_set("turn_index", 9, 2), r"trajectory 0: position 9 has turn_index 2, action_mask 0 after turn_index 1"),
    (_set("turn_index", 3, 1), r"trajectory 0: position 3 has turn_index 1"),
    (_set("action_mask", 6, 1), r"trajectory 0: position 6 has turn_index 0, action_mask 1 after turn_index 0"),
    (_set("action_mask", 1, 1), r"trajectory 0: its prompt \(first 3 tokens\)"),
    (_set("token_rewards", 5, 0.3), r"trajectory 0: reward 0.3\d* on non-action position 5"),
    (lambda s: s.update(prompt_length=14), r"trajectory 0: prompt_length 14 of 14 tokens leaves no action"),
])
def test_inconsistent_trajectories_are_refused(edit: Callable[[dict], None], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        steps_from_trajectories(_mutated(edit))


def _step(**kw) -> Step:
    return Step(**{"prompt_ids": [1, 2], "response_ids": [3], "response_logprobs": [-0.1], "reward": 0.0,
                   "turn": 0, "episode": 0, "group_id": 0, **kw})


@pytest.mark.parametrize("steps, n_episodes, message", [
    ([_step(), _step(turn=2)], 1, r"turn 2 of episode 0, which has 2 steps"),
    ([_step(), _step()], 1, r"\(episode, turn\) pair appears on more than one row"),
    ([_step()], 2, r"episode 1 of info has no step"),
    ([_step(episode=1)], 1, r"episode must index info \(1 episodes\)"),
    ([_step(), _step(turn=1, group_id=1)], 1, r"group_id differs between steps of one episode"),
    ([_step(response_ids=[])], 1, r"step 0 \(episode 0, turn 0\): 1 logprobs for 0 response ids"),
    ([_step(response_ids=[], response_logprobs=[])], 1, r"prompt_length 2 of 2 tokens; a step needs a prompt and a response"),
    ([_step(prompt_ids=[], response_ids=[1, 3], response_logprobs=[0.0, 0.0])], 1, r"prompt_length 0 of 2"),
    ([], 0, r"no steps"),
])
def test_inconsistent_steps_are_refused(steps: list[Step], n_episodes: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StepBatch.from_steps(steps, [{}] * n_episodes, pad_id=PAD)


def test_step_batch_checks_shapes_and_masks() -> None:
    sb = steps_from_trajectories(_flat())
    with pytest.raises(ValueError, match=r"StepBatch.action_mask has shape \(4, 3\)"):
        StepBatch(**{**sb.__dict__, "action_mask": sb.action_mask[:, :3]})
    with pytest.raises(ValueError, match=r"StepBatch.turn has shape \(3,\)"):
        StepBatch(**{**sb.__dict__, "turn": sb.turn[:3]})
    shifted = sb.action_mask.clone()
    shifted[0, 2] = 1  # the last prompt token marked as a response token
    with pytest.raises(ValueError, match="action_mask must be 1 exactly on each row's response"):
        StepBatch(**{**sb.__dict__, "action_mask": shifted})
    holes = sb.attention_mask.clone()
    holes[0, 1] = 0
    with pytest.raises(ValueError, match="right padding"):
        StepBatch(**{**sb.__dict__, "attention_mask": holes})
