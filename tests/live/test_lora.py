"""LoRA in the trainer: adapters on frozen weights, merged weights for the engines, PEFT
adapter files in checkpoints, resume, the base model as the KL reference, FSDP2."""

import asyncio

import pytest
import torch
from test_grpo import LLAMA, shared_prompt_samples
from tiny_model import tiny_chat_model

from pearl.control.interfaces import TrainBatch
from pearl.live.lora import ALL_LINEAR, LoRAConfig
from pearl.live.server import ModelSpec
from pearl.live.trainer import GRPOTrainer
from pearl.live.trainer_config import TrainerConfig
from pearl.models.config import ModelConfig
from pearl.models.loader import build_model

LORA = LoRAConfig(rank=4, alpha=8.0)


def lora_trainer(**fields) -> GRPOTrainer:
    config = TrainerConfig(learning_rate=1e-2, lora=LORA, **fields)
    return GRPOTrainer(ModelSpec(config=LLAMA, seed=0), config)


def batch(step=0):
    samples = shared_prompt_samples(groups=3, tries=3)
    return TrainBatch(step, len(samples), 0, 0, samples=tuple(samples))


def test_only_the_adapters_train_and_the_engines_get_the_merged_weights():
    trainer = lora_trainer()
    base = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable == {
        f"model.layers.{i}.{m}.lora_{ab}"
        for i in range(2)
        for m in (
            *(f"self_attn.{p}" for p in ALL_LINEAR[:4]),
            *(f"mlp.{p}" for p in ALL_LINEAR[4:]),
        )
        for ab in "AB"
    }
    samples = list(batch().samples)
    plain = GRPOTrainer(ModelSpec(config=LLAMA, seed=0), TrainerConfig())
    assert trainer.score(samples) == plain.score(samples)  # B starts at zero: the base model
    stats = trainer.train_step(batch())
    assert stats["updates"] == 1 and stats["grad_norm"] > 0
    for name, p in trainer.model.named_parameters():
        if not name.endswith(("lora_A", "lora_B")):
            assert torch.equal(p, base[name]), name  # frozen
    # The engines' weights: base names only, adapters merged; a model built from them
    # scores as the trainer does.
    version, weights = trainer.weights()
    assert version == 1 and not any("lora" in n for n in weights)
    assert not torch.equal(
        torch.from_numpy(weights["model.layers.0.mlp.down_proj.weight"]),
        base["model.layers.0.mlp.down_proj.weight"],
    )
    merged = GRPOTrainer(ModelSpec(config=LLAMA, seed=0), TrainerConfig())
    state = {n: torch.from_numpy(w) for n, w in weights.items()}
    assert not merged.model.load_state_dict(state, strict=False).unexpected_keys
    for ours, theirs in zip(trainer.score(samples), merged.score(samples), strict=True):
        assert ours == pytest.approx(theirs, abs=1e-5)


def test_lora_with_kl_takes_the_base_model_as_reference_without_a_copy():
    trainer = lora_trainer(kl_coef=0.1)
    assert trainer.reference is None  # the adapters switched off are the reference
    first = trainer.train_step(batch(0))
    assert first["kl"] == pytest.approx(0.0, abs=1e-9)  # the start is the base model
    trainer.train_step(batch(1))
    assert trainer.train_step(batch(2))["kl"] > 1e-6


def test_a_lora_checkpoint_holds_a_merged_model_and_peft_adapters_and_resumes(tmp_path):
    """The checkpoint's model folder is the merged model (Hugging Face loads it), its
    ``adapter/`` loads with peft onto the base model to the same logits, and the trainer
    resumes from it to the same next step."""
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    base_folder = tiny_chat_model(tmp_path / "base")
    spec = ModelSpec(folder=str(base_folder))
    config = TrainerConfig(learning_rate=1e-2, lora=LORA)
    trainer = GRPOTrainer(spec, config)
    samples = [s for s in shared_prompt_samples(groups=2, tries=3)]
    steps = [TrainBatch(i, len(samples), 0, 0, samples=tuple(samples)) for i in range(3)]
    trainer.train_step(steps[0])
    trainer.train_step(steps[1])
    folder = trainer.save(tmp_path / "ckpt")
    assert (folder / "adapter" / "adapter_config.json").exists()

    ids = torch.tensor([[1, 5, 9, 200, 42, 7]])
    merged = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32)
    adapted = peft.PeftModel.from_pretrained(base, folder / "adapter")
    with torch.no_grad():
        want = merged(ids).logits
        got = adapted(ids).logits
        plain = AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32)(ids).logits
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(plain, want, atol=1e-3)  # the adapters did change the model

    resumed = GRPOTrainer(spec, config)
    resumed.load(folder)
    assert resumed.version == 2
    after = resumed.train_step(steps[2])
    assert after["loss"] == pytest.approx(trainer.train_step(steps[2])["loss"], abs=1e-6)
    # The loss is taken before the update; the update itself needs AdamW's moments: the
    # weights after the step (their scores) match only if the moments were restored too.
    got, want = resumed.score(samples), trainer.score(samples)
    pairs = zip(got, want, strict=True)
    assert max(abs(a - b) for g, w in pairs for a, b in zip(g, w, strict=True)) < 1e-5
    # a full fine-tuning checkpoint is not a LoRA one
    full = GRPOTrainer(spec, TrainerConfig())
    full.save(tmp_path / "full")
    with pytest.raises(Exception, match="no adapter/ folder"):
        GRPOTrainer(spec, config).load(tmp_path / "full")


def test_lora_config_is_checked():
    with pytest.raises(ValueError, match="not linear layers.*valid: q_proj"):
        LoRAConfig(4, target_modules=("lm_head",))
    with pytest.raises(ValueError, match="rank >= 1"):
        LoRAConfig(0)
    from pearl.config.train import LORA_TARGETS

    assert LORA_TARGETS == ALL_LINEAR  # the config's choices are the layers LoRA knows


def test_two_lora_trainer_processes_take_the_same_steps_as_one(three_slots):
    """FSDP2 shards frozen weights and adapters alike; the merged weights the two publish
    equal one process's."""
    from pearl.live.trainer_handle import LiveTrainer

    steps = [batch(i) for i in range(2)]
    config = TrainerConfig(learning_rate=1e-2, lora=LORA, micro_batch_tokens=64)
    one = GRPOTrainer(ModelSpec(config=LLAMA, seed=0), config)
    expected = [one.train_step(b) for b in steps]

    async def sharded():
        trainer = LiveTrainer(ModelSpec(config=LLAMA, seed=0), config, processes=2)
        try:
            await trainer.start()
            stats = [(await trainer.train_step(b)).stats for b in steps]
            return stats, await trainer.weights_ref
        finally:
            trainer.kill()

    stats, (version, weights) = asyncio.run(sharded())
    assert version == 2
    for got, want in zip(stats, expected, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5, abs=1e-7)
    _, mine = one.weights()
    assert set(weights) == set(mine)
    for name, w in mine.items():
        torch.testing.assert_close(torch.from_numpy(weights[name].copy()), torch.from_numpy(w))


def test_a_random_models_adapted_modules_are_named_as_in_hugging_face():
    from pearl.live.lora import apply_lora

    model = build_model(ModelConfig.from_dict(LLAMA), seed=0)
    names = apply_lora(model, LoRAConfig(2, target_modules=("q_proj", "down_proj")))
    assert names == [
        "model.layers.0.self_attn.q_proj",
        "model.layers.0.mlp.down_proj",
        "model.layers.1.self_attn.q_proj",
        "model.layers.1.mlp.down_proj",
    ]


def test_the_training_state_counts_what_each_variant_holds():
    full = GRPOTrainer(ModelSpec(config=LLAMA, seed=0), TrainerConfig(kl_coef=0.1))
    lora = lora_trainer(kl_coef=0.1)
    for t in (full, lora):
        t.train_step(batch())
    a, b = full.state_bytes(), lora.state_bytes()
    assert a["reference"] == a["weights"] > 0 and b["reference"] == 0  # LoRA: the base is it
    assert a["optimizer"] == 2 * a["gradients"] == 2 * a["weights"]  # AdamW's two moments
    adapters = sum(p.numel() * 4 for p in lora.model.parameters() if p.requires_grad)
    assert b["gradients"] == adapters and b["optimizer"] == 2 * adapters
    assert b["weights"] == a["weights"] + adapters
