"""PEARL: adaptive prefill-decode execution with elasticity for agentic RL rollout."""

import os as _os

__version__ = "0.1.0"

if _os.environ.get("PEARL_NATIVE") == "1":  # a simulation process: the compiled engine
    from pearl.native import activate as _activate

    _activate()
