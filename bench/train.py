"""Benchmark of the RL training update: our DeepSpeed actor update vs a plain torch loop, on the real policy.

Why: on a CPU the update is most of an RL step; this measures how close it
gets to what the machine can do, and what the token-budget micro-batching and
chunked log-probs cost and buy.

1. Ceiling: bf16 and fp32 ``torch.matmul`` GFLOP/s (n x n x n), measured in
   the same run, on the same threads.
2. Update throughput: tokens/s of one actor update (forward + backward +
   AdamW step) on synthetic trajectories of realistic shape (``--rows`` rows
   of ``--min-len``..``--max-len`` tokens, ``--action-frac`` of them action
   tokens, GRPO groups of 4). Ours: ``trainer.build_engines`` +
   ``trainer.rl_step`` exactly as ``train_rl`` calls them (DeepSpeed ZeRO-2
   engine, bf16, token-budget micro-batches, chunked log-probs; the time is
   rl_step's own ``time/update_s``). Plain torch: the same model in fp32
   under ``torch.autocast(bf16)``, fixed micro-batches of
   ``--naive-micro-rows`` rows in batch order padded to their longest row,
   full-vocabulary float32 log-softmax, the same PPO loss, grad clipping and
   torch AdamW. Utilisation is FLOP/s over the best bf16 (and fp32) matmul
   rate, three ways (see :func:`update_flops`): MFU with PaLM's model FLOPs
   (6 * N per token + 12 * layers * d_attn * T for attention; N = the matmul
   parameters: all of them, the tied LM head counted once as the head matmul,
   embedding lookups being free), the FLOPs the loss needs (the head only on
   the loss-mask positions), and the FLOPs each method executes (padding of
   its micro-batches, our checkpointed head chunks recomputed in the backward,
   the backbone recomputed under ``train.gradient_checkpointing``).
   A third column runs ours on the padded micro-batches that packing replaced
   (``train.pack: false``, same budget): "packed vs padded" is its update
   time over the packed one's; "padding share" is the padded positions
   computed over the real tokens.
3. Peak memory of one update (``ru_maxrss`` of a fresh subprocess, plus the
   update's own peak above the loaded model: VmHWM reset just before it) at
   ``--mem-batches`` trajectories: ours vs plain torch over the full batch at
   once (full [B, T, V] float32 log-softmax). A child whose resident set
   passes ``--mem-cap-gib`` is killed and reported as "> cap".
4. Time split of full RL steps (``train_rl`` on the prepared data and index,
   ``--rl-questions`` x ``--rl-n`` trajectories per step) for 1 and 2 ranks
   (2 under the ``deepspeed`` launcher, like ``train.num_procs: 2``), read
   from the run's dvclive metrics ``time/{rollout,logprobs,update,step}_s``.
   Each rank inherits the thread count, as in the pipeline (2 ranks on 2
   cores oversubscribe); ``--rank-threads 1`` sets OMP_NUM_THREADS instead.
   ``logprobs`` is ~0 when the update is exactly on-policy and ``kl_coef`` 0.

Every measurement runs in its own subprocess. Params come from ``--params``
(the ``--experiment``'s overrides applied); the update sections use the
actor only (GRPO, ``kl_coef`` 0, one mini-batch, one epoch); the RL steps use
the params as they are, resized.

    .venv/bin/python bench/train.py [--quick] [--skip-memory] [--skip-ranks] [--rows 24] [--mem-batches 8 32]

Writes bench/results/train.json (--quick: bench/results/train_quick.json),
after every section.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

log = logging.getLogger("bench.train")

LAUNCHER = Path(sys.executable).parent / "deepspeed"
DEFAULTS: dict[str, Any] = dict(
    rows=24, min_len=300, max_len=450, action_frac=0.12, group_size=4, reps=2, warmup_rows=4, naive_micro_rows=8,
    mem_batches=[8, 32], matmul_size=2048, matmul_reps=5, ranks=[1, 2], rl_questions=4, rl_n=4, rl_steps=2,
    rl_max_new_tokens=None, rl_max_turns=None,
)  # fmt: skip
QUICK: dict[str, Any] = dict(
    rows=4, min_len=48, max_len=96, reps=1, warmup_rows=2, naive_micro_rows=2, mem_batches=[2, 4],
    matmul_size=512, matmul_reps=3, rl_questions=2, rl_n=2, rl_steps=1, rl_max_new_tokens=16, rl_max_turns=2,
)  # fmt: skip


# ------------------------------------------------------------------ shared helpers
def _status_kib(field: str, pid: int | str = "self") -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None


def mem_available_kib() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    except FileNotFoundError:
        pass
    return None


def bench_params(spec: dict) -> Any:
    """``--params`` with ``--experiment``'s overrides, resized by ``spec['overrides']`` (nested groups)."""
    from agent_r1.config import Params, _deep_merge, experiment_params, load_params

    params = load_params(spec["params"])
    if spec.get("experiment") and spec["experiment"] in params.experiments:
        params = experiment_params(params, spec["experiment"])
    merged = _deep_merge(params.model_dump(exclude={"experiments"}), spec.get("overrides", {}))
    merged["experiments"] = {}
    return Params.model_validate(merged)


# ------------------------------------------------------------------ synthetic trajectories
def _split(rng: Any, total: int, parts: int, minimum: int = 1) -> list[int]:
    """``total`` as ``parts`` random positive sizes, each >= ``minimum``."""
    free = total - parts * minimum
    cuts = sorted(rng.integers(0, free + 1, size=parts - 1).tolist()) if parts > 1 else []
    edges = [0, *cuts, free]
    return [minimum + edges[i + 1] - edges[i] for i in range(parts)]


def synthetic_batch(rows: int, min_len: int, max_len: int, action_frac: float, vocab: int, group_size: int, seed: int):
    """A right-padded :class:`TrajectoryBatch` shaped like the agent's: prompt (~30%), then 2-4
    turns of action + observation, ending on an action (the answer); ``action_frac`` of the
    tokens are actions. Process rewards on each search turn, the outcome on the last token."""
    import numpy as np

    from agent_r1.rollout.trajectory import TrajectoryBatch

    rng = np.random.default_rng(seed)
    seqs = []
    for i in range(rows):
        length = int(rng.integers(min_len, max_len + 1))
        turns = int(rng.integers(2, 5))
        n_act = max(2 * turns, round(action_frac * length))
        prompt = int(rng.integers(int(0.25 * length), int(0.35 * length) + 1))
        n_obs = max(turns - 1, length - prompt - n_act)
        acts, obs = _split(rng, n_act, turns, 2), _split(rng, n_obs, turns - 1) + [0]
        action, turn_index, rewards = [0] * prompt, [-1] * prompt, [0.0] * prompt
        for k in range(turns):
            action += [1] * acts[k] + [0] * obs[k]
            turn_index += [k] * (acts[k] + obs[k])
            rewards += [0.0] * (acts[k] - 1) + [0.02 if k < turns - 1 else float(rng.choice([1.0, 0.1, -0.9]))]
            rewards += [0.0] * obs[k]
        n = len(action)
        seqs.append({
            "input_ids": rng.integers(3, vocab, size=n).tolist(), "action_mask": action, "turn_index": turn_index,
            "token_rewards": rewards, "rollout_logprobs": [0.0] * n, "group_id": i // group_size,
            "prompt_length": prompt, "info": {},
        })  # fmt: skip
    return TrajectoryBatch.from_sequences(seqs, pad_id=0)


def batch_stats(batch: Any) -> dict:
    lengths = batch.attention_mask.sum(-1)
    return {
        "rows": len(batch), "tokens": int(lengths.sum()), "action_tokens": int(batch.action_mask.sum()),
        "scored_tokens": int((lengths - 1).clamp(min=0).sum()), "padded_width": int(batch.input_ids.shape[1]),
        "sum_len_sq": int((lengths.long() ** 2).sum()),
    }  # fmt: skip


def plan_stats(lengths: list[int], groups: list[list[int]], packed: bool = False) -> dict:
    """What the forwards actually run on: each micro-batch padded to its longest row, or packed
    (its rows back to back, attention per row: no padding, each row's own length squared)."""
    if packed:
        computed, len_sq = sum(lengths), sum(n * n for n in lengths)
    else:
        widths = [max(lengths[i] for i in g) for g in groups]
        computed = sum(len(g) * w for g, w in zip(groups, widths))
        len_sq = sum(len(g) * w * w for g, w in zip(groups, widths))
    return {"micro_batches": len(groups), "computed_tokens": computed, "computed_len_sq": len_sq,
            "padding_share": computed / max(sum(lengths), 1) - 1}  # fmt: skip


def head_scores_loss_tokens_only() -> bool:
    """Whether our engine runs the LM head only under the loss mask (``LogprobModel(score_mask=)``)."""
    import inspect

    from agent_r1.training.logprobs import LogprobModel

    return "score_mask" in inspect.signature(LogprobModel.forward).parameters


def model_shape(model: Any) -> dict:
    """What the FLOP count needs: matmul parameters and attention width."""
    cfg = model.config
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is emb
    n_params = sum(p.numel() for p in model.parameters())
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return {
        "n_params": n_params, "n_matmul": n_params if tied else n_params - emb.numel(), "tied_head": tied,
        "vocab": emb.shape[0], "hidden": cfg.hidden_size, "layers": cfg.num_hidden_layers,
        "d_attn": cfg.num_attention_heads * head_dim,
    }  # fmt: skip


# ------------------------------------------------------------------ workers (one subprocess each)
def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        return True
    except OSError:
        return False


def _memory_fields(rss_before: int | None, reset: bool) -> dict:
    hwm = _status_kib("VmHWM")
    return {
        "ru_maxrss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "rss_before_update_mib": round(rss_before / 1024) if rss_before else None,
        "update_peak_above_loaded_mib": round((hwm - rss_before) / 1024) if reset and hwm and rss_before else None,
    }


def update_params(spec: dict, rows: int) -> Any:
    """The actor-only update config: one on-policy mini-batch of ``rows`` trajectories
    (``spec['train']``: further ``train`` overrides, e.g. the padded path's ``pack: false``)."""
    over = {"algorithm": {"name": "grpo", "kl_coef": 0.0, "entropy_coef": 0.0},
            "train": {"mini_batch_size": rows, "ppo_epochs": 1, **spec.get("train", {})}}  # fmt: skip
    return bench_params({**spec, "overrides": over})


def advantages_and_mask(params: Any, batch: Any) -> tuple[Any, Any]:
    """The advantages and loss mask exactly as ``trainer.rl_step`` computes them (critic-free)."""
    from agent_r1.algorithms import compute_advantages, loss_mask

    alg = params.algorithm
    extra = {"norm_by_std": alg.norm_by_std} if alg.name == "grpo" else {}
    adv, _ = compute_advantages(
        alg.name, token_rewards=batch.token_rewards, action_mask=batch.action_mask, group_id=batch.group_id,
        values=None, gamma=alg.gamma, lam=alg.lam, align=alg.advantage_mask, response_mask=batch.response_mask(),
        process_rewards=alg.process_rewards_in_advantage, **extra,
    )  # fmt: skip
    return adv, loss_mask(batch.action_mask, batch.attention_mask, batch.prompt_length, alg.loss_mask).float()


def make_ours(spec: dict, rows: int):
    """``run(batch) -> (update s, optimizer step s)``, the model, the params: the trainer's engines and rl_step."""
    from agent_r1.training.engines import unwrap
    from agent_r1.training.trainer import build_engines, rl_step

    params = update_params(spec, rows)
    engines = build_engines(params, Path(spec["model"]))
    timer = {"step_s": 0.0}
    engine_step = engines.actor.step

    def timed_step(*args: Any, **kwargs: Any) -> Any:  # the optimizer step, timed on its own
        start = time.perf_counter()
        out = engine_step(*args, **kwargs)
        timer["step_s"] += time.perf_counter() - start
        return out

    engines.actor.step = timed_step

    def run(batch: Any) -> tuple[float, float]:
        timer["step_s"] = 0.0
        return float(rl_step(params, engines, batch, world=1)["time/update_s"]), timer["step_s"]

    return run, unwrap(engines.actor), params


def make_naive(spec: dict, rows: int, micro_rows: int):
    """The plain torch loop: fp32 weights under bf16 autocast, full-vocabulary float32 log-softmax."""
    import torch
    from transformers import AutoModelForCausalLM

    from agent_r1.algorithms import policy_loss
    from agent_r1.training.engines import optimizer_groups

    params = update_params(spec, rows)
    cfg, alg = params.train, params.algorithm
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    model.config.use_cache = False
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = torch.optim.AdamW(optimizer_groups(model, cfg.weight_decay), lr=cfg.actor_lr, betas=(0.9, 0.999), eps=1e-8)
    autocast = cfg.bf16

    def run(batch: Any) -> tuple[float, float]:
        start = time.perf_counter()
        adv, mask = advantages_and_mask(params, batch)
        denom = max(float(mask.sum()), 1.0)
        lengths = batch.attention_mask.sum(-1)
        for first in range(0, len(batch), micro_rows):
            rows_ = list(range(first, min(first + micro_rows, len(batch))))
            width = int(lengths[rows_].max())
            ids, am = batch.input_ids[rows_, :width], batch.attention_mask[rows_, :width]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits = model(input_ids=ids, attention_mask=am).logits
            logp = torch.log_softmax(logits.float(), dim=-1)
            picked = logp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
            lp = torch.cat([picked.new_zeros(len(rows_), 1), picked], dim=1)
            loss, _ = policy_loss(
                lp, lp.detach(), adv[rows_, :width], mask[rows_, :width], clip_ratio=alg.clip_ratio,
                clip_ratio_high=alg.clip_ratio_high, dual_clip=alg.dual_clip, agg="token-mean", denominator=denom,
            )  # fmt: skip
            loss.backward()
            del logits, logp, picked, lp, loss
        step_start = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        end = time.perf_counter()
        return end - start, end - step_start

    return run, model, params


def worker_update(spec: dict) -> dict:
    """Throughput (``spec['warmup_rows']`` warm-up update, then ``reps`` timed) or memory (one update)."""
    import torch

    from agent_r1.training.distributed import init_distributed

    torch.manual_seed(spec["seed"])
    rows = spec["rows"]
    if spec["method"] == "ours":
        init_distributed()
        run, model, params = make_ours(spec, rows)
    else:
        micro = spec.get("micro_rows") or rows
        run, model, params = make_naive(spec, rows, micro)
    shape = model_shape(model)
    make = lambda n, seed: synthetic_batch(  # noqa: E731
        n, spec["min_len"], spec["max_len"], spec["action_frac"], shape["vocab"], spec["group_size"], seed)
    batch = make(rows, spec["seed"])
    out: dict[str, Any] = {"method": spec["method"], "shape": shape, "batch": batch_stats(batch),
                           "threads": torch.get_num_threads(),
                           "gradient_checkpointing": params.train.gradient_checkpointing,
                           "bf16": params.train.bf16, "micro_batch_tokens": params.train.micro_batch_tokens,
                           "pack": spec["method"] == "ours" and params.train.pack}  # fmt: skip
    lengths = batch.attention_mask.sum(-1).tolist()
    _, mask = advantages_and_mask(params, batch)
    out["batch"]["loss_tokens"] = int(mask[:, 1:].sum())  # positions the loss reads (column 0 never)
    if spec["method"] == "ours":
        from agent_r1.training.logprobs import micro_batches

        packed = params.train.pack
        out["plan"] = plan_stats(lengths, micro_batches(lengths, params.train.micro_batch_tokens, packed), packed)
        out["head_on_loss_tokens_only"] = head_scores_loss_tokens_only()
    else:
        out["micro_rows"] = micro = spec.get("micro_rows") or rows
        out["plan"] = plan_stats(lengths, [list(range(i, min(i + micro, rows))) for i in range(0, rows, micro)])
    if spec["mode"] == "memory":
        rss_before = _status_kib("VmRSS")
        reset = _reset_peak()
        out["update_s"], out["optimizer_step_s"] = run(batch)
        out.update(_memory_fields(rss_before, reset))
        return out
    if spec["warmup_rows"]:
        out["warmup_s"] = run(make(spec["warmup_rows"], spec["seed"] + 1))[0]
    reps = [run(batch) for _ in range(spec["reps"])]
    out["update_s_reps"] = [r[0] for r in reps]
    out["optimizer_step_s_reps"] = [r[1] for r in reps]
    out["update_s"] = statistics.median(out["update_s_reps"])
    out["optimizer_step_s"] = statistics.median(out["optimizer_step_s_reps"])
    out["tokens_per_s"] = out["batch"]["tokens"] / out["update_s"]
    out.update(_memory_fields(None, False))
    return out


def read_live(live_dir: Path) -> list[dict]:
    """Per-step rows of every scalar dvclive logged (``{'step': 0, 'time/rollout_s': ...}``)."""
    steps: dict[int, dict] = {}
    root = live_dir / "plots" / "metrics"
    for tsv in sorted(root.glob("**/*.tsv")):
        lines = tsv.read_text().splitlines()
        header = lines[0].split("\t")
        name = str(tsv.relative_to(root).with_suffix(""))
        for line in lines[1:]:
            cells = dict(zip(header, line.split("\t")))
            steps.setdefault(int(cells["step"]), {})[name] = float(cells[header[-1]])
    return [{"step": s, **steps[s]} for s in sorted(steps)]


def worker_rl(spec: dict) -> dict | None:
    """``train_rl`` for ``spec['steps']`` steps on the prepared data; rank 0 returns dvclive's per-step rows."""
    import pandas as pd
    import torch

    from agent_r1.training.distributed import init_distributed, is_rank0
    from agent_r1.training.trainer import train_rl

    rank, world = init_distributed()
    q, n, steps = spec["questions"], spec["n"], spec["steps"]
    over: dict[str, Any] = {
        "train": {"steps": steps, "questions_per_step": q, "mini_batch_size": q * n, "num_procs": world,
                  "eval_every": steps, "save_every": steps},
        "rollout": {"n": n},
    }  # fmt: skip
    if spec.get("max_new_tokens"):
        over["rollout"]["max_new_tokens"] = spec["max_new_tokens"]
    if spec.get("max_turns"):
        over["env"] = {"max_turns": spec["max_turns"]}
    params = bench_params({**spec, "overrides": over})
    data, tmp = Path(spec["data_dir"]), Path(spec["tmp"])
    summary = train_rl(
        params, init_model=Path(spec["model"]), index_path=Path(spec["index"]),
        train_questions=pd.read_parquet(data / "train.parquet").to_dict("records"),
        eval_questions=pd.read_parquet(data / "test.parquet").head(1).to_dict("records"),
        out_model=tmp / "out", checkpoint_dir=tmp / "ckpt", live_dir=tmp / "live",
    )  # fmt: skip
    if not is_rank0():
        return None
    steps_rows = read_live(tmp / "live")
    return {"world": world, "threads_per_rank": torch.get_num_threads(), "steps": steps_rows,
            "trajectories_per_step": q * n, "last": summary["last"],
            "algorithm": params.algorithm.name, "kl_coef": params.algorithm.kl_coef,
            "max_new_tokens": params.rollout.max_new_tokens, "max_turns": params.env.max_turns}  # fmt: skip


def worker_main(kind: str, spec_path: Path) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")
    spec = json.loads(spec_path.read_text())
    result = worker_update(spec) if kind == "update" else worker_rl(spec)
    if result is not None:
        Path(spec["result"]).write_text(json.dumps(result))


# ------------------------------------------------------------------ the parent
def run_worker(kind: str, spec: dict, *, ranks: int = 1, threads: int | None = None, cap_kib: int | None = None) -> dict:
    """Run one worker in a fresh process (under the deepspeed launcher when ``ranks > 1``).

    Returns its result, ``{'killed_above_mib': cap}`` when its resident set passed the cap,
    or ``{'error': ...}`` with the tail of its log.
    """
    from agent_r1.training.distributed import free_port

    with tempfile.TemporaryDirectory(prefix="bench_train_") as tmp:
        spec = {**spec, "result": str(Path(tmp) / "result.json"), "tmp": tmp}
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        script = [str(Path(__file__).resolve()), "--worker", kind, "--spec", str(spec_path)]
        if ranks > 1:
            cmd = [str(LAUNCHER), "--num_accelerators", str(ranks), "--master_port", str(free_port()), *script]
        else:
            cmd = [sys.executable, *script]
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        log_path = Path(tmp) / "log.txt"
        start, killed = time.perf_counter(), False
        with open(log_path, "w") as fh:
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT)
            try:
                while proc.poll() is None:
                    rss = _status_kib("VmRSS", proc.pid)
                    if cap_kib and rss and rss > cap_kib:
                        proc.kill()  # our own child, by pid
                        killed = True
                    time.sleep(0.1)
            except BaseException:
                proc.kill()
                raise
            proc.wait()
        wall = time.perf_counter() - start
        if killed:
            log.info("  killed: resident set passed the %.1f GiB cap", cap_kib / 2**20)
            return {"killed_above_mib": round(cap_kib / 1024), "wall_s": wall}
        result_path = Path(spec["result"])
        if proc.returncode != 0 or not result_path.exists():
            tail = log_path.read_text()[-3000:]
            log.error("  worker failed (rc %s):\n%s", proc.returncode, tail)
            return {"error": f"rc {proc.returncode}", "log_tail": tail, "wall_s": wall}
        out = json.loads(result_path.read_text())
        out["wall_s"] = wall
        return out


def matmul_gflops(n: int, reps: int) -> dict:
    import torch

    out = {"n": n, "threads": torch.get_num_threads()}
    for dtype in (torch.bfloat16, torch.float32):
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        torch.matmul(a, b)  # warm-up
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            torch.matmul(a, b)
            times.append(time.perf_counter() - t0)
        name = str(dtype).removeprefix("torch.")
        out[name] = {"best_gflops": 2 * n**3 / min(times) / 1e9, "median_gflops": 2 * n**3 / statistics.median(times) / 1e9}
    return out


def update_flops(r: dict) -> dict:
    """FLOPs of one update, three ways (matmuls only; LM head = vocab x hidden per position).

    * ``palm_flops``: PaLM's model FLOPs, 6N per real token + attention (12 * layers *
      d_attn * T per token), as if the head ran on every token;
    * ``needed_flops``: what the loss needs: the backbone on every real token, the head
      only on the positions the loss reads (forward + backward: 6 * V * d each);
    * ``executed_flops``: what the method runs: its micro-batches' padding included; ours
      runs the head on the loss positions (on every position without ``score_mask``)
      once more in the backward (its chunks are activation-checkpointed); either one
      recomputes the backbone forward under ``train.gradient_checkpointing``.
    """
    s, b, plan = r["shape"], r["batch"], r["plan"]
    head = s["vocab"] * s["hidden"]
    backbone = s["n_matmul"] - head
    attn = 12 * s["layers"] * s["d_attn"]
    palm = 6 * s["n_matmul"] * b["tokens"] + attn * b["sum_len_sq"]
    needed = 6 * backbone * b["tokens"] + attn * b["sum_len_sq"] + 6 * head * b["loss_tokens"]
    executed = 6 * backbone * plan["computed_tokens"] + attn * plan["computed_len_sq"]
    if r["method"] == "ours":
        positions = b["loss_tokens"] if r.get("head_on_loss_tokens_only") else b["scored_tokens"]
        executed += 8 * head * positions  # forward, recomputed forward, backward
    else:
        executed += 6 * head * plan["computed_tokens"]
    if r.get("gradient_checkpointing"):
        executed += 2 * backbone * plan["computed_tokens"] + attn // 3 * plan["computed_len_sq"]
    return {"palm_flops": palm, "needed_flops": needed, "executed_flops": executed}


def throughput_row(r: dict, ceiling: dict) -> dict:
    """Adds FLOP/s and utilisations (vs the best bf16 and fp32 matmul rates)."""
    if "update_s" not in r:
        return r
    f = update_flops(r)
    bf16, fp32 = ceiling["bfloat16"]["best_gflops"] * 1e9, ceiling["float32"]["best_gflops"] * 1e9
    palm, needed, executed = (f[k] / r["update_s"] for k in ("palm_flops", "needed_flops", "executed_flops"))
    return {**r, **f, "palm_gflops": palm / 1e9, "mfu_vs_bf16": palm / bf16, "mfu_vs_fp32": palm / fp32,
            "needed_gflops": needed / 1e9, "needed_vs_bf16": needed / bf16,
            "executed_gflops": executed / 1e9, "executed_vs_bf16": executed / bf16}  # fmt: skip


def fmt(v: Any, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float)) else str(v if v is not None else "-")


def format_ceiling(c: dict) -> str:
    return (f"\n== matmul ceiling ({c['n']}^3, {c['threads']} threads) ==\n"
            f"bf16 {c['bfloat16']['best_gflops']:8.1f} GFLOP/s best ({c['bfloat16']['median_gflops']:.1f} median)\n"
            f"fp32 {c['float32']['best_gflops']:8.1f} GFLOP/s best ({c['float32']['median_gflops']:.1f} median)")  # fmt: skip


THROUGHPUT_COLUMNS = (("ours", "ours (packed)"), ("ours_padded", "ours, padded"), ("naive", "plain torch"))


def format_throughput(t: dict) -> str:
    """The update table: ours (the default, packed), ours on the padded path it replaced, plain torch."""
    cols = [(label, t[key]) for key, label in THROUGHPUT_COLUMNS if key in t]
    ref = next((r for _, r in cols if "batch" in r), None)
    if ref is None:
        return "\n== update throughput ==\n" + "\n".join(f"{label}: {r}" for label, r in cols)
    b = ref["batch"]
    lines = [f"\n== one actor update: {b['rows']} trajectories, {b['tokens']:,} tokens "
             f"({b['loss_tokens'] / b['tokens']:.1%} under the loss mask), longest {b['padded_width']} ==",
             f"{'':30s}" + "".join(f"{label:>17s}" for label, _ in cols)]  # fmt: skip

    def cell(r: dict, key: str, spec: str) -> str:
        if "killed_above_mib" in r:
            return f"> {r['killed_above_mib']} MiB"
        return "failed" if "error" in r else fmt(r.get(key), spec)

    rows = [("micro-batches", "mb", ""), ("tokens computed (w/ padding)", "computed", ","),
            ("padding share", "padding_share", ".1%"),
            ("update s (median)", "update_s", ".1f"), ("  of which optimizer step s", "optimizer_step_s", ".1f"),
            ("warm-up update s", "warmup_s", ".1f"), ("tokens/s", "tokens_per_s", ".1f"),
            ("GFLOP/s, 6N+attn per token", "palm_gflops", ".1f"), ("MFU vs bf16 matmul", "mfu_vs_bf16", ".1%"),
            ("MFU vs fp32 matmul", "mfu_vs_fp32", ".1%"), ("needed GFLOP/s (head@loss)", "needed_gflops", ".1f"),
            ("  vs bf16 matmul", "needed_vs_bf16", ".1%"), ("executed GFLOP/s", "executed_gflops", ".1f"),
            ("  vs bf16 matmul", "executed_vs_bf16", ".1%"), ("ru_maxrss MiB", "ru_maxrss_mib", "")]  # fmt: skip
    plan = lambda r: r.get("plan") or {}  # noqa: E731
    shown = []
    for _, r in cols:
        size = f"budget {r.get('micro_batch_tokens')}" if r.get("method") == "ours" else f"{r.get('micro_rows')} rows"
        shown.append({**r, "mb": f"{plan(r).get('micro_batches')} ({size})", "computed": plan(r).get("computed_tokens"),
                      "padding_share": plan(r).get("padding_share")})  # fmt: skip
    for label, key, spec in rows:
        lines.append(f"{label:30s}" + "".join(f"{cell(r, key, spec):>17s}" for r in shown))
    for key, label in (("speedup_tokens_per_s", "ours vs plain torch (tokens/s)"),
                       ("packed_vs_padded", "packed vs padded (update s)")):  # fmt: skip
        if t.get(key):
            lines.append(f"{label:34s}{t[key]:>13.2f}x")
    return "\n".join(lines)


def format_memory(rows: list[dict]) -> str:
    lines = ["\n== peak memory of one update (fresh process each) ==",
             f"{'rows':>5}{'tokens':>8}{'ours ru_maxrss':>16}{'naive ru_maxrss':>17}{'ratio':>8}"
             f"{'ours update+':>14}{'naive update+':>15}{'ratio':>8}"]  # fmt: skip

    def mib(r: dict, key: str) -> str:
        if "killed_above_mib" in r:
            return f">{r['killed_above_mib']}"
        return "failed" if "error" in r else fmt(r.get(key), "")

    for row in rows:
        o, n = row["ours"], row["naive"]
        tokens = (o.get("batch") or n.get("batch") or {}).get("tokens")
        at_least = row.get("ratio_ru_maxrss_at_least")
        ratio = f">{at_least:.2f}" if at_least else fmt(row.get("ratio_ru_maxrss"), ".2f")
        lines.append(f"{row['rows']:>5}{fmt(tokens, ',')!s:>8}{mib(o, 'ru_maxrss_mib'):>16}{mib(n, 'ru_maxrss_mib'):>17}"
                     f"{ratio:>8}{mib(o, 'update_peak_above_loaded_mib'):>14}"
                     f"{mib(n, 'update_peak_above_loaded_mib'):>15}{fmt(row.get('ratio_update_peak'), '.2f'):>8}")  # fmt: skip
    lines.append("  MiB; ratio = naive / ours; update+ = the update's peak above the loaded model")
    return "\n".join(lines)


def format_ranks(rows: list[dict]) -> str:
    lines = ["\n== RL steps: time split (seconds; dvclive time/*, mean over ranks) ==",
             f"{'ranks':>5}{'threads':>8}{'step':>5}{'tokens':>8}{'rollout':>9}{'logprobs':>9}{'update':>8}"
             f"{'other':>7}{'step':>7}{'update tok/s':>13}"]  # fmt: skip
    for r in rows:
        if "steps" not in r:
            lines.append(f"{r['ranks']:>5}  {'killed' if 'killed_above_mib' in r else 'failed'}")
            continue
        for s in r["steps"]:
            roll, lp, upd, step = (s.get(f"time/{k}_s", float("nan")) for k in ("rollout", "logprobs", "update", "step"))
            tokens = s.get("train/tokens", float("nan")) * r["world"]  # per-rank mean -> global
            lines.append(f"{r['world']:>5}{r['threads_per_rank']:>8}{s['step'] + 1:>5}{tokens:>8.0f}{roll:>9.1f}"
                         f"{lp:>9.1f}{upd:>8.1f}{step - roll - lp - upd:>7.1f}{step:>7.1f}{tokens / upd:>13.1f}")  # fmt: skip
    return "\n".join(lines)



def ours_and_naive(spec: dict[str, Any], naive_micro_rows: int, cap_kib: int | None) -> tuple[dict, dict]:
    """One update worker per method on the same spec (plain torch in micro-batches of ``naive_micro_rows``)."""
    ours = run_worker("update", {**spec, "method": "ours"}, cap_kib=cap_kib)
    naive = run_worker("update", {**spec, "method": "naive", "micro_rows": naive_micro_rows}, cap_kib=cap_kib)
    return ours, naive


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, default=REPO / "models" / "policy")
    p.add_argument("--params", type=Path, default=REPO / "params.yaml")
    p.add_argument("--experiment", default="grpo", help="its overrides apply when params has it")
    p.add_argument("--data-dir", type=Path, default=REPO / "data" / "prepared")
    p.add_argument("--index", type=Path, default=REPO / "indexes" / "bm25")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of every section")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rows", type=int, help="trajectories in the throughput update")
    p.add_argument("--min-len", type=int)
    p.add_argument("--max-len", type=int)
    p.add_argument("--action-frac", type=float)
    p.add_argument("--group-size", type=int)
    p.add_argument("--reps", type=int, help="timed updates (median reported)")
    p.add_argument("--warmup-rows", type=int, help="rows of the untimed warm-up update (0: none)")
    p.add_argument("--naive-micro-rows", type=int, help="rows per micro-batch of the plain torch loop")
    p.add_argument("--mem-batches", type=int, nargs="+")
    p.add_argument("--mem-cap-gib", type=float, help="kill a memory worker above this RSS (default: 80%% of MemAvailable)")
    p.add_argument("--matmul-size", type=int)
    p.add_argument("--matmul-reps", type=int)
    p.add_argument("--ranks", type=int, nargs="+")
    p.add_argument("--rank-threads", type=int, help="OMP_NUM_THREADS per rank (default: inherited, as the pipeline)")
    p.add_argument("--rl-questions", type=int, help="questions per RL step (divisible by every rank count)")
    p.add_argument("--rl-n", type=int, help="samples per question")
    p.add_argument("--rl-steps", type=int)
    p.add_argument("--rl-max-new-tokens", type=int, help="override rollout.max_new_tokens")
    p.add_argument("--rl-max-turns", type=int, help="override env.max_turns")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--skip-ranks", action="store_true")
    p.add_argument("--out", type=Path)
    p.add_argument("--worker", choices=["update", "rl"], help=argparse.SUPPRESS)
    p.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--local_rank", type=int, default=0, help=argparse.SUPPRESS)  # from the deepspeed launcher
    args = p.parse_args(argv)
    if args.worker:
        worker_main(args.worker, args.spec)
        return 0
    for key, value in {**DEFAULTS, **(QUICK if args.quick else {})}.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.out is None:
        args.out = REPO / "bench" / "results" / ("train_quick.json" if args.quick else "train.json")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    from agent_r1.io import write_json

    avail = mem_available_kib()
    cap_kib = int(args.mem_cap_gib * 2**20) if args.mem_cap_gib else (int(avail * 0.8) if avail else None)
    base = {"model": str(args.model), "params": str(args.params), "experiment": args.experiment, "seed": args.seed,
            "min_len": args.min_len, "max_len": args.max_len, "action_frac": args.action_frac,
            "group_size": args.group_size}  # fmt: skip
    result: dict[str, Any] = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                   if k not in ("worker", "spec", "local_rank")},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "loadavg_start": os.getloadavg(), "mem_available_gib": round(avail / 2**20, 1) if avail else None,
                    "mem_cap_gib": round(cap_kib / 2**20, 1) if cap_kib else None},
    }  # fmt: skip
    failed = False

    log.info("matmul ceiling: %d^3, %d reps, bf16 and fp32", args.matmul_size, args.matmul_reps)
    ceiling = matmul_gflops(args.matmul_size, args.matmul_reps)
    result["matmul"] = ceiling
    print(format_ceiling(ceiling), flush=True)
    write_json(args.out, result)

    if not args.skip_throughput:
        t: dict[str, Any] = {}
        spec = {**base, "mode": "throughput", "rows": args.rows, "reps": args.reps, "warmup_rows": args.warmup_rows}
        log.info("update throughput: %d rows of %d-%d tokens, warm-up %d rows + %d timed; plain torch in "
                 "micro-batches of %d rows", args.rows, args.min_len, args.max_len, args.warmup_rows, args.reps,
                 args.naive_micro_rows)
        ours, naive = ours_and_naive(spec, args.naive_micro_rows, cap_kib)
        padded = run_worker("update", {**spec, "method": "ours", "train": {"pack": False}}, cap_kib=cap_kib)
        t["ours"], t["naive"] = throughput_row(ours, ceiling), throughput_row(naive, ceiling)
        t["ours_padded"] = throughput_row(padded, ceiling)
        if "tokens_per_s" in t["ours"] and "tokens_per_s" in t["naive"]:
            t["speedup_tokens_per_s"] = t["ours"]["tokens_per_s"] / t["naive"]["tokens_per_s"]
        if "update_s" in t["ours"] and "update_s" in t["ours_padded"]:
            t["packed_vs_padded"] = t["ours_padded"]["update_s"] / t["ours"]["update_s"]
        failed |= any("error" in t[k] for k in ("ours", "ours_padded", "naive"))
        result["throughput"] = t
        print(format_throughput(t), flush=True)
        write_json(args.out, result)

    if not args.skip_memory:
        rows = []
        for n in args.mem_batches:
            row: dict[str, Any] = {"rows": n}
            spec = {**base, "mode": "memory", "rows": n, "reps": 1, "warmup_rows": 0}
            log.info("memory: one update of %d rows, ours vs plain torch on the full batch", n)
            row["ours"], row["naive"] = ours_and_naive(spec, n, cap_kib)
            for key, name in (("ru_maxrss_mib", "ratio_ru_maxrss"), ("update_peak_above_loaded_mib", "ratio_update_peak")):
                o, nv = row["ours"].get(key), row["naive"].get(key)
                if o and nv:
                    row[name] = nv / o
            if "killed_above_mib" in row["naive"] and row["ours"].get("ru_maxrss_mib"):
                row["ratio_ru_maxrss_at_least"] = row["naive"]["killed_above_mib"] / row["ours"]["ru_maxrss_mib"]
            failed |= any("error" in row[k] for k in ("ours", "naive"))
            rows.append(row)
        result["memory"] = rows
        print(format_memory(rows), flush=True)
        write_json(args.out, result)

    if not args.skip_ranks:
        rows = []
        for ranks in args.ranks:
            if args.rl_questions % ranks:
                raise SystemExit(f"--rl-questions {args.rl_questions} must be divisible by {ranks} ranks")
            spec = {**base, "data_dir": str(args.data_dir), "index": str(args.index), "questions": args.rl_questions,
                    "n": args.rl_n, "steps": args.rl_steps, "max_new_tokens": args.rl_max_new_tokens,
                    "max_turns": args.rl_max_turns}  # fmt: skip
            log.info("RL steps, %d rank(s): %d step(s) of %d questions x %d", ranks, args.rl_steps, args.rl_questions, args.rl_n)
            r = run_worker("rl", spec, ranks=ranks, threads=args.rank_threads)
            r["ranks"] = ranks
            failed |= "error" in r
            rows.append(r)
        result["ranks"] = rows
        print(format_ranks(rows), flush=True)

    result["machine"]["loadavg_end"] = os.getloadavg()
    write_json(args.out, result)
    print(f"\nwrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
