"""mini-swe-agent, unmodified (``mini-swe-agent==2.4.6``, PEARL's ``swe`` extra), fixing
the shipped SWE-style tasks (``pearl.envs.swe_tasks``) in PEARL's sandbox::

    pearl train env.name=agent env.options.agent=pearl.agents.examples.mini_swe_agent:solve

Only its documented plug-in points are used. Its model is its own ``litellm_textbased``
model class pointed at PEARL's endpoint through its config (``model_kwargs.api_base``); its
commands run in the episode's sandbox through an environment of its ``Environment``
protocol (``SandboxEnvironment`` below: ``execute``, ``get_template_vars``, ``serialize``),
which ends the run with its ``Submitted`` exception on its submit sentinel, as its own
local environment does; its prompts and templates are its shipped ``mini_textbased.yaml``
(or a config file of yours: ``env.options.kwargs.config=path.yaml``). It resends its whole
history on every call, so the endpoint sees one conversation and trains its exact tokens.

The episode ends when the agent submits, reaches ``step_limit`` calls, stops on repeated
format errors, or PEARL ends it (``episode_timeout_s``, the run's turn and context
budgets). Then the task's hidden tests score the tree as it stands (``pearl.envs.swe``).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

from pearl.envs.sandbox import Sandbox, SandboxLimits
from pearl.envs.swe import SUBMIT, score_tree
from pearl.envs.swe_tasks import make_task

# mini-swe-agent prints a banner at import unless told not to, and litellm fetches its price
# list from the network at import unless told to use the copy it ships.
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


class SandboxEnvironment:
    """mini-swe-agent's ``Environment``: every action's command runs in ``sandbox``."""

    def __init__(self, sandbox: Sandbox, timeout_s: float) -> None:
        self.sandbox = sandbox
        self.config = {"timeout": timeout_s, "cwd": str(sandbox.root)}

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        from minisweagent.exceptions import Submitted

        result = self.sandbox.run(str(action.get("command", "")), timeout or self.config["timeout"])
        stopped = f"The command was stopped ({result.stopped})." if result.stopped else ""
        output = {
            "output": result.output,
            "returncode": -1 if result.returncode is None else result.returncode,
            "exception_info": stopped,
        }
        lines = result.output.lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT and result.returncode == 0:
            submission = "".join(lines[1:])
            raise Submitted(
                {
                    "role": "exit",
                    "content": submission,
                    "extra": {"exit_status": "Submitted", "submission": submission},
                }
            )
        return output

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        # The system facts its templates show ({{system}} ...); not the host's environment.
        return {**self.config, **platform.uname()._asdict(), **kwargs}

    def serialize(self) -> dict:
        return {"info": {"config": {"environment": self.config}}}


def solve(
    seed: int,
    client: Any,
    tier: int | None = None,
    step_limit: int = 10,
    config: str = "mini_textbased",
    command_timeout_s: float = 10.0,
    score_timeout_s: float = 60.0,
) -> dict:
    """One episode on task ``seed``: ``{"reward": share of hidden tests passed, "success":
    all passed}``. ``config``: a config shipped with mini-swe-agent (name) or a YAML file."""
    import yaml
    from minisweagent import package_dir
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.models import get_model

    path = (
        Path(config)
        if config.endswith((".yaml", ".yml"))
        else package_dir / "config" / f"{config}.yaml"
    )
    settings = yaml.safe_load(path.read_text())
    model_settings = dict(settings.get("model", {}))
    model_settings["model_kwargs"] = {
        **model_settings.get("model_kwargs", {}),
        "api_base": client.base_url,
        "api_key": client.api_key,
    }
    model = get_model(
        config={
            **model_settings,
            "model_name": f"openai/{client.model}",
            "model_class": "litellm_textbased",
            "cost_tracking": "ignore_errors",  # a local model has no price
        }
    )
    task = make_task(seed, tier)
    with Sandbox(task.files, SandboxLimits(wall_s=command_timeout_s)) as sandbox:
        agent = DefaultAgent(
            model,
            SandboxEnvironment(sandbox, command_timeout_s),
            **{**settings["agent"], "step_limit": step_limit, "output_path": None},
        )
        agent.run(f"{task.issue}\n\nReproduce it with: {task.visible_test}")
        reward, solved = score_tree(sandbox, task, score_timeout_s)
    return {"reward": reward, "success": solved}
