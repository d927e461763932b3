"""Loading a program's configuration: YAML, ``key=value`` overrides, validation errors that
name the key and list the valid ones, secrets redacted when written, annotated defaults."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from pearl.errors import ConfigError
from pearl.redaction import REDACTED, is_secret_key, redact_secrets, redacted_keys


class Section(BaseModel):
    # Override values are parsed as YAML, so `run_name=123` arrives as an int.
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)


def plain_run_name(cls, value: str | None) -> str | None:
    """A run name is a folder name, never a path (validator shared by the run configs)."""
    if value is not None and (not value or "/" in value or "\\" in value or value in (".", "..")):
        raise ValueError(f"run_name must be a plain folder name, got {value!r}")
    return value


def _parse_value(text: str) -> Any:
    """``key=value`` values are YAML scalars or lists (``[8C, 5P3D]``)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b=value`` overrides to a nested dict (a copy)."""
    out = copy.deepcopy(raw)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. cluster.tp=4)")
        key, value = item.split("=", 1)
        parts = key.strip().split(".")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
        node[parts[-1]] = _parse_value(value)
    return out


def load_config(
    model: type[BaseModel], path: str | Path | None, overrides: list[str] | None = None
):
    """Read a YAML config (or start from defaults), apply overrides, validate."""
    raw: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except FileNotFoundError as exc:
            raise ConfigError(f"config file {path} not found") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML ({exc})") from exc
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections")
    raw = apply_overrides(raw, overrides or [])
    secrets = redacted_keys(raw)
    if secrets:  # a run folder's config.yaml: its secrets were not saved
        raise ConfigError(
            f"{source}: {', '.join(secrets)} {'holds' if len(secrets) == 1 else 'hold'} "
            f"{REDACTED!r}: run folders keep no secrets; {_secrets_again(secrets)}"
        )
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"])
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                section = _section_of(model, err["loc"][:-1])
                valid = ", ".join(section.model_fields) if section else ""
                msg = f"unknown key; valid keys here: {valid}"
            shown = err.get("input")  # a secret is not echoed to the terminal
            if err["loc"] and is_secret_key(str(err["loc"][-1])):
                shown = REDACTED
            else:
                shown = redact_secrets(shown)
            lines.append(f"  {where}: {msg} (got {shown!r})")
        raise ConfigError(f"{source}: invalid configuration\n" + "\n".join(lines)) from None


def _secrets_again(secrets: list[str]) -> str:
    """How to give a run folder's redacted secrets again: as overrides, but the agent
    endpoint's key from the environment (``pearl.agents.plugin``), off the command line."""
    again = [f"{key}=..." if key != AGENT_KEY else f"{key}=null" for key in secrets]
    how = f"pass {'it' if len(secrets) == 1 else 'them'} again ({' '.join(again)}"
    if AGENT_KEY in secrets:
        how += f", the agent endpoint key exported as ${AGENT_KEY_ENV}: an override would show"
        how += " it to every local user"
    return how + ")"


AGENT_KEY, AGENT_KEY_ENV = "env.options.api_key", "PEARL_AGENT_API_KEY"  # pearl.agents.plugin


def _section_of(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    node: Any = model
    for part in loc:
        field = node.model_fields.get(part) if hasattr(node, "model_fields") else None
        if field is None:
            return None
        node = field.annotation
    return node if isinstance(node, type) and issubclass(node, BaseModel) else None


def dump_config(cfg: BaseModel) -> str:
    """A config as a run folder's ``config.yaml``: YAML, its secrets ``<redacted>``
    (``pearl.redaction``; ``load_config`` asks for them again)."""
    return yaml.safe_dump(redact_secrets(cfg.model_dump(mode="json")), sort_keys=False)


def annotated_defaults(model: type[BaseModel], title: str) -> str:
    """A config class's defaults as YAML, each key commented with what it means and its
    bounds: what ``pearl config show`` prints, a valid config file as it stands."""
    lines = [f"# {title}", "# Any key can be overridden on the command line as section.key=value."]
    defaults = redact_secrets(model().model_dump(mode="json"))

    def emit(cls: type[BaseModel], values: dict[str, Any], indent: str) -> None:
        for name, field in cls.model_fields.items():
            value = values[name]
            sub = field.annotation
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                lines.append("")
                lines.append(f"{indent}{name}:")
                emit(sub, value, indent + "  ")
                continue
            if not indent and len(lines) > 2:
                lines.append("")
            text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
            text = text.removesuffix("\n...").removesuffix("...").strip()
            note = "; ".join(x for x in (field.description or "", _bounds(field)) if x)
            lines.append(f"{indent}{name}: {text}" + (f"  # {note}" if note else ""))

    emit(model, defaults, "")
    return "\n".join(lines) + "\n"


def _bounds(field: Any) -> str:
    """A field's constraints in words (``>= 1, <= 64``; ``one of: mixed, sglang``)."""
    words = []
    for meta in field.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            bound = getattr(meta, attr, None)
            if bound is not None:
                words.append(f"{sign} {bound:g}" if isinstance(bound, float) else f"{sign} {bound}")
    choices = getattr(field.annotation, "__args__", ())
    if getattr(field.annotation, "__origin__", None) is Literal and choices:
        words.append("one of: " + ", ".join(map(str, choices)))
    return ", ".join(words)


def check_ray_address(value: str | None) -> str | None:
    """A Ray cluster address PEARL joins as a driver: ``auto`` or the head's host:port."""
    if value is None or value == "auto":
        return value
    if value.startswith("ray://"):
        raise ValueError(
            f"{value!r} is a Ray Client address, which PEARL does not use: run it on a node "
            "of the cluster with 'auto', or give the head's host:port (GCS port)"
        )
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} is not 'auto' or host:port (e.g. 10.0.0.1:6379)")
    return value
