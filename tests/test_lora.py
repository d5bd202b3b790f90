"""LoRA through PEFT (train.lora) on a tiny random Llama (seconds): only the adapters train, the
merged model is what leaves the trainer (exported folder, weight-sync buckets), and with a KL term
the reference is the base model (the actor with its adapters off)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
sys.path.insert(0, str(Path(__file__).parent))
from test_packed_update import trajectory_batch  # noqa: E402
from train_tiny import VOCAB, tiny_llama  # noqa: E402

from agent_r1.config import LoRAConfig, Params  # noqa: E402
from agent_r1.training.checkpoint import export_hf  # noqa: E402
from agent_r1.training.logprobs import token_logprobs  # noqa: E402
from agent_r1.training.loop import build_models, update_from_rollout, update_settings  # noqa: E402
from agent_r1.training.lora import add_lora, has_lora, lora_scaling, merged_weights, trainable_share  # noqa: E402
from agent_r1.training.models import unwrap  # noqa: E402
from agent_r1.training.samples import make_samples  # noqa: E402
from agent_r1.training.update import score, signal_rows  # noqa: E402
from agent_r1.training.weight_sync import gathered_weight_buckets  # noqa: E402

LENGTHS = [24, 9, 17, 30, 12, 5, 28, 20]


def lora_params(kl_coef: float = 0.0, **lora: object) -> Params:
    p = Params()
    return p.model_copy(update={
        "train": p.train.model_copy(update={"mini_batch_size": 8, "micro_batch_tokens": 64, "actor_lr": 1e-2,
                                            "lora": LoRAConfig(rank=4, alpha=8, **lora)}),
        "algorithm": p.algorithm.model_copy(update={"kl_coef": kl_coef}),
    })  # fmt: skip


@pytest.fixture()
def tiny(tmp_path: Path) -> Path:
    tiny_llama(seed=0).save_pretrained(tmp_path / "tiny")
    return tmp_path / "tiny"


def two_updates(params: Params, init: Path):
    models = build_models(params, init)
    for _ in range(2):  # the first Adam step moves only B (A's gradient is 0 while B is)
        update_from_rollout(params, models, trajectory_batch(LENGTHS))
    return models


def test_only_the_adapters_train_and_the_export_is_the_merged_model(tiny: Path, tmp_path: Path) -> None:
    base = tiny_llama(seed=0).state_dict()
    models = two_updates(lora_params(), tiny)
    lm = unwrap(models.actor)
    assert 0 < trainable_share(lm) < 0.1
    state = lm.state_dict()
    changed = {k for k in state if ".lora_" not in k and not torch.equal(state[k], base[k.replace(".base_layer", "")])}
    assert changed == set()  # the base is frozen
    assert any(not torch.equal(state[k], torch.zeros_like(state[k])) for k in state if k.endswith("lora_B.default.weight"))

    export_hf(models.actor, None, tmp_path / "out")
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "out")  # plain transformers, no PEFT keys
    assert not has_lora(exported) and set(exported.state_dict()) == set(base)
    ids = torch.randint(3, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(exported(input_ids=ids).logits, lm(input_ids=ids).logits, rtol=0, atol=1e-5)
        assert (exported(input_ids=ids).logits - tiny_llama(seed=0)(input_ids=ids).logits).abs().max() > 1e-3


def test_with_a_kl_term_the_reference_is_the_base_model(tiny: Path) -> None:
    params = lora_params(kl_coef=0.01)
    models = two_updates(params, tiny)
    assert models.reference is None and models.reference_is_base
    samples = make_samples(trajectory_batch(LENGTHS), "flat")
    cfg = update_settings(params)
    ref = score(models, samples, cfg, True, list(range(len(samples)))).ref
    mask = samples.loss_mask
    base = token_logprobs(tiny_llama(seed=0), samples.input_ids, samples.attention_mask, score_mask=mask,
                          temperature=cfg.temperature)
    with torch.no_grad():
        actor = token_logprobs(models.actor, samples.input_ids, samples.attention_mask, score_mask=mask,
                               temperature=cfg.temperature)
    torch.testing.assert_close(ref, base.detach(), rtol=0, atol=1e-5)
    assert (actor - ref).abs().max() > 1e-3  # the adapters are back on after scoring
    # a KL term has a gradient on every sample: none may be skipped
    advantages = torch.zeros_like(mask)
    assert signal_rows(advantages, samples, cfg, models) == list(range(len(samples)))


def test_weight_sync_buckets_merge_on_their_own(tiny: Path) -> None:
    """Small buckets (a few thousand elements) split the layers, never a LoRA layer from its base."""
    models = two_updates(lora_params(target_modules=["q_proj", "v_proj", "down_proj"]), tiny)
    lm = unwrap(models.actor)
    whole = merged_weights(lm.state_dict(), lora_scaling(lm))
    pieces: dict[str, torch.Tensor] = {}
    buckets = 0
    for bucket in gathered_weight_buckets(models.actor, max_elements=3000):
        pieces |= merged_weights(bucket, lora_scaling(lm))
        buckets += 1
    assert buckets > 5 and set(pieces) == set(whole) == set(tiny_llama(seed=0).state_dict())
    for k in whole:
        assert torch.equal(pieces[k], whole[k]), k


def test_lora_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="target_modules"):
        LoRAConfig(target_modules=[])
    with pytest.raises(ValueError, match="rank"):
        LoRAConfig(rank=0)
    lm = add_lora(tiny_llama(seed=0), 2, 4.0, "all-linear")
    assert lora_scaling(lm) == 2.0 and has_lora(lm)
    assert not any(".lora_" in n for n, _ in lm.named_parameters() if "lm_head" in n or "embed" in n)
