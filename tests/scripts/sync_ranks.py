"""Weight sync from DeepSpeed ranks into each rank's own rollout engine; run by
tests/test_weight_sync.py under the ``deepspeed`` launcher (2 CPU ranks).

For ZeRO-3, then ZeRO-2: train_tiny's tiny Llama (the weights of the ``--policy``
folder) takes one optimizer step, so its weights differ from the folder's, then
``sync_rollout_weights`` puts them into a float32 TransformersEngine built from
the folder, with torch.distributed's pickling collectives patched to raise
(weights must travel as tensors). ZeRO-3 syncs in buckets of ``--bucket``
elements. Outputs in ``--out``, per stage S: ``zeroS_engine_rank{r}.pt`` (the
engine's state dict, and its float32 head as ``_head``), ``zeroS_actor.pt``
(rank 0: the actor's full weights, :func:`full_state_dict`) and
``zeroS_buckets_rank{r}.json`` (the names of each ``update_weights`` call).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import torch
import torch.distributed as dist
from train_tiny import ROWS, global_batch, tiny_llama

from agent_r1.config import TrainConfig
from agent_r1.rollout.transformers_engine import TransformersEngine
from agent_r1.training.checkpoint import full_state_dict
from agent_r1.training.distributed import shutdown_distributed
from agent_r1.training.distributed import init_distributed
from agent_r1.training.models import make_trainable, unwrap
from agent_r1.training.batching import select_rows
from agent_r1.training.logprobs import token_logprobs
from agent_r1.training.weight_sync import sync_rollout_weights

OBJECT_COLLECTIVES = ("broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list")


@contextmanager
def no_object_collectives() -> Iterator[None]:
    """torch.distributed's object collectives (they pickle their payload) raise while the sync runs."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the weight sync pickled objects through a torch.distributed object collective")

    with mock.patch.multiple(dist, **dict.fromkeys(OBJECT_COLLECTIVES, refuse)):
        yield


def one_step(engine, rank: int, world: int) -> None:
    """One optimizer step on this rank's rows of a fixed batch (one forward per rank: ZeRO-3 collectives match)."""
    batch = global_batch(0)
    local = select_rows(batch, list(range(rank, ROWS, world)))
    n_tokens = int(batch["attention_mask"][:, 1:].sum())
    lp = token_logprobs(engine, local["input_ids"], local["attention_mask"], chunk_tokens=16)
    engine.backward(-(lp * local["attention_mask"]).sum() * (world / n_tokens))
    engine.step()


def record_calls(rollout: TransformersEngine) -> list[list[str]]:
    """Wrap the engine's ``update_weights`` to record the names of each call."""
    calls: list[list[str]] = []
    update = rollout.update_weights

    def recorded(weights):
        calls.append(list(weights))
        update(weights)

    rollout.update_weights = recorded
    return calls


def check_stage(zero: int, policy: Path, out: Path, bucket: int, rank: int, world: int) -> None:
    cfg = TrainConfig(zero_stage=zero, bf16=False, gradient_checkpointing=False, grad_clip=1.0)
    actor = make_trainable(tiny_llama(seed=0), cfg, lr=1e-2)
    one_step(actor, rank, world)
    rollout = TransformersEngine(policy, dtype="float32")
    calls = record_calls(rollout)
    with no_object_collectives():
        sync_rollout_weights(actor, rollout, bucket=bucket)
    full = full_state_dict(actor) if zero == 3 else {k: v.clone() for k, v in unwrap(actor).state_dict().items()}
    if full is not None:
        torch.save(full, out / f"zero{zero}_actor.pt")
    state = {k: v.clone() for k, v in rollout.model.state_dict().items()}
    torch.save({**state, "_head": rollout.head_weight.clone()}, out / f"zero{zero}_engine_rank{rank}.pt")
    (out / f"zero{zero}_buckets_rank{rank}.json").write_text(json.dumps(calls))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--policy", type=Path, required=True, help="tiny_llama(seed=0) saved with a tokenizer")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--bucket", type=int, required=True, help="elements per ZeRO-3 sync bucket")
    p.add_argument("--local_rank", type=int, default=0)  # passed by the launcher
    args = p.parse_args()
    rank, world = init_distributed()
    args.out.mkdir(parents=True, exist_ok=True)
    for zero in (3, 2):
        check_stage(zero, args.policy, args.out, args.bucket, rank, world)
    shutdown_distributed()


if __name__ == "__main__":
    main()
