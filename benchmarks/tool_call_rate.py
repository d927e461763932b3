"""How often the untrained model calls the calculator, per tool format: can RL start at all?

    .venv/bin/python benchmarks/tool_call_rate.py                 # 8 tasks x 8 samples each
    .venv/bin/python benchmarks/tool_call_rate.py --tasks 16 --samples 16 --model smollm2-135m

GRPO learns only what the policy already samples now and then: a group whose replies all
miss the tool gets no signal toward it. This samples first replies to the calculator
task's prompt (system, demonstration, task: exactly what ``pearl train`` prefills) at
temperature 1 and counts them by kind, for ``tool_format`` ``tag`` (``<calc>EXPR</calc>``)
and ``json`` (a ``<tool_call>`` JSON block, ``pearl.envs.tools``), and for ``json`` with
the call's opening and name written for the model (``json-named``, what constraining a call
to one function would give it), counting calls that parse against the tool's schema.
Transformers' ``generate`` on the packaged model; prints a table and writes
``results/tool_call_rate.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import Counter
from pathlib import Path

import torch

from pearl.envs.calculator import CalculatorEnv
from pearl.envs.tools import parse_tool_calls
from pearl.models.catalog import resolve_model
from pearl.models.chat import ChatFormat

NAMED = '<tool_call>\n{"name": "calculate", "arguments": '


def kind(reply: str, tools: list | None) -> str:
    if "<tool_call>" in reply:
        calls, _ = parse_tool_calls(reply, tools or [])
        return "tool call (parses)" if calls else "tool call (malformed)"
    if "<calc>" in reply:
        return "<calc>"
    return "<answer>" if "<answer>" in reply else "other"


def sample(model, chat, prompt: list[int], n: int, max_new: int) -> list[str]:
    x = torch.tensor([prompt] * n)
    with torch.no_grad():
        out = model.generate(
            x,
            attention_mask=torch.ones_like(x),
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=max_new,
            pad_token_id=chat.end_id,
            eos_token_id=chat.end_id,
        )
    return [
        chat.tokenizer.decode([i for i in row.tolist() if i != chat.end_id])
        for row in out[:, len(prompt) :]
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8, help="replies per task")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="results/tool_call_rate.json")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    torch.manual_seed(args.seed)
    folder = resolve_model(args.model)
    chat = ChatFormat.from_folder(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    table: dict[str, dict[str, int]] = {}
    for variant in ("tag", "json", "json-named"):
        env = CalculatorEnv(tool_format="tag" if variant == "tag" else "json")
        tools = getattr(env, "tools", None)
        counts: Counter[str] = Counter()
        for task in range(args.tasks):
            user = asyncio.run(env.reset(task))
            prompt = chat.prompt(env.system_prompt, user, env.demonstration, tools)
            head = NAMED if variant == "json-named" else ""
            prompt += chat.tokenizer.encode(head) if head else []
            for reply in sample(model, chat, prompt, args.samples, args.max_new_tokens):
                counts[kind(head + reply, tools)] += 1
        table[variant] = dict(counts)
    kinds = ["<calc>", "tool call (parses)", "tool call (malformed)", "<answer>", "other"]
    total = args.tasks * args.samples
    print(f"{args.model}: first replies to the calculator prompt, {total} per variant")
    print(f"{'variant':11s}" + "".join(f"{k:>23s}" for k in kinds))
    for variant, counts in table.items():
        print(f"{variant:11s}" + "".join(f"{counts.get(k, 0):>23d}" for k in kinds))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "counts": table}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
