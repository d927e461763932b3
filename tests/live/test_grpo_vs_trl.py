"""The trainer's loss variants against TRL's own arithmetic: on one fixed batch, our
``GRPOTrainer.backward`` and TRL's ``GRPOTrainer._compute_loss`` (trl 1.16.0, the real
package, the same tiny model's weights) give the same loss and the same gradient."""

import pytest
import torch
from tiny_model import tiny_chat_model

from pearl.control.interfaces import TrainSample
from pearl.live.grpo import advantages
from pearl.live.server import ModelSpec
from pearl.live.trainer import GRPOTrainer
from pearl.live.trainer_config import TrainerConfig

trl = pytest.importorskip("trl", reason="TRL is in the dev extra")

PROMPT = 5
LENGTHS = (8, 6, 8, 3)  # completion tokens of the four trajectories (two groups of two)
REWARDS, GROUPS = (1.0, 0.0, 0.25, 1.0), ("a", "a", "b", "b")
MAX_COMPLETION = 8

# (our loss_agg_mode, TRL's loss_type)
MODES = [
    ("token-mean", "bnpo"),
    ("seq-mean-token-mean", "grpo"),
    ("seq-mean-token-sum", "luspo"),
    ("seq-mean-token-sum-norm", "dr_grpo"),
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_chat_model(tmp_path_factory.mktemp("tiny"))


def batch(folder):
    """Four trajectories, their behaviour log-probabilities the model's own moved by up to
    +-0.4 (so some ratios leave the clip range on both sides)."""
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 256, (len(LENGTHS), PROMPT), generator=g)
    completions = [torch.randint(0, 256, (n,), generator=g) for n in LENGTHS]
    ours = GRPOTrainer(ModelSpec(folder=str(folder)), TrainerConfig())
    plain = [
        TrainSample(
            tuple(prompt[i].tolist() + c.tolist()),
            (0,) * PROMPT + (1,) * len(c),
            (0.0,) * (PROMPT + len(c)),
            REWARDS[i],
            GROUPS[i],
        )
        for i, c in enumerate(completions)
    ]
    own = ours.score(plain)
    samples = []
    for s, lps in zip(plain, own, strict=True):
        moved = [
            lp + float(torch.empty(1).uniform_(-0.4, 0.4, generator=g)) if m else 0.0
            for lp, m in zip(lps, s.loss_mask, strict=True)
        ]
        samples.append(TrainSample(s.token_ids, s.loss_mask, tuple(moved), s.reward, s.group))
    return prompt, completions, samples


def trl_trainer(folder, loss_type, clip, tmp_path):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
    from trl import GRPOConfig
    from trl import GRPOTrainer as TRLTrainer

    end = "<|im_end|>"
    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"), pad_token=end, eos_token=end
    )
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        per_device_train_batch_size=len(LENGTHS),
        num_generations=2,
        max_completion_length=MAX_COMPLETION,
        loss_type=loss_type,
        epsilon=clip[0],
        epsilon_high=clip[1],
        beta=0.0,
        temperature=1.0,
        report_to=[],
        use_cpu=True,
        bf16=False,
    )
    trainer = TRLTrainer(
        model=model,
        reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
        args=args,
        train_dataset=Dataset.from_list([{"prompt": "x"}] * len(LENGTHS)),
        processing_class=tok,
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def trl_inputs(prompt, completions, samples, adv):
    """TRL's batch: prompts, right-padded completions and their mask, the advantages and
    the behaviour log-probabilities (``old_per_token_logps``)."""
    n = len(samples)
    ids = torch.zeros(n, MAX_COMPLETION, dtype=torch.long)
    mask = torch.zeros(n, MAX_COMPLETION, dtype=torch.long)
    old = torch.zeros(n, MAX_COMPLETION)
    for i, (c, s) in enumerate(zip(completions, samples, strict=True)):
        ids[i, : len(c)] = c
        mask[i, : len(c)] = 1
        old[i, : len(c)] = torch.tensor(s.logprobs[PROMPT:])
    return {
        "prompt_ids": prompt,
        "prompt_mask": torch.ones_like(prompt),
        "completion_ids": ids,
        "completion_mask": mask,
        "advantages": torch.tensor(adv, dtype=torch.float32),
        "old_per_token_logps": old,
        "num_items_in_batch": mask.sum().float(),
    }


def trl_logps(theirs, inputs, entropy=False):
    """TRL's per-token log-probabilities (and entropies) of ``inputs``' completions."""
    return theirs._get_per_token_logps_and_entropies(
        theirs.model,
        torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1),
        torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1),
        MAX_COMPLETION,
        compute_entropy=entropy,
    )


def assert_same_gradients(ours, theirs):
    mine = dict(ours.model.named_parameters())
    for name, p in theirs.model.named_parameters():
        assert torch.allclose(mine[name].grad, p.grad, rtol=1e-4, atol=1e-6), name


@pytest.mark.parametrize("clip", [(0.2, 0.2), (0.2, 0.28)], ids=["symmetric", "clip-higher"])
@pytest.mark.parametrize("mode, loss_type", MODES, ids=[m for m, _ in MODES])
def test_each_loss_variant_equals_trls_loss_and_gradient(folder, tmp_path, mode, loss_type, clip):
    prompt, completions, samples = batch(folder)
    config = TrainerConfig(
        clip_eps=clip[0],
        clip_eps_high=clip[1],
        loss_agg_mode=mode,
        loss_norm_tokens=MAX_COMPLETION if mode == "seq-mean-token-sum-norm" else None,
    )
    ours = GRPOTrainer(ModelSpec(folder=str(folder)), config)
    got = ours.backward(samples)
    assert got["clipped"] > 0  # the batch exercises the clip
    adv = advantages(REWARDS, GROUPS)
    # The first completion token is predicted from the prompt's last: TRL scores it, and
    # so do we (loss_mask[1:] starts inside the prompt), so both see every completion token.
    theirs = trl_trainer(folder, loss_type, clip, tmp_path)
    loss = theirs._compute_loss(theirs.model, trl_inputs(prompt, completions, samples, adv))
    loss.backward()
    assert got["loss"] == pytest.approx(float(loss), rel=1e-5, abs=1e-7)
    assert_same_gradients(ours, theirs)


def test_advantage_variants_by_hand():
    rewards, groups = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0], ["a", "a", "a", "b", "b", "b"]
    mean, std = 1 / 3, (2 / 9) ** 0.5  # group a; group b ties
    grpo = advantages(rewards, groups)
    assert grpo[:3] == pytest.approx([(r - mean) / (std + 1e-6) for r in rewards[:3]])
    assert grpo[3:] == [0.0] * 3
    assert advantages(rewards, groups, scale="none")[:3] == pytest.approx([2 / 3, -1 / 3, -1 / 3])
    batch_std = (sum((r - 2 / 3) ** 2 for r in rewards) / 6) ** 0.5
    assert advantages(rewards, groups, scale="batch")[0] == pytest.approx(
        (2 / 3) / (batch_std + 1e-6)
    )
    # RLOO: the reward minus the mean of the others in its group
    assert advantages(rewards, groups, "rloo", "none") == pytest.approx(
        [1.0, -0.5, -0.5, 0.0, 0.0, 0.0]
    )
    with pytest.raises(ValueError, match="rloo"):
        advantages(rewards, groups, "rloo", "group")


def test_the_entropy_the_step_reports_is_trls(folder, tmp_path):
    """``metrics.jsonl``'s ``entropy``: the policy's mean entropy at the tokens trained on,
    as TRL computes it (``entropy_from_logits`` of the same logits)."""
    prompt, completions, samples = batch(folder)
    ours = GRPOTrainer(ModelSpec(folder=str(folder)), TrainerConfig())
    got = ours.backward(samples)
    theirs = trl_trainer(folder, "bnpo", (0.2, 0.2), tmp_path)
    inputs = trl_inputs(prompt, completions, samples, advantages(REWARDS, GROUPS))
    with torch.no_grad():
        _, entropies, _ = trl_logps(theirs, inputs, entropy=True)
    mask = inputs["completion_mask"].float()
    assert got["tokens"] == float(mask.sum())
    expected = float((entropies * mask).sum() / mask.sum())
    assert got["entropy_sum"] / got["tokens"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("corrected", [False, True], ids=["plain", "ratio-corrected"])
@pytest.mark.parametrize("mode, loss_type", MODES[:2], ids=[m for m, _ in MODES[:2]])
def test_the_kl_penalty_equals_trls_beta(folder, tmp_path, mode, loss_type, corrected):
    """``trainer.kl_coef`` with the k3 estimator is TRL's ``beta`` (and
    ``kl_ratio_correction`` its ``use_bias_correction_kl``): weights moved from the starting
    ones (the reference), the same loss and gradient as TRL given the reference's
    log-probabilities."""
    prompt, completions, samples = batch(folder)
    config = TrainerConfig(
        loss_agg_mode=mode, kl_coef=0.5, kl_estimator="k3", kl_ratio_correction=corrected
    )
    ours = GRPOTrainer(ModelSpec(folder=str(folder)), config)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # move the policy away from its reference
        for p in ours.model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    got = ours.backward(samples)
    assert got["kl_sum"] > 0
    theirs = trl_trainer(folder, loss_type, (0.2, 0.2), tmp_path)
    inputs = trl_inputs(prompt, completions, samples, advantages(REWARDS, GROUPS))
    with torch.no_grad():  # the reference: the starting weights, still in TRL's model
        ref, _, _ = trl_logps(theirs, inputs)
        state = {n: p.detach().clone() for n, p in ours.model.named_parameters()}
        theirs.model.load_state_dict(state, strict=False)
    theirs.beta = 0.5
    theirs.args.use_bias_correction_kl = corrected
    loss = theirs._compute_loss(theirs.model, {**inputs, "ref_per_token_logps": ref})
    loss.backward()
    assert got["loss"] == pytest.approx(float(loss), rel=1e-5, abs=1e-7)
    assert_same_gradients(ours, theirs)


def test_kl_estimators_by_hand():
    from pearl.live.grpo import kl_per_token

    lp, ref = torch.tensor([-1.0, -2.0, -0.5]), torch.tensor([-1.5, -1.0, -0.5])
    assert torch.allclose(kl_per_token(lp, ref, "k1"), lp - ref)
    d = ref - lp
    k3 = kl_per_token(lp, ref, "k3")
    assert torch.allclose(k3, d.exp() - d - 1) and (k3 >= 0).all() and k3[2] == 0
    with pytest.raises(ValueError, match="k1"):
        kl_per_token(lp, ref, "k2")


@pytest.mark.parametrize("mode, loss_type", MODES[:2], ids=[m for m, _ in MODES[:2]])
def test_recomputed_logprobs_with_truncated_importance_sampling_equal_trls(
    folder, tmp_path, mode, loss_type
):
    """``recompute_logprobs`` with ``tis_cap`` is TRL's vLLM importance-sampling correction
    (``token_truncate``): the ratio against the trainer's own log-probabilities, each token
    weighted by ``min(p_trainer / p_engine, cap)``; the step reports the mismatch."""
    prompt, completions, samples = batch(folder)
    cap = 1.2  # the engine's numbers are moved by up to +-0.4: some weights hit the cap
    config = TrainerConfig(loss_agg_mode=mode, recompute_logprobs=True, tis_cap=cap)
    ours = GRPOTrainer(ModelSpec(folder=str(folder)), config)
    got = ours.backward(samples)
    assert got["clipped"] == 0  # the ratio is 1 at the weights that start the step
    theirs = trl_trainer(folder, loss_type, (0.2, 0.2), tmp_path)
    inputs = trl_inputs(prompt, completions, samples, advantages(REWARDS, GROUPS))
    engine = inputs.pop("old_per_token_logps")
    with torch.no_grad():
        own, _, _ = trl_logps(theirs, inputs)
    mask = inputs["completion_mask"].bool()
    ratio = torch.exp(own - engine).clamp(max=cap)
    assert (ratio[mask] == cap).any() and (ratio[mask] < 1).any()
    theirs.use_vllm = theirs.vllm_importance_sampling_correction = True
    loss = theirs._compute_loss(theirs.model, {**inputs, "importance_sampling_ratio": ratio})
    loss.backward()
    assert got["loss"] == pytest.approx(float(loss), rel=1e-5, abs=1e-7)
    assert_same_gradients(ours, theirs)
    gap = (own - engine).abs()[mask]
    assert got["mismatch_sum"] / got["tokens"] == pytest.approx(float(gap.mean()), rel=1e-4)
    assert got["mismatch_max"] == pytest.approx(float(gap.max()), rel=1e-4)


@pytest.mark.parametrize("mode, loss_type", MODES[:2], ids=[m for m, _ in MODES[:2]])
def test_overlong_trajectories_masked_out_equal_trls_zeroed_completion_mask(
    folder, tmp_path, mode, loss_type
):
    """``mask_overlong``: a trajectory cut by the context cap leaves the loss (its group's
    advantages still count it), as TRL's loss with that completion's mask zeroed."""
    import dataclasses

    prompt, completions, samples = batch(folder)
    samples[1] = dataclasses.replace(samples[1], stop_reason="context_full")
    ours = GRPOTrainer(
        ModelSpec(folder=str(folder)), TrainerConfig(loss_agg_mode=mode, mask_overlong=True)
    )
    got = ours.backward(samples)
    assert got["overlong_masked"] == 1 and got["tokens"] == sum(LENGTHS) - LENGTHS[1]
    theirs = trl_trainer(folder, loss_type, (0.2, 0.2), tmp_path)
    inputs = trl_inputs(prompt, completions, samples, advantages(REWARDS, GROUPS))
    inputs["completion_mask"][1] = 0
    loss = theirs._compute_loss(theirs.model, inputs)
    loss.backward()
    assert got["loss"] == pytest.approx(float(loss), rel=1e-5, abs=1e-7)
    assert_same_gradients(ours, theirs)


@pytest.mark.parametrize("tis", [False, True], ids=["plain", "tis"])
@pytest.mark.parametrize("mode, loss_type", MODES[:2], ids=[m for m, _ in MODES[:2]])
def test_a_steps_later_update_takes_its_ratio_against_the_steps_start_as_trl(
    folder, tmp_path, mode, loss_type, tis
):
    """``ppo_epochs`` / ``mini_batches``: an update after the step's first takes the ratio
    against the log-probabilities of the weights that started the step (TRL's
    ``old_per_token_logps`` with ``num_iterations > 1``), and with ``recompute_logprobs``
    weights tokens by the truncated ratio of those to the engine's (TRL's
    ``importance_sampling_ratio``)."""
    prompt, completions, samples = batch(folder)
    cap = 1.2
    config = TrainerConfig(
        learning_rate=1e-2, loss_agg_mode=mode, ppo_epochs=2, recompute_logprobs=tis, tis_cap=cap
    )
    ours = GRPOTrainer(ModelSpec(folder=str(folder)), config)
    adv = advantages(REWARDS, GROUPS)
    start = ours.score(samples)
    ours.backward(samples, adv, start)
    ours._clip_and_step(0)  # the step's first update
    got = ours.backward(samples, adv, start)  # its second, on the moved weights
    assert got["clipped"] > 0 and abs(got["ratio_sum"] / got["tokens"] - 1) > 1e-3
    theirs = trl_trainer(folder, loss_type, (0.2, 0.2), tmp_path)
    inputs = trl_inputs(prompt, completions, samples, adv)
    engine = inputs.pop("old_per_token_logps")
    with torch.no_grad():
        before, _, _ = trl_logps(theirs, inputs)  # TRL's model still holds the start
        state = {n: p.detach().clone() for n, p in ours.model.named_parameters()}
        theirs.model.load_state_dict(state, strict=False)
    # The step's start as we scored it (TRL's own forward agrees to ~1e-6; given ours, the
    # comparison is of the arithmetic alone).
    ours_before = trl_inputs(
        prompt,
        completions,
        [
            TrainSample(s.token_ids, s.loss_mask, tuple(lp), s.reward, s.group)
            for s, lp in zip(samples, start, strict=True)
        ],
        adv,
    )["old_per_token_logps"]
    mask = inputs["completion_mask"].bool()
    assert torch.allclose(ours_before[mask], before[mask], atol=1e-5)
    before = inputs["old_per_token_logps"] = ours_before
    if tis:
        theirs.use_vllm = theirs.vllm_importance_sampling_correction = True
        inputs["importance_sampling_ratio"] = torch.exp(before - engine).clamp(max=cap)
    loss = theirs._compute_loss(theirs.model, inputs)
    loss.backward()
    assert got["loss"] == pytest.approx(float(loss), rel=1e-5, abs=1e-7)
    assert_same_gradients(ours, theirs)
