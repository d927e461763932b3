"""PEARL: adaptive prefill-decode execution with elasticity for agentic RL rollout."""

__version__ = "0.1.0"
