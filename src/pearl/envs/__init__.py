"""Multi-turn environments with verifiable rewards, for live agentic RL (pure Python).

Environments come from installed packages (the ``pearl.envs`` entry-point group, which the
built-in ``calculator`` and ``guess`` use too) or from a ``package.module:Class`` path:
``pearl.envs.registry``. The protocol: ``pearl.envs.base`` and docs/environments.md.
"""

from pearl.envs.base import Environment, StepResult, split_seed
from pearl.envs.registry import installed_envs, make_env

__all__ = ["Environment", "StepResult", "installed_envs", "make_env", "split_seed"]
