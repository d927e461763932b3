"""mini-swe-agent, unmodified (``mini-swe-agent==2.4.6``, PEARL's ``swe`` extra), fixing
the shipped SWE-style tasks (``pearl.envs.swe_tasks``) in PEARL's sandbox::

    pearl train env.name=agent env.options.agent=pearl.agents.examples.mini_swe_agent:solve

Only its documented plug-in points are used. Its model is its own ``litellm_textbased``
model class pointed at PEARL's endpoint through its config (``model_kwargs.api_base``); its
commands run in the episode's sandbox through an environment of its ``Environment``
protocol (``SandboxEnvironment`` below: ``execute``, ``get_template_vars``, ``serialize``),
which ends the run with its ``Submitted`` exception on its submit sentinel, as its own
local environment does. Its settings are its config keys: PEARL's by default (the prompt
and action format of ``pearl.envs.swe``, sized for a small model), its shipped
``mini_textbased.yaml`` (``env.options.kwargs.config=mini_textbased``) or a YAML file.

It resends its whole history on every call, so the endpoint sees one conversation and
trains its exact tokens; a reply it cannot parse is left out of the history it resends (it
keeps only its format-error message), so the next call starts a new segment and the
rejected reply is trained as a sample of its own.

The episode ends when the agent submits, reaches ``step_limit`` calls, stops on repeated
format errors, or PEARL ends it (``episode_timeout_s``, the run's turn and context
budgets). Then the task's hidden tests score the tree as it stands (``pearl.envs.swe``).
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import platform
from pathlib import Path
from typing import Any

import yaml

from pearl.agents.endpoint import NO_KEY
from pearl.envs.sandbox import Sandbox, SandboxLimits
from pearl.envs.swe import ACTION_REGEX, DEMONSTRATION, SYSTEM_PROMPT, is_submission, score_tree
from pearl.envs.swe_tasks import make_task

# Named before a run starts (env.options.agent is imported then), not at the first episode.
if importlib.util.find_spec("minisweagent") is None:
    raise ModuleNotFoundError(
        "mini-swe-agent is not installed: pip install 'pearl-rollout[swe]' (mini-swe-agent==2.4.6)",
        name="minisweagent",
    )

# mini-swe-agent prints a banner at import unless told not to, and litellm fetches its price
# list from the network at import unless told to use the copy it ships.
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# Its model retries a failed call 10 times, waiting 4-60 s between tries; PEARL's endpoint
# fails a call only when the episode is over (a budget, a timeout), so one retry is plenty
# and the agent's thread (with its sandbox) ends seconds after its episode.
os.environ.setdefault("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "2")


class SandboxEnvironment:
    """mini-swe-agent's ``Environment``: every action's command runs in ``sandbox``."""

    def __init__(self, sandbox: Sandbox, timeout_s: float) -> None:
        self.sandbox = sandbox
        self.config = {"timeout": timeout_s, "cwd": sandbox.cwd}  # the path commands see

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        from minisweagent.exceptions import Submitted  # optional

        result = self.sandbox.run(str(action.get("command", "")), timeout or self.config["timeout"])
        stopped = f"The command was stopped ({result.stopped})." if result.stopped else ""
        output = {
            "output": result.output,
            "returncode": -1 if result.returncode is None else result.returncode,
            "exception_info": stopped,
        }
        if is_submission(result):  # its local environment's rule, shared with env.name=swe
            submission = (
                result.output.lstrip().split("\n", 1)[1] if "\n" in result.output.lstrip() else ""
            )
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


# PEARL's settings for mini-swe-agent (``config="pearl"``): its config keys, PEARL's SWE
# environment's prompt and action format (``pearl.envs.swe``), short enough for a small
# model's context; the worked example is text in the task message (its templates have no
# assistant turns).
PEARL_SETTINGS: dict[str, Any] = {
    "agent": {
        "system_template": SYSTEM_PROMPT,
        "instance_template": "Example:\n"
        + "\n".join(f"[{role}] {text}" for role, text in DEMONSTRATION)
        + "\n\nYour task:\n{{task}}",
    },
    "model": {
        "action_regex": ACTION_REGEX,
        "format_error_template": "Reply with exactly one command in a ```bash block "
        "(your reply had {{actions|length}}).",
        "observation_template": "<returncode>{{output.returncode}}</returncode>\n"
        "{% if output.exception_info %}<stopped>{{output.exception_info}}</stopped>\n{% endif %}"
        "<output>\n{% if output.output | length > 2000 %}{{output.output[:1000]}}\n"
        "[... {{output.output | length - 2000}} characters left out ...]\n"
        "{{output.output[-1000:]}}{% else %}{{output.output}}{% endif %}\n</output>",
    },
}


def solve(
    seed: int,
    client: Any,
    tier: int | None = None,
    step_limit: int = 10,
    config: str = "pearl",
    command_timeout_s: float = 10.0,
    score_timeout_s: float = 60.0,
    trajectories: str | None = None,
) -> dict:
    """One episode on task ``seed``: ``{"reward": share of hidden tests passed, "success":
    all passed}``. ``config``: ``pearl`` (``PEARL_SETTINGS``), a config shipped with
    mini-swe-agent (``mini_textbased``, its text-action default) or a YAML file of yours;
    ``trajectories``: a folder where mini-swe-agent saves each episode's messages (its
    ``output_path``, one ``<seed>-<n>.traj.json`` per episode; the endpoint's key, if the run
    has one, is blanked out of it at the end)."""
    import litellm  # optional (swe)
    from minisweagent.agents.default import DefaultAgent  # optional
    from minisweagent.models import get_model

    # litellm prints a provider-list banner each time it prices a model it does not know.
    litellm.suppress_debug_info = True
    settings = _settings(config)
    model_settings = dict(settings.get("model", {}))
    model_settings["model_kwargs"] = {
        **model_settings.get("model_kwargs", {}),
        "api_base": client.base_url,
        "api_key": client.api_key,
        "num_retries": 0,  # litellm's own retries, under its model's
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
    saved = _path(trajectories, seed)
    try:
        with Sandbox(task.files, SandboxLimits(wall_s=command_timeout_s)) as sandbox:
            agent = DefaultAgent(
                model,
                SandboxEnvironment(sandbox, command_timeout_s),
                **{**settings["agent"], "step_limit": step_limit, "output_path": saved},
            )
            agent.run(task.issue)  # it ends with the command that shows the failure
            reward, solved = score_tree(sandbox, task, score_timeout_s)
    finally:
        if saved is not None and client.api_key != NO_KEY and saved.exists():
            saved.write_text(saved.read_text().replace(client.api_key, "<endpoint key>"))
    return {"reward": reward, "success": solved}


def _settings(config: str) -> dict[str, Any]:
    """``PEARL_SETTINGS``, one of mini-swe-agent's shipped configs by name, or a YAML file."""
    from minisweagent import package_dir  # optional

    if config == "pearl":
        return PEARL_SETTINGS
    if config.endswith((".yaml", ".yml")):
        path = Path(config)
    else:
        path = package_dir / "config" / f"{config}.yaml"
    if not path.is_file():
        shipped = sorted(p.stem for p in (package_dir / "config").glob("*.yaml"))
        raise ValueError(
            f"config {config!r}: no such file; give 'pearl', a config mini-swe-agent ships "
            f"({', '.join(shipped)}) or a .yaml file"
        )
    return yaml.safe_load(path.read_text())


def _path(folder: str | None, seed: int) -> Path | None:
    """A new file for one episode's trajectory in ``folder`` (None: not saved); episodes of
    the same task (a GRPO group) run at once, so each claims its own name."""
    if folder is None:
        return None
    Path(folder).mkdir(parents=True, exist_ok=True)
    for n in itertools.count():
        path = Path(folder) / f"{seed}-{n}.traj.json"
        try:
            with open(path, "x"):
                return path
        except FileExistsError:
            continue
    raise AssertionError("unreachable")
