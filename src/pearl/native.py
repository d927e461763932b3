"""The simulated engine's hot modules compiled with mypyc, built when the package is installed.

A simulated run spends most of its time in a few pure-Python modules: the engine's
scheduler, sequences and block accounting, the simulator's block manager by runs, its token
runs, its worker loop and the cost model that prices each iteration (``MODULES``). mypyc
(mypy's compiler, https://mypyc.readthedocs.io) turns typed modules into C extensions with
the same behaviour: their classes become C structs, their calls C calls. The results are
the same to the bit (the golden digests, ``tests/test_native.py``); the time is not
(benchmarks/README, ``speed_machinery.py``).

The build is made as the package is installed, the way mypy ships its own: ``setup.py``'s
``build_py`` calls ``build`` (mypy, the compiler, is a build requirement in pyproject.toml),
which compiles a copy of the sources into ``pearl/_compiled/<interpreter>-<key>/`` inside
the installed package (``src/pearl`` for an editable install). The key hashes the modules'
sources and the interpreter, so an edited module, another Python or another machine type
finds no build and runs the Python modules until ``python -m pearl.native`` builds again.
The build sits beside the sources it was made from and is as trusted as they are; nothing
is compiled or loaded from a cache at run time.

A process uses the build only when started with ``PEARL_NATIVE=1`` and a build of its sources
exists: ``pearl.processes.env.simulation_env`` sets it for the processes PEARL starts for
simulations (``pearl simulate``'s and ``pearl plan``'s pool, Ray tasks, the benchmarks).
Everything else, the live engine included, runs the Python modules. ``PEARL_NATIVE=0`` keeps
simulations on them too, and at install time builds nothing. Building needs a C compiler
and Python's headers; without them the install goes on and simulations run Python.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)

ENV = "PEARL_NATIVE"
MODULES = (
    "pearl.token_runs",
    "pearl.engine.sequence",
    "pearl.engine.block_manager",
    "pearl.engine.scheduler",
    "pearl.sim.prefix_runs",
    "pearl.sim.worker",
    "pearl.sim.costmodel",
)
PACKAGE = Path(__file__).resolve().parent  # the pearl package's sources
BUILDS = "_compiled"  # the builds' folder inside the package
# C built beside them: CPython's arenas on huge pages (``huge_arenas.c``, loaded by
# ``activate`` where ``PEARL_HUGE_ARENAS=1``; ``pearl.processes.huge_pages`` says when).
ARENAS_SOURCE = "huge_arenas.c"
ARENAS_LIBRARY = "huge_arenas.so"
ARENAS_ENV = "PEARL_HUGE_ARENAS"
MANIFEST = "manifest.json"


class NativeBuildError(RuntimeError):
    """The compiled modules could not be built (what was missing, or the compiler's output)."""


def _source(module: str, package: Path = PACKAGE) -> Path:
    return package.joinpath(*module.split(".")[1:]).with_suffix(".py")


def build_key(package: Path = PACKAGE) -> str:
    """The build's name: a hash of the modules' sources and of the interpreter's ABI."""
    h = hashlib.sha256()
    h.update(f"{sys.version}|{sys.implementation.cache_tag}|{platform.machine()}".encode())
    h.update(str(sysconfig.get_config_var("EXT_SUFFIX")).encode())
    for module in MODULES:
        h.update(module.encode() + b"\0" + _source(module, package).read_bytes() + b"\0")
    h.update(ARENAS_SOURCE.encode() + b"\0" + (package / ARENAS_SOURCE).read_bytes())
    return h.hexdigest()[:16]


def build_dir(package: Path = PACKAGE) -> Path:
    """Where the build of ``package``'s sources for this interpreter lives (or would)."""
    return package / BUILDS / f"{sys.implementation.cache_tag}-{build_key(package)}"


def built(package: Path = PACKAGE) -> bool:
    """Whether a build of the current sources exists for this interpreter."""
    return (build_dir(package) / MANIFEST).is_file()


def _missing_tools() -> str | None:
    """What building needs and this environment lacks (None: nothing)."""
    if importlib.util.find_spec("mypyc") is None:
        return "mypyc is not installed (it comes with mypy: pip install mypy)"
    if importlib.util.find_spec("setuptools") is None:  # not in a venv since Python 3.12
        return "setuptools is not installed (mypyc builds with it: pip install setuptools)"
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler!r} is not on PATH)"
    include = sysconfig.get_paths()["include"]
    if not Path(include, "Python.h").is_file():
        return f"Python's C headers are missing ({include}/Python.h)"
    return None


def build(package: Path = PACKAGE, into: Path | None = None) -> Path:
    """Compile ``MODULES`` of ``package`` into ``into`` (default: ``package``; the install's
    package folder for a wheel) under ``_compiled/``, once per key, and remove this
    interpreter's older builds there; return the build's folder. Raises ``NativeBuildError``
    saying what is missing or how the compiler failed."""
    dest = build_dir(package)
    if into is not None:
        dest = into / dest.relative_to(package)
    if not (dest / MANIFEST).is_file():
        _compile(package, dest)
    for old in dest.parent.glob(f"{sys.implementation.cache_tag}-*"):
        if old != dest and not old.is_symlink() and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    return dest


def _compile(package: Path, dest: Path) -> None:
    """Compile ``package``'s ``MODULES`` and the arena library into ``dest``."""
    missing = _missing_tools()
    if missing:
        raise NativeBuildError(f"cannot build pearl's compiled modules: {missing}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pearl-native-") as tmp:
        # A copy of the package: mypyc type-checks the modules with what they import and
        # writes its extensions next to the sources it compiled.
        shutil.copytree(package, Path(tmp, "pearl"), ignore=_not_sources)
        Path(tmp, "mypy.ini").write_text(_MYPY_CONFIG)
        files = [str(_source(m, Path("pearl"))) for m in MODULES]
        run = subprocess.run(
            [sys.executable, "-m", "mypyc", *files],
            cwd=tmp,
            capture_output=True,
            text=True,
            env={**os.environ, "MYPY_CACHE_DIR": str(Path(tmp, ".mypy_cache"))},
        )
        if run.returncode != 0:
            tail = "\n".join((run.stdout + run.stderr).splitlines()[-30:])
            raise NativeBuildError(f"mypyc failed (exit {run.returncode}):\n{tail}")
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        staging = Path(tempfile.mkdtemp(prefix=f"{dest.name}.", dir=dest.parent))
        files_by_name = {}
        for so in Path(tmp).rglob(f"*{suffix}"):
            rel = so.relative_to(tmp)
            if rel.parts[0] == "build":
                continue  # mypyc's intermediate copies
            name = ".".join((*rel.parts[:-1], rel.name[: -len(suffix)]))
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(so, staging / rel)
            files_by_name[name] = str(rel)
        absent = [m for m in MODULES if m not in files_by_name]
        try:
            if absent:
                raise NativeBuildError(f"mypyc produced no extension for {', '.join(absent)}")
            arenas = _build_arenas(package / ARENAS_SOURCE, staging)
        except NativeBuildError:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        manifest = {"modules": files_by_name, "arenas": arenas}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1))
        try:
            staging.rename(dest)
        except OSError:  # another process built it first
            shutil.rmtree(staging, ignore_errors=True)


def _build_arenas(source: Path, dest: Path) -> str:
    """Compile the arena allocator into ``dest`` as a shared library; return its name."""
    name = ARENAS_LIBRARY
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    include = sysconfig.get_paths()["include"]
    run = subprocess.run(
        [*cc, "-O2", "-shared", "-fPIC", f"-I{include}", str(source), "-o", str(dest / name)],
        capture_output=True,
        text=True,
    )
    if run.returncode != 0:
        tail = "\n".join((run.stdout + run.stderr).splitlines()[-30:])
        raise NativeBuildError(f"compiling {source.name} failed (exit {run.returncode}):\n{tail}")
    return name


# The compiled modules' imports reach function-level imports of the model libraries: type-
# checking those took ~5 minutes and over 5 GB a build. They are not followed (typed Any): no
# compiled module uses them, and an install builds without them.
_SKIPPED = ("torch", "transformers", "safetensors", "gguf", "ray", "vllm")
_MYPY_CONFIG = "[mypy]\n" + "".join(
    f"[mypy-{p}.*]\nfollow_imports = skip\nignore_missing_imports = True\n" for p in _SKIPPED
)


def _not_sources(folder: str, names: list[str]) -> list[str]:
    return [n for n in names if n in ("__pycache__", BUILDS) or n.endswith((".so", ".pyd"))]


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the compiled modules (and the shared library they load) in a build."""

    def __init__(self, files: Mapping[str, Path]) -> None:
        self.files = dict(files)

    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        file = self.files.get(fullname)
        if file is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(file))
        return importlib.util.spec_from_file_location(fullname, file, loader=loader)


def native_env(environ: Mapping[str, str] | None = None, package: Path = PACKAGE) -> dict[str, str]:
    """``{PEARL_NATIVE: "1"}`` for a process that should simulate on the compiled modules:
    when a build of the current sources exists and the user did not set ``PEARL_NATIVE=0``."""
    env = os.environ if environ is None else environ
    if env.get(ENV) == "0":
        return {}
    if not built(package):
        log.info(
            "no compiled build of these sources (edited since install, or no C compiler): "
            "simulations run the Python modules; python -m pearl.native builds it"
        )
        return {}
    return {ENV: "1"}


def activate() -> bool:
    """With ``PEARL_NATIVE=1``, load ``MODULES`` from the build of the current sources
    (called by ``import pearl``, before any of them is imported). True if it will."""
    if os.environ.get(ENV) != "1" or any(isinstance(f, _Finder) for f in sys.meta_path):
        return False
    folder = build_dir()
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        log.warning("%s=1 but no build of these sources in %s: running Python", ENV, folder)
        return False
    sys.meta_path.insert(0, _Finder({m: folder / f for m, f in manifest["modules"].items()}))
    if os.environ.get(ARENAS_ENV) == "1" and manifest.get("arenas"):
        install_huge_arenas(folder / manifest["arenas"])
    return True


def install_huge_arenas(library: Path) -> bool:
    """Allocate CPython's arenas from now on on huge pages (``huge_arenas.c``, compiled into
    ``library`` by ``build``); True if installed. Any process may call it: it changes where
    objects live, never a result (the golden digests run with it, ``tests/test_native.py``)."""
    try:
        ctypes.PyDLL(str(library)).pearl_install_huge_arenas()
    except (OSError, AttributeError) as exc:
        log.warning(
            "%s=1 but the arena allocator could not load (%s): 4 KiB pages", ARENAS_ENV, exc
        )
        return False
    return True


def compiled(module: str) -> bool:
    """Whether the imported ``module`` is an extension (a compiled build), not source."""
    file = getattr(sys.modules.get(module), "__file__", None) or ""
    return file.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def main(argv: list[str] | None = None) -> int:
    """``python -m pearl.native``: build for the current sources (after an edit); print where."""
    del argv
    try:
        folder = build()
    except NativeBuildError as exc:
        print(f"[pearl] compiled modules not built: {exc}", file=sys.stderr)
        return 1
    print(f"[pearl] compiled modules: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
