"""The simulated engine's hot modules compiled with mypyc, for the processes that simulate.

A simulated run spends most of its time in a few pure-Python modules: the engine's
scheduler, sequences and block accounting, the simulator's block manager by runs, its token
runs, its worker loop and the cost model that prices each iteration (``MODULES``). mypyc
(mypy's compiler, https://mypyc.readthedocs.io) turns typed modules into C extensions with
the same behaviour: their classes become C structs, their calls C calls. The results are
the same to the bit (the golden digests, ``tests/test_native.py``); the time is not
(benchmarks/README, "ninth stop").

Nothing here changes the package's files. ``build()`` compiles a copy of the package's
sources into ``native/u<uid>/<key>`` under PEARL's cache (``$PEARL_CACHE``, default
``~/.cache/pearl``: ``pearl.models.catalog.cache_root``): a folder per user, so that users
sharing a cache each build and load their own, and a key that hashes the modules' sources
and the interpreter: an edited module, another Python or another machine type gets a build
of its own, and an out-of-date build is never loaded. A process
uses a build only when started with ``PEARL_NATIVE=1`` and a build for its sources exists:
``pearl.processes.env.simulation_env`` sets it for the processes PEARL starts for
simulations (``pearl simulate``'s and ``pearl plan``'s pool, Ray tasks, the benchmarks).
Everything else, the live engine included, runs the Python modules. ``PEARL_NATIVE=0``
keeps simulations on them too. Building needs mypy (the ``dev`` extra) and a C compiler;
``scripts/env.sh`` builds when both are there, ``python -m pearl.native`` on demand.

A build is code this process runs, so it is loaded only when no one else could have put
it there (``trusted_build``): the folder, every folder above it and every file it loads
belong to this user (or root, above the build) and are writable by no one else (a sticky
folder such as /tmp may be; above the build, so may a folder's group when that group is the
user's private group: ``_group_not_private``), the manifest names only the modules a build
holds (``MODULES``, mypyc's runtime library of them, the arena library), each at the path
``build`` gives it inside the folder, and no symlink is followed inside it. Anything else
is ignored with one warning, and the Python modules run (docs/cluster.md, "Shared
caches"); ``build`` checks the same of what it built, and fails saying why.
"""

from __future__ import annotations

import ctypes
import grp
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import platform
import pwd
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pearl.models import catalog

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
# C built beside them: CPython's arenas on huge pages (``huge_arenas.c``, loaded by
# ``activate`` where ``PEARL_HUGE_ARENAS=1``; ``pearl.processes.huge_pages`` says when).
ARENAS_SOURCE = "huge_arenas.c"
ARENAS_LIBRARY = "huge_arenas.so"
ARENAS_ENV = "PEARL_HUGE_ARENAS"
# mypyc's C runtime for a build of several modules, imported by each of them: named
# ``<20 hex digits of a hash of the modules' names>__mypyc``, at the top of the build.
_RUNTIME_LIBRARY = re.compile(r"[0-9a-f]{20}__mypyc")
MANIFEST = "manifest.json"
KEEP_BUILDS = 4  # the newest builds kept in the cache (~3 MB each)


class NativeBuildError(RuntimeError):
    """The compiled modules could not be built (what was missing, or the compiler's output)."""


class UntrustedBuild(RuntimeError):
    """A build folder this process will not run code from (what is wrong, and where)."""


@dataclass(slots=True, frozen=True)
class TrustedBuild:
    """A build checked by ``trusted_build``: its extension modules' files by module name,
    and its arena library's file (None: the build has none)."""

    folder: Path
    modules: dict[str, Path]
    arenas: Path | None


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    return catalog.cache_root(environ) / "native"


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


def build_dir(environ: Mapping[str, str] | None = None, package: Path = PACKAGE) -> Path:
    """This user's build of ``package``'s sources: ``native/u<uid>/<key>`` in the cache. The
    user's folder keeps users sharing a cache apart: each builds, loads and prunes its own."""
    return cache_root(environ) / f"u{os.getuid()}" / build_key(package)


def built(environ: Mapping[str, str] | None = None) -> bool:
    """Whether a build of the current sources exists (trusted or not: ``trusted_build``)."""
    return _has_manifest(build_dir(environ))


def _has_manifest(folder: Path) -> bool:
    """Whether ``folder`` holds a manifest; True where that cannot be read (someone else's
    folder on the way, in a shared cache), for the trust check to say why."""
    try:
        return (folder / MANIFEST).is_file()
    except OSError:
        return True


def _module_file(module: str) -> str | None:
    """Where ``build`` puts a module's extension inside its folder; None for a name that no
    build holds."""
    if module not in MODULES and not _RUNTIME_LIBRARY.fullmatch(module):
        return None
    return "/".join(module.split(".")) + str(sysconfig.get_config_var("EXT_SUFFIX"))


def _writable_by_others(mode: int) -> bool:
    return bool(mode & (stat.S_IWGRP | stat.S_IWOTH))


def _group_not_private(gid: int) -> str | None:
    """Why group ``gid`` is not this user's private group (None: it is). A private group is
    the user's primary group (this process's gid) with no one else in it: no other member
    listed in the group database, and no other user's primary group (Debian and Ubuntu
    give each user one, and a umask of 002, so folders made by pip are 0775)."""
    uid, primary = os.getuid(), os.getgid()
    if gid != primary:
        return f"gid {gid} is not this user's primary group (gid {primary})"
    try:
        group = grp.getgrgid(gid)
    except KeyError:
        return f"gid {gid} is not in the group database, so its members are unknown"
    users = pwd.getpwall()
    mine = {user.pw_name for user in users if user.pw_uid == uid}
    others = sorted(set(group.gr_mem) - mine)
    others += sorted(u.pw_name for u in users if u.pw_gid == gid and u.pw_uid != uid)
    if others:
        return f"group {group.gr_name} (gid {gid}) has other members: {', '.join(others)}"
    return None


def _check_ancestors(folder: Path) -> None:
    """Nobody else can rename or replace anything on the way to ``folder`` (resolved):
    each folder above it belongs to this user or root and is writable by no one else,
    unless sticky (/tmp: others may add entries there, not move or remove ours) or only
    group-writable with the user's private group as its group (``_group_not_private``)."""
    uid = os.getuid()
    for above in folder.parents:
        info = above.stat()
        if info.st_uid not in (uid, 0):
            raise UntrustedBuild(f"{above} (above the build) belongs to uid {info.st_uid}")
        if info.st_mode & stat.S_ISVTX or not _writable_by_others(info.st_mode):
            continue
        if info.st_mode & stat.S_IWOTH:
            raise UntrustedBuild(
                f"{above} (above the build) is writable by its group or others "
                f"(mode {stat.filemode(info.st_mode)}, and not sticky)"
            )
        why = _group_not_private(info.st_gid)
        if why is not None:
            raise UntrustedBuild(
                f"{above} (above the build) is writable by its group "
                f"(mode {stat.filemode(info.st_mode)}), which is not this user's own: {why}"
            )


def _check_owned(path: Path, kind: str) -> None:
    """``path`` is a ``kind`` ("file" or "folder", never a symlink) of this user's that no
    one else may write."""
    info = path.lstat()
    is_kind = stat.S_ISREG if kind == "file" else stat.S_ISDIR
    if not is_kind(info.st_mode):
        raise UntrustedBuild(f"{path} is not a plain {kind} ({stat.filemode(info.st_mode)})")
    if info.st_uid != os.getuid():
        raise UntrustedBuild(
            f"{path} belongs to uid {info.st_uid}, not to this user (uid {os.getuid()})"
        )
    if _writable_by_others(info.st_mode):
        raise UntrustedBuild(
            f"{path} is writable by its group or others (mode {stat.filemode(info.st_mode)})"
        )


def _checked_file(folder: Path, relative: object, expected: str, what: str) -> Path:
    """The file a manifest names for ``what``: exactly where ``build`` puts it (``expected``,
    relative to ``folder``), through folders of this user's, itself one."""
    if relative != expected:
        raise UntrustedBuild(
            f"{folder / MANIFEST} puts {what} at {relative!r}; a build puts it at {expected!r}"
        )
    path = folder
    for part in Path(expected).parts[:-1]:
        path = path / part
        _check_owned(path, "folder")
    _check_owned(folder / expected, "file")
    return folder / expected


def trusted_build(folder: Path) -> TrustedBuild:
    """The build in ``folder``, checked to be this user's own (the module's docstring says
    what is checked). Raises ``UntrustedBuild`` saying what is wrong, ``OSError`` (as
    ``FileNotFoundError``) where there is no build, ``ValueError`` for an unreadable one."""
    try:
        folder = folder.resolve(strict=True)
    except OSError:  # say so where someone else's folder on the way is why
        _check_ancestors(folder.resolve())
        raise
    _check_ancestors(folder)
    _check_owned(folder, "folder")
    _check_owned(folder / MANIFEST, "file")
    manifest = json.loads((folder / MANIFEST).read_text())
    listed = manifest.get("modules") if isinstance(manifest, dict) else None
    if not isinstance(listed, dict):
        raise ValueError(f"{folder / MANIFEST} has no 'modules' mapping")
    modules = {}
    for module, relative in listed.items():
        expected = _module_file(module)
        if expected is None:
            raise UntrustedBuild(
                f"{folder / MANIFEST} names module {module!r}, which no build holds "
                f"(only {', '.join(MODULES)} and mypyc's runtime library)"
            )
        modules[module] = _checked_file(folder, relative, expected, f"module {module!r}")
    arenas = None
    if "arenas" in manifest:
        arenas = _checked_file(folder, manifest["arenas"], ARENAS_LIBRARY, "the arena library")
    return TrustedBuild(folder, modules, arenas)


def _missing_tools() -> str | None:
    """What building needs and this environment lacks (None: nothing)."""
    if importlib.util.find_spec("mypyc") is None:
        return "mypyc is not installed (it comes with mypy: pip install 'pearl-rollout[dev]')"
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler!r} is not on PATH)"
    include = sysconfig.get_paths()["include"]
    if not Path(include, "Python.h").is_file():
        return f"Python's C headers are missing ({include}/Python.h)"
    return None


def build(environ: Mapping[str, str] | None = None, package: Path = PACKAGE) -> Path:
    """Compile ``MODULES`` into their cache folder (once per key); return the folder.
    Raises ``NativeBuildError`` saying what is missing, how the compiler failed, or why the
    build (an earlier one, or this one) would not be loaded (``trusted_build``)."""
    dest = build_dir(environ, package)
    if _has_manifest(dest):
        _check_built(dest, f"{dest} (this user's build of these sources)")
        return dest
    missing = _missing_tools()
    if missing:
        raise NativeBuildError(f"cannot build pearl's compiled modules: {missing}")
    catalog.make_cache_folders(dest.parent)
    try:  # before a minute of compiling: where the build would go is safe
        _check_ancestors(dest.parent.resolve() / dest.name)
    except UntrustedBuild as exc:
        raise NativeBuildError(
            f"a build in {dest} would not be loaded: {exc}. Build in a cache of your own "
            "(PEARL_CACHE)"
        ) from None
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
        if absent:
            shutil.rmtree(staging, ignore_errors=True)
            raise NativeBuildError(f"mypyc produced no extension for {', '.join(absent)}")
        try:
            arenas = _build_arenas(package / ARENAS_SOURCE, staging)
        except NativeBuildError:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        manifest = {"modules": files_by_name, "arenas": arenas}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1))
        _writable_by_owner_only(staging)
        try:
            staging.rename(dest)
        except OSError:  # another process built it first
            shutil.rmtree(staging, ignore_errors=True)
    _prune(dest.parent, keep=KEEP_BUILDS)
    _check_built(dest, f"built {dest}, but it")
    return dest


def _check_built(folder: Path, subject: str) -> None:
    """Raise ``NativeBuildError`` (``subject`` "will not be loaded", and why) if the build in
    ``folder`` would not be loaded: here, rather than as a warning in each simulation."""
    try:
        trusted_build(folder)
    except (UntrustedBuild, OSError, ValueError) as exc:
        raise NativeBuildError(
            f"{subject} will not be loaded: {exc}. Remove it if it is yours, or build in a "
            "cache of your own (PEARL_CACHE)"
        ) from None


def _writable_by_owner_only(folder: Path) -> None:
    """Clear the group's and others' write bits under ``folder``: a umask of 002 (common
    where each user has a group of their own) would leave the build refused when loaded."""
    for path in (folder, *folder.rglob("*")):
        mode = path.lstat().st_mode
        if not stat.S_ISLNK(mode):
            path.chmod(stat.S_IMODE(mode) & ~(stat.S_IWGRP | stat.S_IWOTH))


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


def _prune(root: Path, keep: int) -> None:
    """Remove all but the ``keep`` newest of this user's builds (one per source version
    built); other users' builds in a shared cache are theirs to prune."""
    uid = os.getuid()
    builds = sorted(
        (
            p
            for p in root.iterdir()
            if not p.is_symlink() and p.lstat().st_uid == uid and (p / MANIFEST).is_file()
        ),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in builds[keep:]:
        shutil.rmtree(old, ignore_errors=True)


# The compiled modules' imports reach function-level imports of the model libraries
# (pearl/__init__ -> pearl.native -> pearl.models.catalog, whose GGUF conversion imports torch
# and transformers): type-checking those took ~5 minutes and over 5 GB a build. They are not
# followed (typed Any): no compiled module uses them.
_SKIPPED = ("torch", "transformers", "safetensors", "gguf", "ray", "vllm")
_MYPY_CONFIG = "[mypy]\n" + "".join(f"[mypy-{p}.*]\nfollow_imports = skip\n" for p in _SKIPPED)


def _not_sources(folder: str, names: list[str]) -> list[str]:
    return [n for n in names if n == "__pycache__" or n.endswith((".so", ".pyd"))]


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the compiled modules (and the shared library they load) in a checked build."""

    def __init__(self, files: Mapping[str, Path]) -> None:
        self.files = dict(files)

    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        file = self.files.get(fullname)
        if file is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(file))
        return importlib.util.spec_from_file_location(fullname, file, loader=loader)


def native_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{PEARL_NATIVE: "1"}`` for a process that should simulate on the compiled modules:
    when a build of the current sources exists, is this user's own (``trusted_build``; else
    one warning here, not one per process) and the user did not set ``PEARL_NATIVE=0``."""
    env = os.environ if environ is None else environ
    if env.get(ENV) == "0" or not built(env):
        return {}
    try:
        trusted_build(build_dir(env))
    except (UntrustedBuild, OSError, ValueError) as exc:
        log.warning(_REFUSED, exc)
        return {}
    return {ENV: "1"}


_REFUSED = (
    "the compiled engine's build is not loaded, simulations run the Python modules: %s. "
    "Remove the build if it is yours (python -m pearl.native builds it again), or point "
    "PEARL_CACHE at a folder of your own"
)


def activate() -> bool:
    """With ``PEARL_NATIVE=1``, load ``MODULES`` from the build of the current sources
    (called by ``import pearl``, before any of them is imported). True if it will."""
    if os.environ.get(ENV) != "1" or any(isinstance(f, _Finder) for f in sys.meta_path):
        return False
    folder = build_dir()
    try:
        checked = trusted_build(folder)
    except UntrustedBuild as exc:
        log.warning(_REFUSED, exc)
        return False
    except (OSError, ValueError):
        log.warning("%s=1 but no build of these sources in %s: running Python", ENV, folder)
        return False
    sys.meta_path.insert(0, _Finder(checked.modules))
    if os.environ.get(ARENAS_ENV) == "1" and checked.arenas is not None:
        install_huge_arenas(checked.arenas)
    return True


def install_huge_arenas(library: Path) -> bool:
    """Allocate CPython's arenas from now on on huge pages (``huge_arenas.c``, compiled into
    ``library`` by ``build``; ``activate`` passes the one ``trusted_build`` checked); True if
    installed. Any process may call it: it changes where objects live, never a result (the
    golden digests run with it, ``tests/test_native.py``)."""
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
    """``python -m pearl.native [--if-possible]``: build for the current sources; print where."""
    args = sys.argv[1:] if argv is None else argv
    try:
        folder = build()
    except NativeBuildError as exc:
        print(f"[pearl] compiled engine not built: {exc}", file=sys.stderr)
        return 0 if "--if-possible" in args else 1
    print(f"[pearl] compiled engine: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
