"""Agents written against the OpenAI SDK, to train with ``env.name: agent``."""
