"""Train a tiny random Llama for a few steps with the real engines; used by
tests/test_deepspeed_ranks.py under the ``deepspeed`` launcher or as one plain
process.

Every run sees the same global batches (seeded by step), split across ranks:
rank r takes rows r, r+W, ... Each micro-batch loss is a sum of token
log-probs weighted by ``world_size / global_token_count``: DeepSpeed *averages*
gradients over ranks, so this weight makes the update the gradient of the
global token mean whatever the world size. Hence a 2-rank run must end with
the same weights as a 1-rank run.

With ``--ckpt`` it checkpoints every ``--save-every`` steps and resumes from
the latest checkpoint on start (the kill test restarts it after ``kill -9``).
Outputs in ``--out``: ``weights_rank{r}.pt`` (this rank's full weights under
ZeRO-2; rank 0's gathered weights under ZeRO-3), ``losses_rank{r}.json``,
``resumed_from.json`` (rank 0).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

from agent_r1.config import TrainConfig
from agent_r1.io import write_json
from agent_r1.training.checkpoint import full_state_dict, load_latest, save_checkpoint
from agent_r1.training.distributed import shutdown_distributed
from agent_r1.training.distributed import init_distributed
from agent_r1.training.models import make_trainable
from agent_r1.training.batching import equalize_micro_batches, micro_batches, select_rows
from agent_r1.training.logprobs import token_logprobs

VOCAB, ROWS, WIDTH = 500, 8, 24


def tiny_llama(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64, tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def global_batch(step: int) -> dict[str, torch.Tensor]:
    """The same right-padded batch for every run and rank at a given step."""
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, VOCAB, (ROWS, WIDTH), generator=g)
    lengths = torch.randint(WIDTH // 2, WIDTH + 1, (ROWS,), generator=g)
    mask = (torch.arange(WIDTH)[None, :] < lengths[:, None]).long()
    return {"input_ids": ids * mask, "attention_mask": mask}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--zero", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ckpt", type=Path, default=None)
    p.add_argument("--save-every", type=int, default=1)
    p.add_argument("--budget", type=int, default=40, help="token budget of a micro-batch")
    p.add_argument("--local_rank", type=int, default=0)  # passed by the launcher
    args = p.parse_args()

    rank, world = init_distributed()
    cfg = TrainConfig(zero_stage=args.zero, bf16=False, gradient_checkpointing=True, grad_clip=1.0)
    engine = make_trainable(tiny_llama(seed=0), cfg, lr=1e-2)
    engine.train()
    start = 0
    if args.ckpt is not None:
        resumed = load_latest({"actor": engine}, args.ckpt)
        if resumed is not None:
            start = resumed[0]
            assert resumed[1]["next_step"] == start, resumed
        if rank == 0:
            write_json(args.out / "resumed_from.json", {"step": start})

    losses = []
    for step in range(start, args.steps):
        batch = global_batch(step)
        n_tokens = int(batch["attention_mask"][:, 1:].sum())
        local = select_rows(batch, list(range(rank, ROWS, world)))
        total = 0.0
        groups = equalize_micro_batches(micro_batches(local["attention_mask"].sum(-1).tolist(), args.budget))
        for rows in groups:  # [] = placeholder pass, so every rank runs as many (collective) passes
            mb = select_rows(local, rows or [0])
            lp = token_logprobs(engine, mb["input_ids"], mb["attention_mask"], chunk_tokens=16)
            loss = -(lp * mb["attention_mask"]).sum() * (world / n_tokens) * (1.0 if rows else 0.0)
            engine.backward(loss)
            total += float(loss.detach()) / world
        engine.step()
        total = torch.tensor(total, dtype=torch.float64)
        dist.all_reduce(total)  # this rank's share -> the global token-mean loss
        losses.append({"loss": float(total), "grad_norm": float(engine.get_global_grad_norm())})
        if args.ckpt is not None and (step + 1) % args.save_every == 0:
            save_checkpoint({"actor": engine}, args.ckpt, step + 1, {"next_step": step + 1})

    args.out.mkdir(parents=True, exist_ok=True)
    state = full_state_dict(engine) if args.zero == 3 else {k: v.clone() for k, v in engine.module.state_dict().items()}
    if state is not None:
        torch.save(state, args.out / f"weights_rank{rank}.pt")
    (args.out / f"losses_rank{rank}.json").write_text(json.dumps(losses))
    shutdown_distributed()  # without it a ZeRO-3 rank aborted at exit in 1 of 7 module runs


if __name__ == "__main__":
    main()
