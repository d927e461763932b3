"""`pearl train` against TRL's GRPOTrainer on the same model, tasks and settings, in one run.

    .venv/bin/pip install 'trl==1.16.0'                 # TRL is only needed here
    .venv/bin/python benchmarks/train_vs_trl.py         # both tasks, 6 steps each, ~40 min
    .venv/bin/python benchmarks/train_vs_trl.py --task multi --steps 3 --only trl

What a user on one machine would otherwise pick: TRL's ``GRPOTrainer`` (generating with
transformers' ``generate``) on SmolLM2-135M-Instruct, against PEARL's live run (paged-KV
engine actors, GRPO trainer actor, asynchronous with staleness 1). Two tasks:

- ``single``: the single-turn calculator (``max_turns=1``: answer ``<answer>N</answer>``
  directly), TRL's plain prompt-completion path.
- ``multi``: the multi-turn calculator with a ``calculate`` tool called in JSON
  (``tool_format=json``, up to 2 tool turns, then the answer), TRL's recommended
  multi-turn path (``environment_factory``: an environment whose methods are the tools,
  ``max_tool_calling_iterations=2``). TRL needs a chat template it can parse tool calls
  with, and SmolLM2's has no tools: both systems get TRL's Qwen3 ChatML template
  (``trl.chat_template_utils.qwen3_chat_template``; SmolLM2 has the same ChatML tokens),
  so both render the same prompt with the same tool schema.

Both train with the same prompts (system prompt, worked example, question; ChatML), the
same reward (the environment's), ``tasks_per_step`` x ``group_size`` trajectories per
step, the same learning rate, sampling temperature, clip range, gradient clipping,
completion length (per turn; TRL's whole completion is capped at the turns' sum) and
constant learning rate, no KL term, fp32, and the whole machine (TRL: one process with
every core's torch thread; PEARL: its actors). Reported per system and task: trajectories
per second over the training steps (model loading and PEARL's held-out evaluation
excluded; PEARL over the same number of steps as TRL, and over all of its steps), seconds
per step, and the reward of every step against wall time. Goal (issue 21): PEARL at least
3x TRL's trajectories per second on both tasks, over the same steps.

Held-out success at equal wall-clock time (``--heldout N``, default 64; 0 skips it): PEARL
trains ``--pearl-steps`` steps (default 3x ``--steps``) with a checkpoint after each; the
model each system had after TRL's training time (TRL's final model; PEARL's last
checkpoint within that time) is scored on the same N held-out tasks by the same evaluator
(``pearl train run.steps=0``: PEARL's engine, the rollout temperature), and the untrained
model beside them. Writes ``results/train_vs_trl.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from pearl.apps.train.run import TrainRun
from pearl.config.train import load_train_config
from pearl.envs import make_env, split_seed
from pearl.models.catalog import resolve_model

MODEL = "smollm2-135m"
TASKS: dict[str, dict[str, Any]] = {
    "single": {"max_turns": 1},
    "multi": {"max_turns": 3, "tool_format": "json"},
}
TURN_TOKENS = 64  # per turn (PEARL's max_new_tokens; TRL caps the whole completion at the sum)


# Everything a run writes (model copies, run folders with a 1.6 GB checkpoint per step,
# TRL's outputs) goes under one folder, removed when the benchmark ends.
_SCRATCH: list[str] = []


def scratch(prefix: str) -> str:
    if not _SCRATCH:
        _SCRATCH.append(tempfile.mkdtemp(prefix="pearl-vs-trl-"))
    return tempfile.mkdtemp(prefix=prefix, dir=_SCRATCH[0])


def common(args) -> dict:
    return {
        "tasks_per_step": args.tasks,
        "group_size": args.group,
        "learning_rate": args.lr,
        "temperature": 0.7,
        "max_new_tokens": TURN_TOKENS,
        "clip_eps": 0.2,
        "max_grad_norm": 1.0,
        "steps": args.steps,
        "variant": args.variant,
    }


def variant(settings: dict, task: str) -> tuple[dict, list[str]]:
    """The loss variant on both sides: TRL's GRPOConfig fields and PEARL's overrides (the
    pairs `tests/live/test_grpo_vs_trl.py` checks give the same loss and gradient)."""
    if settings["variant"] == "default":  # TRL's defaults: dapo = our token-mean, group std
        return {}, []
    budget = settings["max_new_tokens"] * TASKS[task]["max_turns"]  # TRL's completion cap
    return {"loss_type": "dr_grpo", "scale_rewards": "none"}, [
        "trainer.loss_agg_mode=seq-mean-token-sum-norm",
        "trainer.scale_rewards=none",
        f"trainer.loss_norm_tokens={budget}",
    ]


def model_folder(task: str) -> Path:
    """SmolLM2's folder; for the multi-turn task a copy (links) whose chat template is TRL's
    Qwen3 ChatML template with tools, the one both systems then render prompts with."""
    folder = resolve_model(MODEL)
    if task == "single":
        return folder
    from trl.chat_template_utils import qwen3_chat_template

    copy = Path(scratch("smollm2-tools-"))
    for item in folder.iterdir():
        if item.name != "chat_template.jinja":
            (copy / item.name).symlink_to(item.resolve())
    (copy / "chat_template.jinja").write_text(qwen3_chat_template)
    return copy


def run_pearl(settings: dict, task: str, steps: int | None = None) -> dict:
    steps = steps or settings["steps"]
    overrides = [
        f"model.name={model_folder(task)}",
        "env.name=calculator",
        f"env.options={json.dumps(TASKS[task])}",
        f"rollout.tasks_per_step={settings['tasks_per_step']}",
        f"rollout.group_size={settings['group_size']}",
        f"rollout.max_new_tokens={settings['max_new_tokens']}",
        f"rollout.temperature={settings['temperature']}",
        f"trainer.learning_rate={settings['learning_rate']}",
        f"trainer.clip_eps={settings['clip_eps']}",
        f"trainer.max_grad_norm={settings['max_grad_norm']}",
        f"run.steps={steps}",
        "run.eval_tasks=0",
        "run.checkpoint_every=1",
        f"run.run_dir={scratch('pearl-run-')}",
        *variant(settings, task)[1],
    ]
    out = TrainRun(load_train_config(None, overrides)).run()
    run_dir = Path(out["run_dir"])
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trajectories = sum(r["trajectories"] for r in rows)
    seconds = out["train_seconds"]
    same = rows[: settings["steps"]]  # as many steps as TRL ran: the headline comparison
    return {
        "system": "pearl",
        "same_steps": {
            "steps": len(same),
            "trajectories": sum(r["trajectories"] for r in same),
            "train_seconds": same[-1]["elapsed_s"],
            "trajectories_per_s": sum(r["trajectories"] for r in same) / same[-1]["elapsed_s"],
        },
        "task": task,
        "turns_per_trajectory": sum(r["turns"] for r in rows) / trajectories,
        # Tool calls the environment ran, and replies with a malformed one (multi-turn).
        "tool_calls_per_trajectory": sum(r.get("tool_calls", 0) for r in rows) / trajectories,
        "malformed_tool_calls": sum(r.get("malformed_tool_calls", 0) for r in rows),
        "steps": len(rows),
        "trajectories": trajectories,
        "train_seconds": seconds,
        "trajectories_per_s": trajectories / seconds,
        "curve": [(r["elapsed_s"], r["reward_mean"]) for r in rows],
        # (seconds into training, checkpoint) after each step
        "checkpoints": [
            (r["elapsed_s"], str(run_dir / "checkpoints" / f"v{r['weight_version']}")) for r in rows
        ],
    }


def heldout_success(task: str, model: Path, tasks: int, resume: str | None = None) -> dict:
    """The held-out success of ``model`` (or of checkpoint ``resume`` on it) on the task's
    first ``tasks`` held-out seeds, by PEARL's evaluator (``run.steps=0``)."""
    overrides = [
        f"model.name={model}",
        "env.name=calculator",
        f"env.options={json.dumps(TASKS[task])}",
        f"rollout.max_new_tokens={TURN_TOKENS}",
        "run.steps=0",
        f"run.eval_tasks={tasks}",
        f"run.run_dir={scratch('pearl-eval-')}",
    ]
    out = TrainRun(load_train_config(None, overrides)).run(resume=resume)
    before = out["before"]
    return {k: before[k] for k in ("successes", "tasks", "success_rate", "ci95")}


def equal_time_heldout(task: str, trl: dict, pearl: dict, tasks: int) -> dict:
    """Held-out success of each system's model after TRL's training time, and untrained."""
    budget = trl["train_seconds"]
    within = [path for t, path in pearl["checkpoints"] if t <= budget]
    folder = model_folder(task)
    result = {
        "seconds": budget,
        "untrained": heldout_success(task, folder, tasks),
        "trl": {**heldout_success(task, Path(trl["model_dir"]), tasks), "steps": trl["steps"]},
        "pearl": {"steps": len(within)},
    }
    if within:
        result["pearl"].update(heldout_success(task, folder, tasks, resume=within[-1]))
    return result


def calculator_rows(tasks: int, task: str) -> list[dict]:
    """The training prompts PEARL's episodes start from, as conversations, with their seeds."""
    rows = []
    for index in range(tasks):
        env = make_env("calculator", **TASKS[task])
        seed = split_seed("train", index)
        question = asyncio.run(env.reset(seed))
        messages = [{"role": "system", "content": env.system_prompt}]
        messages += [{"role": r, "content": t} for r, t in env.demonstration]
        messages.append({"role": "user", "content": question})
        rows.append({"prompt": messages, "seed": seed})
    return rows


def calculator_reward(prompts, completions, seed, **_) -> list[float | None]:
    """The environment's reward for each completion's final message (TRL's reward-function
    signature; multi-turn completions end with the assistant's last reply)."""
    rewards: list[float | None] = []
    for completion, s in zip(completions, seed, strict=True):
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        env = make_env("calculator", **TASKS["single"])  # judges <answer>N</answer> alone
        asyncio.run(env.reset(int(s)))
        rewards.append(asyncio.run(env.step(text or "")).reward)
    return rewards


class TrlCalculator:
    """The multi-turn calculator for TRL's ``environment_factory``: its public methods are
    the tools (schema from the signature and docstring: the same ``calculate`` function the
    PEARL environment declares); the reward judges the final answer."""

    def reset(self, **row) -> None:
        return None

    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression (+ - * / and parentheses).

        Args:
            expression: e.g. 12 * 7
        """
        env = make_env("calculator", **TASKS["multi"])
        return asyncio.run(env.call_tool("calculate", {"expression": expression}))


def run_trl(settings: dict, threads: int, task: str, micro_batch: int = 0) -> dict:
    import torch
    from datasets import Dataset  # type: ignore[import-untyped]
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(threads)
    folder = model_folder(task)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    batch = settings["tasks_per_step"] * settings["group_size"]
    turns = TASKS[task]["max_turns"]
    # Task i of step k is train task k * tasks + i, as in PEARL's run.
    rows = calculator_rows(settings["tasks_per_step"] * settings["steps"], task)
    data = Dataset.from_list(rows)
    # A step's completions in micro-batches (gradient accumulation, still one optimizer step
    # and one generation of the whole batch per step): the multi-turn prompts' full-vocabulary
    # logits for 32 sequences at once take over 20 GiB, more than this machine has.
    micro = micro_batch or batch
    if batch % micro or micro % settings["group_size"]:
        raise ValueError(f"--trl-micro-batch {micro} must divide {batch} in whole groups")
    config = GRPOConfig(
        output_dir=scratch("trl-grpo-"),
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=batch // micro,
        num_generations=settings["group_size"],
        max_completion_length=settings["max_new_tokens"] * turns,
        max_tool_calling_iterations=turns - 1 if turns > 1 else None,
        temperature=settings["temperature"],
        top_p=1.0,
        learning_rate=settings["learning_rate"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        epsilon=settings["clip_eps"],
        max_grad_norm=settings["max_grad_norm"],
        beta=0.0,
        num_iterations=1,
        max_steps=settings["steps"],
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,  # its fastest setting: memory is not short here
        disable_tqdm=True,
        shuffle_dataset=False,
        dataloader_num_workers=0,
        seed=0,
        **variant(settings, task)[0],
    )
    curve: list[tuple[float, float]] = []
    calls: list[float] = []
    clock: dict[str, float] = {}

    class Timeline(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            clock["start"] = time.monotonic()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                curve.append((time.monotonic() - clock["start"], float(logs["reward"])))
            if logs and "tools/call_frequency" in logs:  # tool calls per trajectory
                calls.append(float(logs["tools/call_frequency"]))

        def on_train_end(self, args, state, control, **kwargs):
            clock["end"] = time.monotonic()

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=calculator_reward,
        args=config,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[Timeline()],
        environment_factory=TrlCalculator if task == "multi" else None,
    )
    trainer.train()
    seconds = clock["end"] - clock["start"]
    model_dir = scratch("trl-model-")
    trainer.save_model(model_dir)  # weights, config, tokenizer and chat template
    trajectories = settings["steps"] * batch
    return {
        "system": "trl",
        "task": task,
        "steps": settings["steps"],
        "trajectories": trajectories,
        "train_seconds": seconds,
        "trajectories_per_s": trajectories / seconds,
        "curve": curve,
        "tool_calls_per_trajectory": sum(calls) / len(calls) if calls else 0.0,
        "threads": threads,
        "model_dir": model_dir,
    }


def main() -> None:
    import shutil

    try:
        run(parse())
    finally:
        for folder in _SCRATCH:
            shutil.rmtree(folder, ignore_errors=True)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=("single", "multi", "both"), default="both")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--tasks", type=int, default=8, help="tasks per step")
    parser.add_argument("--group", type=int, default=4, help="trajectories per task")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--only", choices=("pearl", "trl"), default=None)
    parser.add_argument("--heldout", type=int, default=64, help="held-out tasks (0: skip)")
    parser.add_argument("--pearl-steps", type=int, default=None, help="default: 3x --steps")
    parser.add_argument(
        "--trl-micro-batch",
        type=int,
        default=0,
        help="TRL's per-device batch (gradient accumulation to the step's batch; 0: whole)",
    )
    parser.add_argument(
        "--variant",
        choices=("default", "dr_grpo"),
        default="default",
        help="the loss on both sides: each one's default (token-mean, group std) or Dr. GRPO "
        "(TRL loss_type dr_grpo, scale_rewards none = PEARL seq-mean-token-sum-norm, none)",
    )
    parser.add_argument("--out", default="results/train_vs_trl.json")
    return parser.parse_args()


def run(args: argparse.Namespace) -> None:
    settings = common(args)
    threads = os.cpu_count() or 1
    tasks = ["single", "multi"] if args.task == "both" else [args.task]
    results = []
    heldout = {}
    for task in tasks:
        if args.only in (None, "trl"):
            results.append(run_trl(settings, threads, task, args.trl_micro_batch))
        if args.only in (None, "pearl"):
            results.append(run_pearl(settings, task, args.pearl_steps or 3 * args.steps))
        if args.only is None and args.heldout:
            trl, pearl = results[-2], results[-1]
            heldout[task] = equal_time_heldout(task, trl, pearl, args.heldout)
    print()
    print("| task | system | steps | trajectories | train s | s / step | trajectories / s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in results:
        shown = [r] if "same_steps" not in r else [r["same_steps"], r]
        for x in shown:
            print(
                f"| {r['task']} | {r['system']} | {x['steps']} | {x['trajectories']} | "
                f"{x['train_seconds']:.1f} | {x['train_seconds'] / x['steps']:.1f} | "
                f"{x['trajectories_per_s']:.3f} |"
            )
    for r in results:
        points = ", ".join(f"{t:.0f}s: {v:.3f}" for t, v in r["curve"])
        print(f"{r['task']} {r['system']} reward vs wall time: {points}")
        if r["task"] == "multi":
            turns = (
                f"{r['turns_per_trajectory']:.2f} turns, " if "turns_per_trajectory" in r else ""
            )
            print(
                f"multi {r['system']}: {turns}{r['tool_calls_per_trajectory']:.2f} tool calls "
                "per trajectory"
            )
    for task in tasks:
        by = {r["system"]: r for r in results if r["task"] == task}
        if len(by) == 2:
            trl = by["trl"]["trajectories_per_s"]
            same = by["pearl"]["same_steps"]
            ratio, longer = (
                same["trajectories_per_s"] / trl,
                by["pearl"]["trajectories_per_s"] / trl,
            )
            mean = {s: statistics.fmean(v for _, v in by[s]["curve"]) for s in by}
            print(
                f"{task}: PEARL / TRL trajectories per second over the same {same['steps']} "
                f"steps {ratio:.2f}x (goal 3x), over PEARL's {by['pearl']['steps']} steps "
                f"{longer:.2f}x; mean reward over the steps: PEARL {mean['pearl']:.3f}, TRL "
                f"{mean['trl']:.3f}"
            )
    for task, h in heldout.items():
        print(f"{task}: held-out success after {h['seconds']:.0f} s of training (TRL's time):")
        for who in ("untrained", "trl", "pearl"):
            e = h[who]
            if "tasks" not in e:
                print(f"  {who}: no checkpoint within the time")
                continue
            steps = f" ({e['steps']} steps)" if "steps" in e else ""
            lo, hi = e["ci95"]
            print(
                f"  {who}{steps}: {e['successes']}/{e['tasks']} = "
                f"{100 * e['success_rate']:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"
            )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    payload = {"settings": settings, "results": results, "heldout": heldout}
    Path(args.out).write_text(json.dumps(payload, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
