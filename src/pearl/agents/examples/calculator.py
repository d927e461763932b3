"""The calculator task as an agent program on the official ``openai`` SDK.

It knows nothing of PEARL: it gets a base URL, a key and a model name and returns its
reward. The task, prompts and rewards are the built-in environment's (``env.name:
calculator``), so the two train side by side on the same seeds, token for token:

- ``tool_format="json"`` (default): the agent offers ``calculate`` as a JSON-schema tool
  and runs the tool calls the model makes (the built-in's ``tool_format: json``);
- ``tool_format="tag"``: no tools; the model writes ``<calc>EXPR</calc>`` in its reply and
  the agent answers ``Result: N`` (the built-in's default). SmolLM2-135M never makes a JSON
  tool call (docs/environments.md), so this is the variant that learns in the default job::

    pearl train env.name=agent env.options.agent=pearl.agents.examples.calculator:solve
    pearl train env.name=agent env.options.agent=pearl.agents.examples.calculator:solve \\
        env.options.kwargs.tool_format=tag
"""

from __future__ import annotations

import json
from typing import Any

from pearl.envs.calculator import CalculatorEnv


async def solve(
    seed: int, client: Any, level: str = "medium", max_turns: int = 3, tool_format: str = "json"
) -> dict:
    """One episode: ``{"reward": r, "success": solved}``."""
    from openai import AsyncOpenAI  # live extra

    env = CalculatorEnv(level=level, max_turns=max_turns, tool_format=tool_format)
    tools = getattr(env, "tools", None)
    messages: list[dict[str, Any]] = [{"role": "system", "content": env.system_prompt}]
    messages += [{"role": role, "content": text} for role, text in env.demonstration]
    messages.append({"role": "user", "content": await env.reset(seed)})
    async with AsyncOpenAI(base_url=client.base_url, api_key=client.api_key) as llm:
        while True:
            offered = {"tools": tools} if tools else {}
            response = await llm.chat.completions.create(
                model=client.model, messages=messages, **offered
            )
            message = response.choices[0].message
            messages.append(message.model_dump(exclude_none=True))  # sent back as received
            if message.tool_calls:
                for call in message.tool_calls:
                    result = await env.call_tool(
                        call.function.name, json.loads(call.function.arguments)
                    )
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
                if env.turns >= env.max_turns:
                    return {"reward": 0.0, "success": False}
                continue
            step = await env.step(message.content or "")
            if step.done:
                return {"reward": step.reward, "success": env.success}
            messages.append({"role": "user", "content": step.observation})
