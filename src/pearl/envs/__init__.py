"""Multi-turn environments with verifiable rewards, for live agentic RL (pure Python)."""

from pearl.envs.base import Environment, StepResult, split_seed


def make_env(name: str, **options) -> Environment:
    """A fresh environment by name: ``calculator`` or ``guess`` (options are its arguments)."""
    from pearl.envs.calculator import CalculatorEnv
    from pearl.envs.guess import GuessEnv

    kinds = {"calculator": CalculatorEnv, "guess": GuessEnv}
    if name not in kinds:
        raise ValueError(f"unknown environment {name!r}; choose one of {', '.join(kinds)}")
    try:
        return kinds[name](**options)
    except TypeError as exc:  # an unknown or missing option
        raise ValueError(f"environment {name!r}: {exc}") from None


__all__ = ["Environment", "StepResult", "make_env", "split_seed"]
