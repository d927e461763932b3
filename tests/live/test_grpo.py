"""The GRPO trainer: advantages, the clipped token loss by hand, masking, logprob parity
with the engine, a step that lowers the loss, checkpoints that resume exactly."""

import dataclasses
import errno
import math

import pytest
import torch
from full_disk import small_disk
from tiny_model import tiny_model

from pearl.control.interfaces import TrainBatch, TrainSample
from pearl.engine.config import EngineConfig
from pearl.engine.engine import LLMEngine
from pearl.engine.sequence import Request, SamplingParams
from pearl.errors import CheckpointError
from pearl.live.grpo import clipped_token_loss, group_advantages
from pearl.live.server import ModelSpec
from pearl.live.trainer import DeviceLentError, GRPOTrainer
from pearl.live.trainer_config import TrainerConfig
from pearl.models.config import ModelConfig

LLAMA = tiny_model(
    "llama",
    vocab_size=120,
    max_position_embeddings=512,
    tie_word_embeddings=True,
    rope_theta=100000.0,
)


def test_group_advantages_standardize_within_each_group():
    adv = group_advantages([1.0, 0.0, 1.0, 0.0, 0.5, 0.5], ["a", "a", "b", "b", "c", "c"])
    assert adv[:4] == pytest.approx([1.0, -1.0, 1.0, -1.0], abs=1e-5)
    assert adv[4:] == [0.0, 0.0]  # a group that agrees teaches nothing


def test_clipped_loss_equals_the_hand_computation():
    # Two trajectories, three positions each; masks pick 2 and 1 tokens (3 in all).
    new = torch.tensor([[math.log(0.5), math.log(0.9), 0.0], [0.0, math.log(0.3), 0.0]])
    old = torch.tensor([[math.log(0.4), math.log(0.5), 0.0], [0.0, math.log(0.6), 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    loss, stats = clipped_token_loss(new, old, adv, mask, (0.2, 0.2), divisor=3)
    # ratios: 1.25 (A=+1: clipped to 1.2), 1.8 (A=+1: clipped to 1.2), 0.5 (A=-1: min(-0.5,
    # -0.8) = -0.8, the clipped term binds). Loss = -(1.2 + 1.2 - 0.8) / 3.
    assert float(loss) == pytest.approx(-(1.2 + 1.2 - 0.8) / 3, abs=1e-6)
    assert stats["tokens"] == 3 and stats["clipped"] == 3


def test_masked_tokens_get_no_gradient():
    new = torch.randn(2, 5, requires_grad=True)
    old = new.detach() + 0.01 * torch.randn(2, 5)  # ratios near 1: nothing clipped
    mask = torch.tensor([[0, 1, 1, 0, 0], [1, 0, 0, 0, 1]], dtype=torch.float32)
    loss, _ = clipped_token_loss(new, old, torch.tensor([0.7, -1.3]), mask, (0.2, 0.2), divisor=4)
    loss.backward()
    assert torch.all(new.grad[mask == 0] == 0)
    assert torch.all(new.grad[mask == 1] != 0)


def tiny_engine(num_kv_blocks: int) -> LLMEngine:
    return LLMEngine.from_model_config(
        ModelConfig.from_dict(LLAMA),
        EngineConfig(block_size=8, num_kv_blocks=num_kv_blocks, max_num_batched_tokens=64),
        seed=0,
    )


def two_turns(engine, prompt, observation, params, rid):
    """``prompt``, a sampled turn, ``observation`` (masked out), a second sampled turn:
    (tokens, loss mask, behaviour logprobs); ``params(turn)`` gives each turn's sampling."""
    tokens, mask, logprobs = list(prompt), [0] * len(prompt), [0.0] * len(prompt)
    for turn in range(2):
        out = engine.generate([Request(f"{rid}{turn}", tokens, params(turn))])[f"{rid}{turn}"]
        tokens += out.token_ids
        mask += [1] * len(out.token_ids)
        logprobs += out.logprobs
        if turn == 0:
            tokens += observation
            mask += [0] * len(observation)
            logprobs += [0.0] * len(observation)
    return tuple(tokens), tuple(mask), tuple(logprobs)


def rollout_samples(n: int = 4, seed: int = 0) -> list[TrainSample]:
    """Two-turn trajectories sampled by the engine at temperature 1 (an observation between
    the turns is masked out), with the engine's logprobs as behaviour logprobs."""
    engine = tiny_engine(128)
    samples = []
    for i in range(n):
        prompt = [1 + (i * 7 + k) % 100 for k in range(9 + i)]
        sp = SamplingParams(temperature=1.0, seed=seed * 100 + i, max_new_tokens=6)
        turns = two_turns(engine, prompt, [3, 4, 5, 6 + i], lambda turn, sp=sp: sp, f"r{i}")
        samples.append(TrainSample(*turns, float(i % 2), f"g{i // 2}"))
    return samples


def test_trainer_logprobs_equal_the_engines():
    samples = rollout_samples()
    trainer = GRPOTrainer(ModelSpec(config=LLAMA, seed=0), TrainerConfig(micro_batch_tokens=40))
    scored = trainer.score(samples)  # micro-batches of mixed lengths, right-padded
    for sample, lp in zip(samples, scored, strict=True):
        for m, engine_lp, trainer_lp in zip(sample.loss_mask, sample.logprobs, lp, strict=True):
            if m:
                assert trainer_lp == pytest.approx(engine_lp, abs=1e-4)
            else:
                assert trainer_lp == 0.0


def test_with_top_k_and_top_p_the_ratio_is_one_on_the_weights_that_sampled():
    """Tokens drawn from the truncated distribution carry its log-probability (what vLLM's
    processed log-probabilities are), and a trainer told the same truncation computes the
    same: its ratio is 1 at step 0 and nothing is clipped. Scored against the full
    distribution (the trainer without truncation), the ratio is not 1."""
    engine = tiny_engine(128)
    temperature, top_k, top_p = 0.8, 12, 0.7
    sp = [
        SamplingParams(temperature, top_p, top_k, seed=i, max_new_tokens=8, ignore_eos=True)
        for i in range(4)
    ]
    samples = []
    for i in range(4):
        prompt = [1 + (i * 5 + k) % 100 for k in range(7 + i)]
        turns = two_turns(engine, prompt, [3, 4, 5], lambda turn, i=i: sp[i], f"t{i}")
        samples.append(TrainSample(*turns, float(i % 2), f"g{i // 2}"))
    batch = TrainBatch(0, len(samples), 0, 0, samples=tuple(samples))
    spec = ModelSpec(config=LLAMA, seed=0)
    same = GRPOTrainer(spec, TrainerConfig(temperature=temperature, top_k=top_k, top_p=top_p))
    for sample, scored in zip(samples, same.score(samples), strict=True):
        for m, engine_lp, trainer_lp in zip(sample.loss_mask, sample.logprobs, scored, strict=True):
            if m:
                assert trainer_lp == pytest.approx(engine_lp, abs=1e-5)
    stats = same.train_step(batch)
    assert stats["mean_ratio"] == pytest.approx(1.0, abs=1e-6) and stats["clip_fraction"] == 0
    full = GRPOTrainer(spec, TrainerConfig(temperature=temperature)).train_step(batch)
    assert full["mean_ratio"] < 0.9  # each token's full-distribution probability is lower


def test_truncation_keeps_the_most_probable_tokens_and_renormalizes():
    from pearl.engine.sampler import truncated_log_softmax

    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    assert torch.allclose(
        truncated_log_softmax(logits, 2, 1.0).exp(), torch.tensor([[5 / 7, 2 / 7, 0, 0, 0]])
    )
    # top-p 0.8: 0.5, 0.2 (0.7 before it < 0.8) and 0.15 (0.7 < 0.8) stay; 0.1 (0.85) goes
    kept = truncated_log_softmax(logits, 0, 0.8).exp()
    assert torch.allclose(kept, torch.tensor([[0.5, 0.2, 0.15, 0, 0]]) / 0.85)
    assert torch.equal(
        truncated_log_softmax(logits, 0, 0.1).exp(), torch.tensor([[1.0, 0, 0, 0, 0]])
    )


def test_a_step_lowers_the_loss_on_its_batch_and_refuses_while_lent():
    samples = rollout_samples()
    trainer = GRPOTrainer(ModelSpec(config=LLAMA, seed=0), TrainerConfig(learning_rate=1e-3))
    batch = TrainBatch(0, len(samples), 0, 0, samples=tuple(samples))

    def loss() -> float:
        """The step's loss on the current weights, from the trainer's own scores."""
        scored = trainer.score(samples)
        width = max(len(s.token_ids) for s in samples)

        def rows(values) -> torch.Tensor:
            return torch.tensor([list(v) + [0.0] * (width - len(v)) for v in values])

        mask = rows([s.loss_mask for s in samples])
        adv = torch.tensor(
            group_advantages([s.reward for s in samples], [s.group for s in samples])
        )
        total = int(mask[:, 1:].sum())
        old = rows([s.logprobs for s in samples])
        return float(clipped_token_loss(rows(scored), old, adv, mask, (0.2, 0.2), divisor=total)[0])

    before = loss()
    stats = trainer.train_step(batch)
    assert stats["loss"] == pytest.approx(before, abs=1e-5)  # first step: same weights
    assert loss() < before - 1e-4
    assert trainer.version == 1 and stats["trained_tokens"] == sum(
        sum(s.loss_mask) for s in samples
    )
    trainer.release_device()
    with pytest.raises(DeviceLentError):
        trainer.train_step(batch)
    trainer.restore_device()
    trainer.train_step(batch)


def test_checkpoint_resumes_the_same_next_step(tmp_path):
    samples = rollout_samples()
    batch = TrainBatch(0, len(samples), 0, 0, samples=tuple(samples))
    config = TrainerConfig(learning_rate=1e-3)
    a = GRPOTrainer(ModelSpec(config=LLAMA, seed=0), config)
    a.train_step(batch)
    folder = a.save(tmp_path / "v1")
    assert (folder / "config.json").is_file() and (folder / "optimizer" / "trainer.json").is_file()
    # The checkpoint is a model folder an engine can serve.
    LLMEngine.from_folder(folder, EngineConfig(block_size=8, num_kv_blocks=16))
    b = GRPOTrainer(ModelSpec(config=LLAMA, seed=1), config)  # other weights, then resumed
    b.load(folder)
    assert b.version == 1
    sa, sb = a.train_step(batch), b.train_step(batch)
    assert sa["loss"] == pytest.approx(sb["loss"], abs=1e-7)
    for (n, pa), (_, pb) in zip(
        a.model.named_parameters(), b.model.named_parameters(), strict=True
    ):
        torch.testing.assert_close(pa, pb, rtol=0, atol=1e-7, msg=n)


def test_episodes_the_environment_failed_are_not_trained_on():
    """A failed episode (env_error / env_timeout) counts as reward 0 in the step's reward
    but neither trains nor moves its group's baseline: the step equals one without it."""
    import dataclasses

    samples = rollout_samples(n=6)
    failed = [
        dataclasses.replace(samples[1], reward=0.0, stop_reason="env_error"),
        dataclasses.replace(samples[3], reward=0.0, stop_reason="env_timeout"),
        TrainSample((), (), (), 0.0, "g2", stop_reason="env_error"),  # failed at reset
    ]
    kept = [samples[0], samples[2], samples[4], samples[5]]
    a = GRPOTrainer(ModelSpec(config=LLAMA, seed=0), TrainerConfig(learning_rate=1e-3))
    b = GRPOTrainer(ModelSpec(config=LLAMA, seed=0), TrainerConfig(learning_rate=1e-3))
    with_failures = a.train_step(TrainBatch(0, 7, 0, 0, samples=tuple(kept + failed)))
    without = b.train_step(TrainBatch(0, 4, 0, 0, samples=tuple(kept)))
    assert with_failures["env_failures"] == 3 and without["env_failures"] == 0
    assert with_failures["loss"] == pytest.approx(without["loss"], abs=1e-7)
    assert with_failures["trained_tokens"] == without["trained_tokens"]
    assert with_failures["reward_mean"] == pytest.approx(sum(s.reward for s in kept) / 7)
    for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb)


def shared_prompt_samples(groups: int = 2, tries: int = 3) -> list[TrainSample]:
    """GRPO groups as they come: each task's ``tries`` trajectories share its prompt, then
    differ (two sampled turns with a masked observation between them)."""
    engine = tiny_engine(256)
    samples = []
    for g in range(groups):
        prompt = [1 + (g * 11 + k) % 100 for k in range(12 + 3 * g)]
        for t in range(tries):

            def params(turn: int, g: int = g, t: int = t) -> SamplingParams:
                return SamplingParams(
                    temperature=1.0, seed=100 * g + 10 * t + turn, max_new_tokens=5 + t
                )

            turns = two_turns(engine, prompt, [3, 4, 5], params, f"r{g}{t}")
            reward = float((g + t) % 2) + 0.25 * t
            samples.append(TrainSample(*turns, reward, f"t{g}"))
    return samples


@pytest.mark.parametrize(
    "config", [LLAMA, tiny_model("qwen3", vocab_size=120)], ids=["llama", "qwen3"]
)
def test_a_prefix_tree_row_gives_each_trajectory_its_own_hidden_states_and_gradients(config):
    """Packed as prefix trees (a group's prompt once, its trajectories after it, with
    positions restarting and a mask), every scored position's hidden state is the one the
    trajectory gets run alone, and so are the gradients of a loss on them."""
    from pearl.live import packing

    samples = shared_prompt_samples()
    tree_model = GRPOTrainer(ModelSpec(config=config, seed=0)).model
    alone_model = GRPOTrainer(ModelSpec(config=config, seed=0)).model
    rows = packing.trees(samples, list(range(len(samples))), budget=10_000)
    assert [(p, len(m)) for p, m in rows] == [(12, 3), (15, 3)]  # one tree per task
    batch = packing.pack(samples, rows)
    # Each row holds its prompt once: shorter than its three trajectories end to end.
    assert batch.ids.shape[1] < sum(len(samples[i].token_ids) for i in rows[1][1])
    hidden = tree_model.forward_tree(batch.ids, batch.positions, batch.allowed)
    got = hidden[batch.rows, batch.cols]
    weights = torch.randn(got.shape, generator=torch.Generator().manual_seed(0))
    (got * weights).sum().backward()
    expected = []
    for i, t in zip(batch.sample.tolist(), batch.offsets.tolist(), strict=True):
        ids = torch.tensor([samples[i].token_ids])
        expected.append(alone_model.forward_dense(ids)[0, t - 1])
    alone = torch.stack(expected)
    torch.testing.assert_close(got, alone, rtol=1e-5, atol=1e-5)
    (alone * weights).sum().backward()
    for (n, pa), (_, pb) in zip(
        tree_model.named_parameters(), alone_model.named_parameters(), strict=True
    ):
        if pb.grad is None:  # the lm head: hidden states only
            assert pa.grad is None, n
            continue
        scale = float(pb.grad.abs().max())  # fp32 sums in another order: relative to it
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-4, atol=2e-6 * scale, msg=n)


def test_a_step_on_prefix_trees_equals_the_step_without_sharing(monkeypatch):
    """The step (loss, statistics, the clipped gradient AdamW applied) on prefix trees is
    the one without any shared prefix, whatever the micro-batch split."""
    from pearl.live import packing

    samples = shared_prompt_samples()
    batch = TrainBatch(0, len(samples), 0, 0, samples=tuple(samples))
    config = TrainerConfig(learning_rate=1e-3, micro_batch_tokens=48)
    shared = GRPOTrainer(ModelSpec(config=LLAMA, seed=0), config)
    # Each task's tree is split: its three trajectories do not fit 48 tokens at once.
    rows = packing.trees(samples, list(range(6)), 48)
    assert [p for p, _ in rows] == [12, 12, 15, 15]
    for p, members in rows:
        assert p + sum(len(samples[i].token_ids) - p for i in members) <= 48
    stats_shared = shared.train_step(batch)
    monkeypatch.setattr(packing, "common_prefix", lambda sequences: 0)
    plain = GRPOTrainer(ModelSpec(config=LLAMA, seed=0), TrainerConfig(learning_rate=1e-3))
    stats_plain = plain.train_step(batch)
    for key in ("loss", "grad_norm", "trained_tokens", "clip_fraction", "mean_ratio"):
        assert stats_shared[key] == pytest.approx(stats_plain[key], rel=1e-5, abs=1e-7), key
    for (n, pa), (_, pb) in zip(
        shared.model.named_parameters(), plain.model.named_parameters(), strict=True
    ):
        scale = float(pb.grad.abs().max())  # fp32 sums in another order: relative to it
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-4, atol=2e-6 * scale, msg=n)


def test_a_background_checkpoint_holds_the_weights_of_when_it_was_taken(tmp_path):
    """``save_async`` snapshots, then writes while training goes on: the folder holds the
    weights and counters of the moment it was called, not the later ones."""
    samples = rollout_samples()
    batch = TrainBatch(0, len(samples), 0, 0, samples=tuple(samples))
    config = TrainerConfig(learning_rate=1e-3)
    a = GRPOTrainer(ModelSpec(config=LLAMA, seed=0), config)
    a.train_step(batch)
    at_save = {n: p.detach().clone() for n, p in a.model.named_parameters()}
    a.save_async(tmp_path / "v1")
    a.train_step(batch)  # the weights move on while the checkpoint is written
    a.flush()
    assert not (tmp_path / "v1.tmp").exists()
    b = GRPOTrainer(ModelSpec(config=LLAMA, seed=1), config)
    b.load(tmp_path / "v1")
    assert b.version == 1
    for n, p in b.model.named_parameters():
        torch.testing.assert_close(p, at_save[n], rtol=0, atol=0, msg=n)
        assert not torch.equal(p, dict(a.model.named_parameters())[n]), n


def test_a_failed_background_write_raises_at_the_next_save(tmp_path):
    trainer = GRPOTrainer(ModelSpec(config=LLAMA, seed=0), TrainerConfig())
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    trainer.save_async(blocker / "v0")  # its parent is a file: the write fails
    with pytest.raises(CheckpointError, match=r"v0 \(weights v0\) could not be written"):
        trainer.flush()
    trainer.save(tmp_path / "v0")  # the trainer stays usable
    assert (tmp_path / "v0" / "optimizer" / "trainer.json").is_file()


def test_a_checkpoint_that_fills_the_disk_leaves_no_half_folder(tmp_path):
    """A checkpoint runs out of space half way (a tmpfs with room for one and a half): an
    ``OSError`` (ENOSPC) naming the checkpoint, no ``v1`` nor ``v1.tmp`` left behind, the
    previous checkpoint whole, and the trainer writes again once there is room."""
    trainer = GRPOTrainer(ModelSpec(config=LLAMA, seed=0), TrainerConfig())
    trainer.save(tmp_path / "size")
    size = sum(f.stat().st_size for f in (tmp_path / "size").rglob("*") if f.is_file())
    with small_disk(tmp_path / "disk", size=f"{size * 3 // 2 // 4096 * 4096}") as disk:
        trainer.save(disk / "v0")
        with pytest.raises(OSError, match=r"checkpoint .*v1 \(weights v0\) could not") as full:
            trainer.save(disk / "v1")
        assert full.value.errno == errno.ENOSPC
        assert sorted(p.name for p in disk.iterdir()) == ["v0"]
        again = GRPOTrainer(ModelSpec(config=LLAMA, seed=1), TrainerConfig())
        again.load(disk / "v0")  # whole
        for (name, a), (_, b) in zip(
            again.model.named_parameters(), trainer.model.named_parameters(), strict=True
        ):
            torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
        (disk / "v0" / "model.safetensors").unlink()  # room for one more
        trainer.save(disk / "v1")
        assert (disk / "v1" / "optimizer" / "trainer.json").is_file()


@pytest.mark.parametrize("updates", [(1, 1), (2, 2)], ids=["one-update", "epochs-mini-batches"])
def test_two_trainer_processes_take_the_same_steps_as_one(three_slots, tmp_path, updates):
    """FSDP2 over two Ray actors (gloo): each process trains on its share of the groups
    (three groups: one process gets two, the other pads with a zero-weight pass); the loss,
    the statistics and the updated weights equal one process's, step after step; a
    checkpoint the two write resumes in one process, and one process's resumes in two."""
    import asyncio

    from pearl.live.trainer_handle import LiveTrainer

    samples = shared_prompt_samples(groups=3, tries=3)
    batches = [TrainBatch(i, len(samples), 0, 0, samples=tuple(samples)) for i in range(2)]
    epochs, minis = updates  # several updates a step: each process scores the step's start
    config = TrainerConfig(
        learning_rate=1e-3, micro_batch_tokens=64, ppo_epochs=epochs, mini_batches=minis
    )
    one = GRPOTrainer(ModelSpec(config=LLAMA, seed=0), config)
    expected = [one.train_step(b) for b in batches]

    async def sharded(resume=None, steps=batches, save=None):
        trainer = LiveTrainer(ModelSpec(config=LLAMA, seed=0), config, processes=2)
        try:
            await trainer.start(resume)
            stats = [(await trainer.train_step(b)).stats for b in steps]
            version, weights = await trainer.weights_ref
            if save:
                await trainer.save(str(save))
            return stats, version, weights
        finally:
            trainer.kill()

    stats, version, weights = asyncio.run(sharded(save=tmp_path / "two"))
    assert version == one.version == 2
    for got, want in zip(stats, expected, strict=True):
        for key in ("loss", "grad_norm", "trained_tokens", "clip_fraction", "mean_ratio"):
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key
    for name, param in one.model.named_parameters():
        torch.testing.assert_close(torch.from_numpy(weights[name].copy()), param.detach(), msg=name)

    # the two processes' checkpoint in one process: the same weights and next step
    resumed = GRPOTrainer(ModelSpec(config=LLAMA, seed=1), config)
    resumed.load(tmp_path / "two")
    nxt = TrainBatch(2, len(samples), 0, 0, samples=tuple(samples))
    assert resumed.train_step(nxt)["loss"] == pytest.approx(one.train_step(nxt)["loss"], abs=1e-6)
    # one process's checkpoint in two
    one.save(tmp_path / "one")
    last = TrainBatch(3, len(samples), 0, 0, samples=tuple(samples))
    stats, version, _ = asyncio.run(sharded(resume=str(tmp_path / "one"), steps=[last]))
    assert version == 4
    assert stats[0]["loss"] == pytest.approx(one.train_step(last)["loss"], rel=1e-5, abs=1e-7)


def test_a_bfloat16_trainer_computes_in_bfloat16_and_keeps_float32_weights():
    """Mixed precision: the forward and backward in bfloat16 (autocast), the weights and
    AdamW's state in float32; the step's loss close to the float32 step's."""
    samples = shared_prompt_samples(groups=2, tries=3)
    batch = TrainBatch(0, len(samples), 0, 0, samples=tuple(samples))
    full = GRPOTrainer(ModelSpec(config=LLAMA, seed=0), TrainerConfig(learning_rate=1e-3))
    half = GRPOTrainer(
        ModelSpec(config=LLAMA, seed=0), TrainerConfig(learning_rate=1e-3, dtype="bfloat16")
    )
    a, b = full.train_step(batch), half.train_step(batch)
    assert b["loss"] == pytest.approx(a["loss"], rel=0.05, abs=1e-3)
    assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=0.05)
    assert {p.dtype for p in half.model.parameters()} == {torch.float32}
    for state in half.optimizer.state.values():
        assert state["exp_avg"].dtype == torch.float32
    with pytest.raises(ValueError, match="dtype"):
        TrainerConfig(dtype="float16")


def test_a_step_with_nothing_to_score_reports_no_ratio():
    samples = [dataclasses.replace(s, reward=1.0) for s in rollout_samples()]  # groups tie
    trainer = GRPOTrainer(ModelSpec(config=LLAMA, seed=0), TrainerConfig())
    stats = trainer.train_step(TrainBatch(0, len(samples), 0, 0, samples=tuple(samples)))
    assert stats["trained_tokens"] == 0 and math.isnan(stats["mean_ratio"])


def test_ppo_epochs_and_mini_batches_update_on_whole_groups_against_the_steps_start():
    """``ppo_epochs=2, mini_batches=2`` on three groups: four optimizer updates, on groups
    {t0, t1} then {t2}, twice; advantages from the whole batch; every update's ratio
    against the weights that started the step. Equal to those updates done by hand."""
    from pearl.live.grpo import advantages, mini_batches

    samples = shared_prompt_samples(groups=3, tries=3)
    batch = TrainBatch(0, len(samples), 0, 0, samples=tuple(samples))
    config = TrainerConfig(learning_rate=1e-3, ppo_epochs=2, mini_batches=2)
    trainer = GRPOTrainer(ModelSpec(config=LLAMA, seed=0), config)
    stats = trainer.train_step(batch)
    assert stats["updates"] == 4 and trainer.version == 1
    assert stats["trained_tokens"] == sum(sum(s.loss_mask) for s in samples)
    minis = mini_batches(samples, 2)
    assert [{samples[i].group for i in m} for m in minis] == [{"t0", "t1"}, {"t2"}]

    by_hand = GRPOTrainer(ModelSpec(config=LLAMA, seed=0), config)
    adv = advantages([s.reward for s in samples], [s.group for s in samples])
    start = by_hand.score(samples)
    for _ in range(2):
        for m in minis:
            by_hand.backward([samples[i] for i in m], [adv[i] for i in m], [start[i] for i in m])
            torch.nn.utils.clip_grad_norm_(by_hand.model.parameters(), config.max_grad_norm)
            by_hand.optimizer.step()
    one = GRPOTrainer(ModelSpec(config=LLAMA, seed=0), TrainerConfig(learning_rate=1e-3))
    one.train_step(batch)
    theirs, single = dict(by_hand.model.named_parameters()), dict(one.model.named_parameters())
    moved = 0.0
    for name, param in trainer.model.named_parameters():
        torch.testing.assert_close(param, theirs[name], msg=name)
        moved = max(moved, float((param - single[name]).abs().max()))
    assert moved > 1e-4  # four updates are not one


def test_mini_batches_are_whole_groups_and_no_more_than_the_groups():
    from pearl.live.grpo import mini_batches

    samples = [TrainSample((1, 2), (0, 1), (0.0, 0.0), 0.0, g) for g in "aabbbcdd"]
    assert mini_batches(samples, 1) == [list(range(8))]
    assert mini_batches(samples, 2) == [[0, 1, 2, 3, 4], [5, 6, 7]]
    assert mini_batches(samples, 9) == [[0, 1], [2, 3, 4], [5], [6, 7]]
