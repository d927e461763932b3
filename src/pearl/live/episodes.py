"""Text environments as token-level episodes: the model's reply is decoded for the
environment, its observation encoded in ChatML for the model."""

from __future__ import annotations

import time

from pearl.envs.base import Environment
from pearl.models.chat import ChatFormat


class TextEpisode:
    """One trajectory of ``env`` on task ``seed``; ``group`` names the task (GRPO groups)."""

    def __init__(self, env: Environment, seed: int, chat: ChatFormat, group: str) -> None:
        self.env = env
        self.seed = seed
        self.chat = chat
        self.group = group
        self.env_seconds: list[float] = []  # per environment call

    async def start(self) -> list[int]:
        t0 = time.perf_counter()
        first = await self.env.reset(self.seed)
        self.env_seconds.append(time.perf_counter() - t0)
        return self.chat.prompt(self.env.system_prompt, first, self.env.demonstration)

    async def respond(self, reply: list[int]) -> tuple[list[int], float, bool]:
        t0 = time.perf_counter()
        result = await self.env.step(self.chat.text(reply))
        self.env_seconds.append(time.perf_counter() - t0)
        if result.done:
            return [], result.reward, True
        return self.chat.next_turn(reply, result.observation), result.reward, False

    @property
    def success(self) -> bool:
        return self.env.success
