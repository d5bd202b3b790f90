"""DeepSpeed training infrastructure, in one process (world size 1).

A tiny random Llama stands in for the policy everywhere except one check with
the real SmolLM2-135M. fp32 where results are compared exactly.
"""

from __future__ import annotations

import copy
import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaForCausalLM

from agent_r1.config import TrainConfig
from agent_r1.training.checkpoint import LATEST, export_hf, full_state_dict, load_latest, save_checkpoint
from agent_r1.training.distributed import init_distributed
from agent_r1.training.models import ds_config, make_frozen, make_trainable, optimizer_groups, unwrap
from agent_r1.training.batching import micro_batches, select_rows
from agent_r1.training.logprobs import batched_token_logprobs, batched_values, token_logprobs
from agent_r1.training.models import ValueModel, load_policy, make_frozen, make_trainable

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from train_tiny import VOCAB, global_batch, tiny_llama  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def _dist() -> None:
    init_distributed()


def cfg_for(stage: int, **kw) -> TrainConfig:
    base = dict(zero_stage=stage, bf16=False, gradient_checkpointing=True, grad_clip=1.0)
    return TrainConfig(**{**base, **kw})


def fresh_llama(seed: int = 0) -> LlamaForCausalLM:
    model = tiny_llama(seed)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def naive_logprobs(model, ids, mask, temperature=1.0):
    """The reference: full float32 log-softmax over [B, T, V]."""
    logits = model(input_ids=ids, attention_mask=mask).logits.float() / temperature
    logp = torch.log_softmax(logits, -1)
    lp = torch.zeros(ids.shape)
    lp[:, 1:] = logp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    ent = torch.zeros(ids.shape)
    ent[:, 1:] = -(logp.exp() * logp).sum(-1)[:, :-1]
    real = mask.bool() & torch.cat([torch.zeros_like(mask[:, :1]), mask[:, :-1]], 1).bool()
    return lp * real, ent * real


def mean_nll_step(engine, batch: dict, budget: int) -> float:
    """One optimizer step on the token-mean NLL, micro-batched by our own accumulation."""
    n_tokens = int(batch["attention_mask"][:, 1:].sum())
    total = 0.0
    for rows in micro_batches(batch["attention_mask"].sum(-1).tolist(), budget):
        mb = select_rows(batch, rows)
        lp = token_logprobs(engine, mb["input_ids"], mb["attention_mask"], chunk_tokens=16)
        loss = -(lp * mb["attention_mask"]).sum() / n_tokens
        engine.backward(loss)
        total += float(loss.detach())
    engine.step()
    return total


def gathered(engine) -> dict[str, torch.Tensor]:
    return full_state_dict(engine)


# ------------------------------------------------------------------ micro-batches
def test_micro_batches_respect_budget_and_cover_every_row_once() -> None:
    rng = random.Random(0)
    for _ in range(200):
        lengths = [rng.randint(1, 300) for _ in range(rng.randint(0, 40))]
        budget = rng.randint(1, 1200)
        groups = micro_batches(lengths, budget)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        for g in groups:
            assert len(g) == 1 or max(lengths[i] for i in g) * len(g) <= budget
        assert groups == micro_batches(lengths, budget)  # deterministic
    assert micro_batches([5, 100, 7, 6], 20) == [[1], [2, 3], [0]]  # long row alone; sorted by length


def test_select_rows_trims_to_longest_selected_row() -> None:
    batch = global_batch(0)
    lengths = batch["attention_mask"].sum(-1)
    mb = select_rows({**batch, "group_id": torch.arange(8)}, [3, 5])
    assert mb["input_ids"].shape == (2, int(lengths[[3, 5]].max()))
    assert mb["group_id"].tolist() == [3, 5]


# ------------------------------------------------------------------ token log-probs
def test_token_logprobs_match_full_log_softmax() -> None:
    model = fresh_llama().eval()
    batch = global_batch(1)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    for temperature in (1.0, 0.7):
        with torch.no_grad():
            lp, ent = token_logprobs(model, ids, mask, temperature=temperature, return_entropy=True, chunk_tokens=5)
            ref_lp, ref_ent = naive_logprobs(model, ids, mask, temperature)
        assert lp.dtype == torch.float32 and lp.shape == ids.shape
        torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)
    assert (lp[:, 0] == 0).all() and (lp[mask == 0] == 0).all()
    # with gradients on (checkpointed chunks), and batched by a token budget, the values are the same
    plain = naive_logprobs(model, ids, mask)[0].detach()
    torch.testing.assert_close(token_logprobs(model, ids, mask, chunk_tokens=7).detach(), plain, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(batched_token_logprobs(model, ids, mask, token_budget=40), plain, atol=1e-5, rtol=1e-5)


def test_score_mask_scores_only_the_masked_tokens_with_the_same_values_and_gradients() -> None:
    """Skipping the LM head off the loss mask changes no logprob the loss reads, nor its gradient."""
    model = fresh_llama().train()
    batch = global_batch(2)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    score = torch.zeros_like(mask)
    score[:, 3:8] = 1  # an "action" span
    score = score * mask

    def loss_and_grads(score_mask):
        model.zero_grad()
        lp = token_logprobs(model, ids, mask, chunk_tokens=4, score_mask=score_mask)
        (-(lp * score).sum()).backward()
        return lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    full, g_full = loss_and_grads(None)
    part, g_part = loss_and_grads(score)
    on = score.bool()
    torch.testing.assert_close(part[on], full[on], atol=1e-6, rtol=1e-6)
    assert (part[~on] == 0).all() and (full[~on & mask.bool()][:, ...] != 0).any()
    for name in g_full:
        torch.testing.assert_close(g_part[name], g_full[name], atol=1e-6, rtol=1e-5, msg=name)
    with torch.no_grad():
        batched = batched_token_logprobs(model, ids, mask, token_budget=40, score_mask=score)
    torch.testing.assert_close(batched[on], full[on], atol=1e-5, rtol=1e-5)
    assert (batched[~on] == 0).all()


def test_masked_positions_get_exactly_zero_gradient() -> None:
    """Tokens scored only at masked positions (a trailing observation) must not move any parameter."""
    model = fresh_llama().train()
    batch = global_batch(2)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    loss_mask = mask.clone()
    loss_mask[:, 10:] = 0  # everything from position 10 on is masked out of the loss

    def grads(token_ids):
        model.zero_grad()
        lp = token_logprobs(model, token_ids, mask, chunk_tokens=9)
        lp.retain_grad()
        (-(lp * loss_mask).sum()).backward()
        return lp.grad, {n: p.grad.clone() for n, p in model.named_parameters()}

    lp_grad, g1 = grads(ids)
    assert (lp_grad[loss_mask == 0] == 0).all() and (lp_grad[loss_mask == 1] != 0).any()
    changed = ids.clone()
    changed[:, 10:] = torch.randint(0, VOCAB, changed[:, 10:].shape)
    _, g2 = grads(changed)
    for name in g1:
        assert torch.equal(g1[name], g2[name]), name


@pytest.mark.parametrize("stage", [2, 3])
def test_manual_accumulation_equals_one_full_batch(stage: int) -> None:
    """Three-ish budget micro-batches + one step == plain torch full batch + AdamW, for 2 steps."""
    lr = 1e-3
    reference = fresh_llama()
    engine = make_trainable(copy.deepcopy(reference), cfg_for(stage), lr=lr)
    engine.train()
    opt = torch.optim.AdamW(optimizer_groups(reference, 0.0), lr=lr)
    budget = 60
    for step in range(2):
        batch = global_batch(step)
        assert len(micro_batches(batch["attention_mask"].sum(-1).tolist(), budget)) >= 3
        ds_loss = mean_nll_step(engine, batch, budget)

        opt.zero_grad()
        lp = token_logprobs(reference, batch["input_ids"], batch["attention_mask"])
        loss = -(lp * batch["attention_mask"]).sum() / batch["attention_mask"][:, 1:].sum()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
        opt.step()
        assert ds_loss == pytest.approx(float(loss.detach()), rel=1e-5)
        assert float(engine.get_global_grad_norm()) == pytest.approx(float(norm), rel=1e-4)
    ours, ref = gathered(engine), reference.state_dict()
    assert set(ours) == set(ref)
    # Adam divides by sqrt(v): where a gradient is near zero it magnifies the rounding of
    # the accumulated sum, so a few weights land a few hundredths of a step apart (one of
    # 4096 at 0.0201 lr on a 2-core AVX2 EPYC); a wrong accumulation moves many weights by ~lr.
    for name in ref:
        torch.testing.assert_close(ours[name], ref[name], atol=lr * 0.05, rtol=0, msg=name)


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_stage_trains_bf16(stage: int) -> None:
    engine = make_trainable(fresh_llama(), cfg_for(stage, bf16=True), lr=3e-3)
    engine.train()
    batch = global_batch(0)
    losses = [mean_nll_step(engine, batch, budget=80) for _ in range(5)]
    assert losses[-1] < losses[0] - 0.1, losses
    assert next(unwrap(engine).parameters()).dtype == torch.bfloat16


# ------------------------------------------------------------------ reference, value model
def test_reference_engine_zero3_inference_matches_plain_model() -> None:
    model = fresh_llama().eval()
    ref = make_frozen(copy.deepcopy(model), cfg_for(3))
    batch = global_batch(3)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert not any(p.requires_grad for p in ref.module.parameters())
    expected = naive_logprobs(model, ids, mask)[0].detach()
    torch.testing.assert_close(batched_token_logprobs(ref, ids, mask, token_budget=50), expected, atol=1e-5, rtol=1e-5)


def test_value_model_save_load_and_critic_engine(tmp_path: Path) -> None:
    lm_dir = tmp_path / "lm"
    fresh_llama().save_pretrained(lm_dir)
    critic = ValueModel.from_pretrained(lm_dir, "float32", gradient_checkpointing=True)
    lm = AutoModelForCausalLM.from_pretrained(lm_dir)
    assert torch.equal(critic.backbone.embed_tokens.weight, lm.model.embed_tokens.weight)
    batch = global_batch(4)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    values = critic(ids, mask)
    assert values.shape == ids.shape and values.dtype == torch.float32
    assert values.abs().max() < 0.5  # small head init: the first values don't swamp the returns

    engine = make_trainable(critic, cfg_for(2), lr=1e-2)
    engine.train()
    target = torch.linspace(-1, 1, ids.shape[1]).expand_as(ids) * mask
    losses = []
    for _ in range(4):
        v = engine(ids, mask)
        loss = ((v - target) ** 2 * mask).sum() / mask.sum()
        engine.backward(loss)
        engine.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0], losses

    out = tmp_path / "critic"
    export_hf(engine, None, out)
    reloaded = ValueModel.from_pretrained(out, "float32", gradient_checkpointing=False).eval()
    torch.testing.assert_close(reloaded(ids, mask) * mask, batched_values(engine, ids, mask, token_budget=64))


def test_load_policy_turns_off_the_cache(tmp_path: Path) -> None:
    fresh_llama().save_pretrained(tmp_path / "lm")
    model = load_policy(tmp_path / "lm", "bfloat16", gradient_checkpointing=True)
    assert model.config.use_cache is False and model.is_gradient_checkpointing and model.dtype == torch.bfloat16


def test_ds_config_uses_our_accumulation_and_warmup() -> None:
    config = ds_config(cfg_for(3, warmup_steps=4, bf16=True), 1e-4, world_size=2)
    assert config["gradient_accumulation_steps"] == 1 and config["managed_gradient_accumulation"] is False
    assert config["zero_optimization"]["stage"] == 3 and config["bf16"]["enabled"]
    assert config["scheduler"]["params"]["warmup_max_lr"] == 1e-4 and config["gradient_clipping"] == 1.0
    assert "scheduler" not in ds_config(cfg_for(2), 1e-4) and "optimizer" not in config


# ------------------------------------------------------------------ checkpoints, export
@pytest.mark.parametrize("stage", [2, 3])
def test_checkpoint_resume_continues_identically(stage: int, tmp_path: Path) -> None:
    cfg = cfg_for(stage, warmup_steps=3)
    engine = make_trainable(fresh_llama(seed=0), cfg, lr=1e-2)
    engine.train()
    for step in range(2):
        mean_nll_step(engine, global_batch(step), budget=60)
        save_checkpoint({"actor": engine}, tmp_path, step + 1, {"next_step": step + 1})
    uninterrupted = [mean_nll_step(engine, global_batch(step), budget=60) for step in (2, 3)]

    other = make_trainable(fresh_llama(seed=1), cfg, lr=1e-2)  # different init: load must overwrite it
    other.train()
    step, extra = load_latest({"actor": other}, tmp_path)
    assert (step, extra) == (2, {"next_step": 2})
    resumed = [mean_nll_step(other, global_batch(s), budget=60) for s in (2, 3)]
    assert resumed == uninterrupted
    a, b = gathered(engine), gathered(other)
    assert all(torch.equal(a[k], b[k]) for k in a)

    for s in (3, 4):
        save_checkpoint({"actor": engine}, tmp_path, s, {"next_step": s})
    assert sorted(p.name for p in (tmp_path / "actor").iterdir() if p.is_dir()) == ["step3", "step4"]
    assert json.loads((tmp_path / LATEST).read_text())["step"] == 4
    with pytest.raises(ValueError, match="critic"):
        load_latest({"critic": other}, tmp_path)


def test_checkpoint_files_are_on_disk_before_latest_json_points_at_them(tmp_path: Path, monkeypatch) -> None:
    """Every file of the tag and their folders are fsync'ed before latest.json is replaced, and
    latest.json's folder after: a power loss never leaves latest.json naming unwritten files."""
    import os

    engine = make_trainable(fresh_llama(), cfg_for(2), lr=1e-3)
    events: list[tuple[str, str]] = []
    fsync, replace = os.fsync, os.replace

    def recording_fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def recording_replace(src, dst, **kw) -> None:
        events.append(("replace", str(Path(dst).resolve())))
        replace(src, dst, **kw)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "replace", recording_replace)
    save_checkpoint({"actor": engine}, tmp_path, 1)
    root = tmp_path.resolve()
    publish = events.index(("replace", str(root / LATEST)))
    synced = {path for kind, path in events[:publish] if kind == "fsync"}
    tag_files = {str(p) for p in root.glob("*/step1/*") if p.is_file()}
    assert tag_files | {str(root / "actor" / "step1"), str(root / "actor"), str(root)} <= synced
    assert len(tag_files) == 3  # model states, optimizer states, RNG states
    assert ("fsync", str(root)) in events[publish + 1 :]  # the new latest.json entry itself


def test_a_resumed_run_continues_the_random_streams(tmp_path: Path) -> None:
    """Python, numpy and torch RNGs continue after a resume as they would have without one."""
    import numpy as np

    engine = make_trainable(fresh_llama(), cfg_for(2), lr=1e-3)
    torch.manual_seed(3), random.seed(3), np.random.seed(3)
    save_checkpoint({"actor": engine}, tmp_path, 1)
    expected = (torch.rand(4), random.random(), np.random.rand())
    torch.manual_seed(99), random.seed(99), np.random.seed(99)  # a fresh process seeds at start
    load_latest({"actor": engine}, tmp_path)
    got = (torch.rand(4), random.random(), np.random.rand())
    assert torch.equal(got[0], expected[0]) and got[1:] == expected[1:]


def test_no_checkpoint_gives_none(tmp_path: Path) -> None:
    engine = make_trainable(fresh_llama(), cfg_for(2), lr=1e-3)
    assert load_latest({"actor": engine}, tmp_path) is None


@pytest.mark.parametrize("stage", [2, 3])
def test_export_hf_loads_with_transformers(stage: int, tmp_path: Path) -> None:
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")))
    engine = make_trainable(fresh_llama(), cfg_for(stage), lr=1e-2)
    engine.train()
    mean_nll_step(engine, global_batch(0), budget=80)
    export_hf(engine, tokenizer, tmp_path / "hf")
    assert (tmp_path / "hf" / "model.safetensors").exists() and (tmp_path / "hf" / "tokenizer.json").exists()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    state = gathered(engine)
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, state[name]), name
    batch = global_batch(5)
    torch.testing.assert_close(
        batched_token_logprobs(engine, batch["input_ids"], batch["attention_mask"], 100),
        naive_logprobs(loaded, batch["input_ids"], batch["attention_mask"])[0].detach(),
        atol=1e-5,
        rtol=1e-5,
    )


# ------------------------------------------------------------------ the real model
def test_real_policy_logprobs_match_naive(request: pytest.FixtureRequest) -> None:
    """SmolLM2-135M (vocab 49,152): chunked log-probs equal the full log-softmax."""
    path = ROOT / "models" / "policy"
    if not (path / "config.json").exists():
        path = request.getfixturevalue("policy_dir")
    model = load_policy(path, "float32", gradient_checkpointing=False).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (2, 48), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0
    with torch.no_grad():
        lp, ent = token_logprobs(model, ids, mask, return_entropy=True, chunk_tokens=32)
        ref_lp, ref_ent = naive_logprobs(model, ids, mask)
    torch.testing.assert_close(lp, ref_lp, atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(ent, ref_ent, atol=2e-4, rtol=1e-4)


def test_zero2_clips_by_a_correctly_rounded_grad_norm() -> None:
    """DeepSpeed's root of the summed squares is ``pow(0.5)``: MKL's vector sqrt on CPU, whose
    last bit depends on the CPU model (an AMD EPYC gets many of these roots 1 ulp off).
    The engine's optimizer takes IEEE's correctly rounded root instead, the same on every CPU."""
    engine = make_trainable(fresh_llama(), cfg_for(2), lr=1e-3)
    optimizer = engine.optimizer
    params = list(engine.module.parameters())[:2]
    rng = np.random.default_rng(0)
    for a, b in rng.uniform(0.5, 8.0, size=(400, 2)).astype(np.float32):
        # two one-element gradients: DeepSpeed sums their squared norms in float64, then rounds to float32
        squares = np.float32(np.float64(a) ** 2 + np.float64(b) ** 2)
        expected = np.float32(np.sqrt(np.float64(squares)))
        got = optimizer.get_grad_norm_direct([torch.tensor([a]), torch.tensor([b])], params)
        assert float(got) == expected, (a, b)
    param = params[0]
    assert float(optimizer.get_grad_norm_direct([torch.tensor([float("inf")])], [param])) == -1.0  # skip the step
