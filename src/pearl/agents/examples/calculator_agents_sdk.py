"""The calculator task as an agent on the OpenAI Agents SDK (``openai-agents``, 0.24.0).

A second framework beside the plain ``openai`` SDK (``calculator.py``): the SDK's own agent
loop (``Runner.run``) calls the model through its chat-completions model class, runs the
``calculate`` function tool it declares from a typed Python function, and sends the
conversation back as it keeps it. It knows nothing of PEARL; only the client's base URL,
key and model name come from the endpoint. Task, system prompt, demonstration and rewards
are the built-in environment's (``env.name: calculator``, ``tool_format: json``); the tool's
schema is the one the SDK derives from the function (strict, no extra properties), so the
prompt is not token for token the built-in one. Tracing is off: it would post to OpenAI::

    pip install openai-agents==0.24.0      # or the agents-sdk extra
    pearl train env.name=agent \\
        env.options.agent=pearl.agents.examples.calculator_agents_sdk:solve
"""

from __future__ import annotations

from typing import Any

# At the top, so a missing package fails `pearl train` up front (env.options.agent), not
# every episode: pip install openai-agents==0.24.0 (the agents-sdk extra).
from agents import (
    Agent,
    MaxTurnsExceeded,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    function_tool,
)
from openai import AsyncOpenAI

from pearl.envs.calculator import CalculatorEnv


async def solve(seed: int, client: Any, level: str = "medium", max_turns: int = 3) -> dict:
    """One episode: ``{"reward": r, "success": solved}``."""
    env = CalculatorEnv(level=level, max_turns=max_turns, tool_format="json")

    @function_tool
    async def calculate(expression: str) -> str:
        """Evaluate an arithmetic expression (+ - * / and parentheses).

        Args:
            expression: e.g. 12 * 7
        """
        return await env.call_tool("calculate", {"expression": expression})

    history: list[Any] = [{"role": role, "content": text} for role, text in env.demonstration]
    history.append({"role": "user", "content": await env.reset(seed)})
    async with AsyncOpenAI(base_url=client.base_url, api_key=client.api_key) as llm:
        agent = Agent(
            name="calculator",
            instructions=env.system_prompt,
            tools=[calculate],
            model=OpenAIChatCompletionsModel(model=client.model, openai_client=llm),
        )
        while True:
            left = env.max_turns - env.turns
            try:
                result = await Runner.run(
                    agent, history, max_turns=left, run_config=RunConfig(tracing_disabled=True)
                )
            except MaxTurnsExceeded:
                return {"reward": 0.0, "success": False}
            step = await env.step(str(result.final_output or ""))
            if step.done:
                return {"reward": step.reward, "success": env.success}
            history = [*result.to_input_list(), {"role": "user", "content": step.observation}]
