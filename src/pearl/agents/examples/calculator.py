"""The calculator task as an agent program on the official ``openai`` SDK.

It knows nothing of PEARL: it gets a base URL, a key and a model name, offers the
``calculate`` tool as a JSON schema, runs the tool calls the model makes and returns its
reward. The task, prompt, tool and rewards are the built-in environment's
(``env.name: calculator`` with ``tool_format: json``), so the two train side by side on the
same seeds::

    pearl train env.name=agent env.options.agent=pearl.agents.examples.calculator:solve
"""

from __future__ import annotations

import json
from typing import Any

from pearl.envs.calculator import CalculatorEnv


async def solve(seed: int, client: Any, level: str = "medium", max_turns: int = 3) -> dict:
    """One episode: ``{"reward": r, "success": solved}``."""
    from openai import AsyncOpenAI

    env = CalculatorEnv(level=level, max_turns=max_turns, tool_format="json")
    messages: list[dict[str, Any]] = [{"role": "system", "content": env.system_prompt}]
    messages += [{"role": role, "content": text} for role, text in env.demonstration]
    messages.append({"role": "user", "content": await env.reset(seed)})
    async with AsyncOpenAI(base_url=client.base_url, api_key=client.api_key) as llm:
        while True:
            response = await llm.chat.completions.create(
                model=client.model, messages=messages, tools=env.tools
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
