"""Benchmark: one RL step of ours against TRL's ``GRPOTrainer``, on identical work, side by side.

Two workloads, both GRPO with ``--n`` samples of each of ``--questions`` training
questions, fp32, one optimizer step over all trajectories, exactly on-policy, no KL:

* ``single``: one generation per trajectory (``--max-new-tokens``), scored by the
  answer it gives; nothing is searched.
* ``multi``: search episodes: up to ``--max-searches`` searches of the same BM25
  index, then an answer; each generation capped at ``--max-new-tokens``. TRL runs
  its own tool-calling loop (``tools=[search]``), we run our rollout loop.

Identical on both sides: the model, the questions, the prompt (our env's
``tool_call`` format with the one-shot example: Hermes ``<tool_call>`` JSON, which
is what TRL's tool loop parses), the search tool and its document rendering, the
reward (our env's outcome reward; process rewards off), the sampling settings and
the optimizer (torch AdamW, constant lr, same clip). TRL's tokenizer gets a chat
template that renders tool calls (the model's own ignores them); the run checks that
it renders every prompt exactly as the model's own template does.

Our side is the pipeline's own code (``build_models``, ``make_rollout_engine``,
``train_iteration``); TRL's side is ``GRPOTrainer.train()`` for one step. Each side runs in
its own subprocess, so its peak RSS is its own. Both configurations go in the JSON.

    make bench-trl      # builds the TRL venv (bench/requirements-trl.txt), then runs this
    python bench/trl_compare.py [--questions 6 --n 4 --workloads single multi --model ...]

Writes bench/results/trl_compare.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ("single", "multi")
SIDES = ("ours", "trl")

# The model's ChatML, plus tool calls rendered the Hermes way: TRL's tool loop refuses a
# template that drops them. Plain messages render exactly as the SmolLM2 template does
# (checked at run time by check_template).
HERMES_CHATML = (
    "{%- for message in messages %}"
    "{%- if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{%- endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') }}"
    "{%- for call in message.get('tool_calls') or [] %}"
    "{{ '<tool_call>' + ({'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson)"
    " + '</tool_call>' }}"
    "{%- endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)


# ------------------------------------------------------------------ shared set-up
def bench_params(args: argparse.Namespace, workload: str) -> Any:
    """params.yaml with the benchmark's overrides: the one configuration both sides are built from."""
    from agent_r1.config import load_params

    p = load_params(args.params)
    trajectories = args.questions * args.n
    over = {
        "env": {"format": "tool_call", "one_shot": True,
                "max_turns": 1 if workload == "single" else args.max_searches + 1,
                "reward": {**p.env.reward.model_dump(), "process": {**p.env.reward.process.model_dump(), "enabled": False}}},
        "rollout": {"engine": "transformers", "n": args.n, "max_new_tokens": args.max_new_tokens,
                    "max_total_tokens": args.max_total_tokens, "dtype": "float32", "batch_size": max(trajectories, 1)},
        "algorithm": {"name": "grpo", "kl_coef": 0.0, "entropy_coef": 0.0, "loss_agg": "token-mean"},
        "train": {"questions_per_step": args.questions, "mini_batch_size": trajectories, "ppo_epochs": 1, "bf16": False},
    }
    merged = p.model_dump()
    for group, values in over.items():
        merged[group] = {**merged[group], **values}
    return type(p).model_validate(merged)


def load_records(args: argparse.Namespace) -> list[dict]:
    from agent_r1.data.schema import read_questions

    df = read_questions(args.questions_file)
    if len(df) < args.questions:
        raise ValueError(f"--questions {args.questions}: {args.questions_file} holds only {len(df)} questions")
    return df.head(args.questions).to_dict("records")


def peak_rss_gib() -> float:
    """This process's peak resident set (VmHWM), in GiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 2**20, 2)
    raise RuntimeError("no VmHWM in /proc/self/status")


def check_template(tokenizer: Any, env: Any, records: list[dict]) -> None:
    """Fail unless HERMES_CHATML renders every prompt token for token as the model's own template does."""
    for record in records:
        messages = env.reset(record).messages
        own = tokenizer.apply_chat_template(messages, tools=env.tool_specs(), add_generation_prompt=True, tokenize=False)
        ours = tokenizer.apply_chat_template(messages, chat_template=HERMES_CHATML, add_generation_prompt=True, tokenize=False)
        if own != ours:
            raise ValueError(f"record {record['id']}: the tool-call template renders the prompt differently from the "
                             "model's own template; the two sides would not see the same prompt")


# ------------------------------------------------------------------ our side
def run_ours(args: argparse.Namespace, workload: str) -> dict[str, Any]:
    """One ``train_iteration`` of the pipeline (rollout, logprobs, update, weight sync) on the benchmark's params."""
    from agent_r1.env import make_env
    from agent_r1.rollout import make_rollout_engine
    from agent_r1.training.distributed import init_distributed
    from agent_r1.training.loop import Rollout, build_models, train_iteration

    params, records = bench_params(args, workload), load_records(args)
    start = time.monotonic()
    init_distributed()
    models = build_models(params, args.model)
    engine = make_rollout_engine(args.model, params.rollout)
    env = make_env(params, args.index)
    check_template(engine.tokenizer, env, records)
    setup_s = time.monotonic() - start
    m = train_iteration(params, models, Rollout(engine, env, engine.tokenizer), records, step=0, rank=0, world=1)
    trajectories = len(records) * params.rollout.n
    update_s = m["time/logprobs_s"] + m["time/update_s"]
    return {
        "setup_s": setup_s, "step_s": m["time/step_s"], "generation_s": m["time/rollout_s"], "update_s": update_s,
        "other_s": m["time/step_s"] - m["time/rollout_s"] - update_s,
        "trajectories": trajectories, "generated_tokens": round(m["response_length"] * trajectories),
        "sequence_tokens": round(m["tokens"]), "mean_turns": m["turns"], "tool_calls_per_trajectory": m["tool_calls"],
        "answer_rate": m["answer_rate"], "mean_reward": m["outcome_reward"],
        "config": {**ours_config(params, args), "rollout_path": rollout_path(engine, params)},
    }


def rollout_path(engine: Any, params: Any) -> str:
    """What the rollout did: rollout.continuous only takes effect with an engine whose own turn
    session (``open_turns``) keeps the KV cache across turns (the base class's runs turn by turn)."""
    from agent_r1.rollout.engine import GenerationEngine

    if params.rollout.continuous and type(engine).open_turns is not GenerationEngine.open_turns:
        return "continuous batching, KV cache kept across turns"
    return "one generate() per turn, re-prefilling the history"


def ours_config(params: Any, args: argparse.Namespace) -> dict[str, Any]:
    r, t, a, e = params.rollout, params.train, params.algorithm, params.env
    return {
        "code": "agent_r1.training.loop.train_iteration (build_models + make_rollout_engine + run_episodes + rl_update)",
        "model": str(args.model), "dtype": "float32", "rollout_engine": r.engine,
        "generation_batch": r.batch_size, "samples_per_question": r.n, "max_new_tokens_per_turn": r.max_new_tokens,
        "max_total_tokens": r.max_total_tokens, "stop": "</tool_call>, </answer> or <|im_end|>",
        "temperature": r.temperature, "top_p": r.top_p, "top_k": None,
        "max_turns": e.max_turns, "doc_chars": e.doc_chars, "search_top_k": e.top_k,
        "optimizer": f"torch AdamW in a DeepSpeed ZeRO-{t.zero_stage} engine, lr {t.actor_lr}, wd {t.weight_decay}, "
                     f"grad clip {t.grad_clip}, constant lr",
        "mini_batch": t.mini_batch_size, "micro_batch": f"token budget {t.micro_batch_tokens}",
        "gradient_checkpointing": t.gradient_checkpointing, "loss": f"token-mean, clip {a.clip_ratio}, kl 0",
        "advantage": f"grpo, norm_by_std={a.norm_by_std}", "old_logprob_pass": "none (exactly on-policy)",
        "model_copies": "actor (DeepSpeed) + rollout engine (weights synced in memory)",
        "torch_threads": _threads(),
    }


# ------------------------------------------------------------------ TRL's side
def search_function(env: Any) -> Any:
    """Our search tool as the plain function TRL's ``tools=`` takes, rendering hits as our env does."""
    from agent_r1.env.env import render_result

    tool = env.tools["search"]

    def search(query: str) -> str:
        """Search the knowledge base. Returns the most relevant documents for the query.

        Args:
            query: what to look up, e.g. an entity name
        """
        problem = tool.validate({"query": query})
        if problem is not None:
            raise ValueError(problem)  # TRL shows it to the model as {"error": ...}
        return render_result(tool.execute({"query": query}), env.cfg.doc_chars)

    return search


def final_text(completion: Any) -> str:
    """The last assistant turn of a TRL completion (a message list when conversational)."""
    if isinstance(completion, str):
        return completion
    turns = [m for m in completion if m.get("role") == "assistant"]
    return (turns[-1].get("content") or "") if turns else ""


def answer_reward(env: Any, seen: list[tuple[float, bool]]) -> Any:
    """Our env's outcome reward of the final assistant turn, as a TRL reward function; ``seen`` collects
    (reward, answered) per completion."""
    from agent_r1.env.rewards import outcome_reward

    def reward(completions: list, answers: list, **_: Any) -> list[float]:
        out = []
        for completion, golds in zip(completions, answers):
            answer = env.format.parse(final_text(completion)).answer
            out.append(outcome_reward(answer, [str(g) for g in golds], answer is not None, env.cfg.reward))
            seen.append((out[-1], answer is not None))
        return out

    reward.__name__ = "outcome_reward"
    return reward


def timed_trainer_class() -> type:
    """GRPOTrainer that adds up the time in generation (its tool loop included) and in generation + scoring."""
    from trl import GRPOTrainer

    class TimedGRPOTrainer(GRPOTrainer):
        bench: dict[str, float]

        def _generate(self, prompts: list) -> Any:
            start = time.monotonic()
            out = super()._generate(prompts)
            self.bench["generation_s"] += time.monotonic() - start
            completion_ids, tool_mask, completions = out[1], out[2], out[3]
            masks = tool_mask if tool_mask is not None else [[1] * len(c) for c in completion_ids]
            self.bench["generated_tokens"] += sum(sum(m) for m in masks)
            self.bench["sequence_tokens"] += sum(len(p) + len(c) for p, c in zip(out[0], completion_ids))
            for messages in completions:
                self.bench["turns"] += sum(m.get("role") == "assistant" for m in messages) if isinstance(messages, list) else 1
                self.bench["searches"] += sum(m.get("role") == "tool" for m in messages) if isinstance(messages, list) else 0
            return out

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            start = time.monotonic()
            out = super()._generate_and_score_completions(inputs)
            self.bench["generate_and_score_s"] += time.monotonic() - start
            return out

    return TimedGRPOTrainer


def trl_args(params: Any, args: argparse.Namespace, workload: str, out_dir: str, prompt_tokens: int) -> Any:
    """GRPOConfig matching our side: same sampling, batch, objective, optimizer; fp32 on the CPU."""
    from trl import GRPOConfig

    r, t, a = params.rollout, params.train, params.algorithm
    trajectories = args.questions * args.n
    if trajectories % args.trl_micro_batch:
        raise ValueError(f"--trl-micro-batch {args.trl_micro_batch} must divide questions x n = {trajectories}")
    multi = workload == "multi"
    return GRPOConfig(
        output_dir=out_dir, use_cpu=True, bf16=False, fp16=False, report_to="none", save_strategy="no",
        logging_steps=1, disable_tqdm=True, max_steps=1, seed=t.seed, shuffle_dataset=False,
        num_generations=r.n, per_device_train_batch_size=args.trl_micro_batch,
        gradient_accumulation_steps=trajectories // args.trl_micro_batch,  # one optimizer step, on-policy
        # multi: the completion budget spans every turn and tool result; each generate() is capped per turn
        max_completion_length=r.max_total_tokens - prompt_tokens if multi else r.max_new_tokens,
        generation_kwargs={"max_new_tokens": r.max_new_tokens} if multi else None,
        max_tool_calling_iterations=args.max_searches if multi else None,
        temperature=r.temperature, top_p=r.top_p, top_k=0,
        learning_rate=t.actor_lr, lr_scheduler_type="constant", weight_decay=t.weight_decay,
        max_grad_norm=t.grad_clip, optim="adamw_torch", gradient_checkpointing=t.gradient_checkpointing,
        beta=0.0, num_iterations=1, epsilon=a.clip_ratio, loss_type="dapo",
        scale_rewards="group" if a.norm_by_std else "none",
    )


def run_trl(args: argparse.Namespace, workload: str) -> dict[str, Any]:
    """One step of TRL's GRPOTrainer on the same questions, prompt, tool, reward and settings."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl.chat_template_utils import qwen3_template

    from agent_r1.env import make_env

    params, records = bench_params(args, workload), load_records(args)
    start = time.monotonic()
    env = make_env(params, args.index)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    check_template(tokenizer, env, records)
    tokenizer.chat_template = HERMES_CHATML
    tokenizer.response_template = qwen3_template  # parses ChatML + Hermes <tool_call> JSON, as SmolLM2 writes it
    prompts = [env.reset(rec).messages for rec in records]
    prompt_tokens = max(len(tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False))
                        for p in prompts)
    data = Dataset.from_list([{"prompt": p, "answers": [str(a) for a in rec["answers"]]} for p, rec in zip(prompts, records)])
    seen: list[tuple[float, bool]] = []
    stamps: dict[str, float] = {}

    class StepClock(TrainerCallback):
        def on_train_begin(self, *_a: Any, **_k: Any) -> None:
            stamps["begin"] = time.monotonic()

        def on_step_end(self, *_a: Any, **_k: Any) -> None:
            stamps["end"] = time.monotonic()

    with tempfile.TemporaryDirectory() as out_dir:
        trainer = timed_trainer_class()(
            model=AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32),
            reward_funcs=[answer_reward(env, seen)], args=trl_args(params, args, workload, out_dir, prompt_tokens),
            train_dataset=data, processing_class=tokenizer, callbacks=[StepClock()],
            tools=[search_function(env)] if workload == "multi" else None,
        )
        trainer.bench = dict.fromkeys(("generation_s", "generate_and_score_s", "generated_tokens", "sequence_tokens",
                                       "turns", "searches"), 0.0)
        setup_s = time.monotonic() - start
        trainer.train()
    return trl_result(trainer, stamps, seen, setup_s, params, args)


def trl_result(trainer: Any, stamps: dict[str, float], seen: list[tuple[float, bool]], setup_s: float,
               params: Any, args: argparse.Namespace) -> dict[str, Any]:
    b, n = trainer.bench, max(len(seen), 1)
    step_s = stamps["end"] - stamps["begin"]
    update_s = step_s - b["generate_and_score_s"]  # forward/backward of every micro-batch + the optimizer step
    a = trainer.args
    return {
        "setup_s": setup_s, "step_s": step_s, "generation_s": b["generation_s"], "update_s": update_s,
        "other_s": step_s - b["generation_s"] - update_s,
        "trajectories": len(seen), "generated_tokens": int(b["generated_tokens"]),
        "sequence_tokens": int(b["sequence_tokens"]), "mean_turns": b["turns"] / n,
        "tool_calls_per_trajectory": b["searches"] / n, "answer_rate": sum(s[1] for s in seen) / n,
        "mean_reward": sum(s[0] for s in seen) / n,
        "config": {
            "code": "trl.GRPOTrainer.train(), max_steps=1 (transformers generate, no vLLM)",
            "model": str(args.model), "dtype": "float32", "rollout_engine": "model.generate (left-padded batch)",
            "generation_batch": a.generation_batch_size, "samples_per_question": a.num_generations,
            "max_new_tokens_per_turn": params.rollout.max_new_tokens, "max_completion_length": a.max_completion_length,
            "stop": "<|im_end|> only (TRL's generate path takes no stop strings)",
            "temperature": a.temperature, "top_p": a.top_p, "top_k": a.top_k,
            "max_tool_calling_iterations": a.max_tool_calling_iterations,
            "doc_chars": params.env.doc_chars, "search_top_k": params.env.top_k,
            "optimizer": f"{_plain(a.optim)}, lr {a.learning_rate}, wd {a.weight_decay}, grad clip {a.max_grad_norm}, "
                         f"{_plain(a.lr_scheduler_type)} lr",
            "mini_batch": a.per_device_train_batch_size * a.gradient_accumulation_steps,
            "micro_batch": f"{a.per_device_train_batch_size} rows (x {a.gradient_accumulation_steps} accumulation steps)",
            "gradient_checkpointing": a.gradient_checkpointing,
            "loss": f"{a.loss_type}, clip {a.epsilon}, beta {a.beta}", "advantage": f"scale_rewards={a.scale_rewards}",
            "old_logprob_pass": "none (num_iterations 1, steps_per_generation = accumulation steps)",
            "model_copies": "one (generates and trains)", "torch_threads": _threads(),
        },
    }


def _plain(value: Any) -> Any:
    """An enum setting's value (TrainingArguments turns strings into enums)."""
    return getattr(value, "value", value)


def _threads() -> int:
    import torch

    return torch.get_num_threads()


# ------------------------------------------------------------------ driver
def run_side(args: argparse.Namespace) -> None:
    """Child process: one side, one workload; its result and peak RSS go to ``--result``."""
    import torch

    torch.set_num_threads(args.threads)
    result = (run_ours if args.side == "ours" else run_trl)(args, args.workload)
    result["peak_rss_gib"] = peak_rss_gib()
    Path(args.result).write_text(json.dumps(result, default=str))


def child_command(args: argparse.Namespace, side: str, workload: str, result: Path) -> list[str]:
    shared = ["--model", str(args.model), "--index", str(args.index), "--questions-file", str(args.questions_file),
              "--params", str(args.params), "--questions", str(args.questions), "--n", str(args.n),
              "--max-new-tokens", str(args.max_new_tokens), "--max-total-tokens", str(args.max_total_tokens),
              "--max-searches", str(args.max_searches), "--trl-micro-batch", str(args.trl_micro_batch),
              "--threads", str(args.threads)]
    return [sys.executable, str(Path(__file__).resolve()), *shared, "--side", side, "--workload", workload,
            "--result", str(result)]


def spawn(args: argparse.Namespace, side: str, workload: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TRL_EXPERIMENTAL_SILENCE": "1",
               # this venv's own JIT-built DeepSpeed ops: sharing the main venv's folder makes each rebuild the other's
               "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))}
        print(f"== {workload}: {side} ...", flush=True)
        proc = subprocess.run(child_command(args, side, workload, result), env=env, cwd=ROOT)
        if proc.returncode != 0 or not result.exists():
            raise RuntimeError(f"the {side} side of the {workload} workload failed (exit {proc.returncode}); see above")
        return json.loads(result.read_text())


def compare(ours: dict[str, Any], trl: dict[str, Any]) -> dict[str, float]:
    """ours / TRL: below 1 means we are faster (or smaller)."""
    ratio = {f"{k}_ours_over_trl": round(ours[k] / trl[k], 3)
             for k in ("step_s", "generation_s", "update_s", "peak_rss_gib") if trl[k] > 0}
    per_token = [s["generation_s"] / max(s["generated_tokens"], 1) for s in (ours, trl)]
    ratio["generation_s_per_token_ours_over_trl"] = round(per_token[0] / per_token[1], 3)
    return ratio


def print_table(workload: str, ours: dict[str, Any], trl: dict[str, Any], ratio: dict[str, float]) -> None:
    rows = ("step_s", "generation_s", "update_s", "other_s", "setup_s", "trajectories", "generated_tokens",
            "sequence_tokens", "mean_turns", "tool_calls_per_trajectory", "answer_rate", "mean_reward", "peak_rss_gib")
    print(f"\n{workload}: {'':22s}{'ours':>12s}{'TRL':>12s}")
    for k in rows:
        o, t = ours[k], trl[k]
        print(f"{'':10s}{k:24s}{o:>12.2f}{t:>12.2f}" if isinstance(o, float) else f"{'':10s}{k:24s}{o:>12}{t:>12}")
    for k, v in ratio.items():
        print(f"{'':10s}{k:40s}{v:>8.3f}")


def machine() -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("torch", "transformers", "trl", "deepspeed", "accelerate", "datasets"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "policy",
                    help="a transformers folder; the base policy, as the prompt is the one-shot tool_call one "
                         "(the warm start learnt the tags format)")
    ap.add_argument("--index", type=Path, default=ROOT / "indexes" / "bm25")
    ap.add_argument("--questions-file", type=Path, default=ROOT / "data" / "prepared" / "train.parquet")
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml", help="sampling, optimizer and env settings")
    ap.add_argument("--questions", type=int, default=6, help="questions per step (the first ones of the file)")
    ap.add_argument("--n", type=int, default=4, help="samples per question")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="per generation (per turn)")
    ap.add_argument("--max-total-tokens", type=int, default=2048, help="multi: prompt + every turn and tool result")
    ap.add_argument("--max-searches", type=int, default=3, help="multi: searches before the answer turn")
    ap.add_argument("--trl-micro-batch", type=int, default=8, help="TRL's per_device_train_batch_size")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads on both sides")
    ap.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    ap.add_argument("--note", default="", help="recorded in the JSON (e.g. 'under load')")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "trl_compare.json")
    ap.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    ap.add_argument("--workload", choices=WORKLOADS, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    for name in ("model", "index", "questions_file", "params"):
        if not getattr(args, name).exists():
            raise SystemExit(f"--{name.replace('_', '-')}: {getattr(args, name)} does not exist")
    for name in ("questions", "n", "max_new_tokens", "max_searches", "trl_micro_batch", "threads"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.side is not None:
        return run_side(args)
    report: dict[str, Any] = {"machine": machine(), "versions": versions(), "note": args.note,
                              "args": {k: str(v) for k, v in vars(args).items() if k not in ("side", "workload", "result")}}
    for workload in args.workloads:
        ours, trl = spawn(args, "ours", workload), spawn(args, "trl", workload)
        ratio = compare(ours, trl)
        print_table(workload, ours, trl, ratio)
        report[workload] = {"ours": ours, "trl": trl, "ratios": ratio}
    report["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
