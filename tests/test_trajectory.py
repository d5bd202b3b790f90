"""TrajectoryBatch: padding, shape checks, masks, device moves and save/load round trips."""

from __future__ import annotations

import pytest
import torch

from agent_r1.rollout.trajectory import TOKEN_FIELDS, TrajectoryBatch

PAD = 2


def _seq(ids: list[int], actions: list[int], prompt_length: int, group_id: int, reward_at: int) -> dict:
    n = len(ids)
    turn = [-1] * prompt_length + [0] * (n - prompt_length)
    rewards = [0.0] * n
    rewards[reward_at] = 1.5
    return {
        "input_ids": ids,
        "action_mask": actions,
        "turn_index": turn,
        "token_rewards": rewards,
        "rollout_logprobs": [-0.5 if a else 0.0 for a in actions],
        "group_id": group_id,
        "prompt_length": prompt_length,
        "info": {"question_id": f"q{group_id}"},
    }


def _batch() -> TrajectoryBatch:
    return TrajectoryBatch.from_sequences(
        [
            _seq([5, 6, 7, 8, 9], [0, 0, 1, 1, 0], prompt_length=2, group_id=0, reward_at=3),
            _seq([5, 6, 7], [0, 1, 1], prompt_length=1, group_id=1, reward_at=2),
        ],
        pad_id=PAD,
    )


def test_from_sequences_right_pads_with_neutral_values() -> None:
    b = _batch()
    assert len(b) == 2 and b.input_ids.shape == (2, 5)
    assert b.input_ids[1].tolist() == [5, 6, 7, PAD, PAD]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert b.action_mask[1].tolist() == [0, 1, 1, 0, 0]
    assert b.turn_index[1].tolist() == [-1, 0, 0, -1, -1]
    assert b.token_rewards[1].tolist() == [0.0, 0.0, 1.5, 0.0, 0.0]
    assert b.rollout_logprobs[1].tolist() == [0.0, -0.5, -0.5, 0.0, 0.0]
    assert b.token_rewards.dtype == torch.float32 and b.input_ids.dtype == torch.long
    assert b.group_id.tolist() == [0, 1] and b.prompt_length.tolist() == [2, 1]
    assert [i["question_id"] for i in b.info] == ["q0", "q1"]


def test_response_mask_covers_everything_after_the_prompt_but_padding() -> None:
    b = _batch()
    assert b.response_mask().tolist() == [[0, 0, 1, 1, 1], [0, 1, 1, 0, 0]]
    assert bool(((b.action_mask == 1) <= (b.response_mask() == 1)).all())


def test_save_load_round_trip(tmp_path) -> None:
    b = _batch()
    path = tmp_path / "sub" / "traj.pt"
    b.save(path)
    c = TrajectoryBatch.load(path)
    for name in (*TOKEN_FIELDS, "group_id", "prompt_length"):
        assert torch.equal(getattr(b, name), getattr(c, name)), name
    assert c.info == b.info
    assert [p.name for p in path.parent.iterdir()] == ["traj.pt"]  # no temporary left behind


def test_load_rejects_other_files(tmp_path) -> None:
    path = tmp_path / "x.pt"
    torch.save({"input_ids": torch.zeros(1, 1)}, path)
    with pytest.raises(ValueError, match="not a TrajectoryBatch"):
        TrajectoryBatch.load(path)


def test_to_moves_tensors_and_keeps_info() -> None:
    b = _batch().to("cpu")
    assert b.input_ids.device.type == "cpu" and b.info[0]["question_id"] == "q0"


def test_shape_mismatches_are_named() -> None:
    b = _batch()
    with pytest.raises(ValueError, match="action_mask"):
        TrajectoryBatch(**{**b.__dict__, "action_mask": b.action_mask[:, :3]})
    with pytest.raises(ValueError, match="info"):
        TrajectoryBatch(**{**b.__dict__, "info": b.info[:1]})
    bad = _seq([1, 2, 3], [0, 1, 1], 1, 0, 2)
    bad["turn_index"] = [0]
    with pytest.raises(ValueError, match="trajectory 0: turn_index"):
        TrajectoryBatch.from_sequences([bad], pad_id=PAD)
    with pytest.raises(ValueError, match="no trajectories"):
        TrajectoryBatch.from_sequences([], pad_id=PAD)
