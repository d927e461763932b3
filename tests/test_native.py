"""The compiled engine (pearl.native): built per source version, loaded only where asked,
and the same results as the Python modules (the golden digests)."""

from __future__ import annotations

import ast
import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pearl import native
from pearl.apps.huge_pages import huge_page_env
from pearl.apps.process_env import simulation_env

ROOT = Path(__file__).resolve().parents[1]


def _copy_sources(dest: Path) -> Path:
    for module in native.MODULES:
        src = native._source(module)
        target = native._source(module, dest)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, target)
    shutil.copy(native.PACKAGE / native.ARENAS_SOURCE, dest / native.ARENAS_SOURCE)
    return dest


def test_the_build_key_follows_the_sources(tmp_path):
    copy = _copy_sources(tmp_path / "pearl")
    assert native.build_key(copy) == native.build_key()
    worker = native._source("pearl.sim.worker", copy)
    worker.write_text(worker.read_text() + "\n# an edit\n")
    edited = native.build_key(copy)
    assert edited != native.build_key()
    arenas = copy / native.ARENAS_SOURCE
    arenas.write_text(arenas.read_text() + "\n/* an edit */\n")
    assert native.build_key(copy) not in (edited, native.build_key())


def test_a_simulation_process_gets_the_compiled_engine_only_where_a_build_exists(tmp_path):
    env = {"PEARL_CACHE": str(tmp_path)}
    assert native.native_env(env) == {}  # nothing built for these sources
    folder = native.build_dir(env)
    folder.mkdir(parents=True)
    (folder / native.MANIFEST).write_text('{"modules": {}}')
    assert native.native_env(env) == {"PEARL_NATIVE": "1"}
    assert native.native_env({**env, "PEARL_NATIVE": "0"}) == {}  # the user's opt-out
    assert simulation_env(env) == {**huge_page_env(env, arenas=True), "PEARL_NATIVE": "1"}


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
    )


CHECK = (
    "import pearl.sim.worker, pearl.sim.prefix_runs, pearl.sim.costmodel; from pearl import native; "
    "print(sorted(native.compiled(m) for m in native.MODULES))"
)


def test_without_a_build_a_process_asking_for_it_runs_python_and_says_so(tmp_path):
    run = _python(CHECK, PEARL_NATIVE="1", PEARL_CACHE=str(tmp_path))
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str([False] * len(native.MODULES))
    assert "no build of these sources" in run.stderr


def test_a_module_mypyc_rejects_fails_the_build_with_its_message(tmp_path):
    if native._missing_tools():
        pytest.skip(native._missing_tools())
    package = tmp_path / "pearl"
    shutil.copytree(native.PACKAGE, package, ignore=native._not_sources)
    runs = native._source("pearl.token_runs", package)
    runs.write_text(runs.read_text() + "\n\ndef broken() -> int:\n    return 'not an int'\n")
    with pytest.raises(native.NativeBuildError, match="Incompatible return value type"):
        native.build({"PEARL_CACHE": str(tmp_path / "cache")}, package)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.so"))


def test_the_compiled_modules_give_the_golden_digests():
    """Built here (once per source version; scripts/env.sh builds it ahead), loaded by a
    process started with PEARL_NATIVE=1 (and CPython's arenas on huge pages, as
    simulation processes start), and the golden runs' records are bit for bit the Python
    modules' (tests/apps/test_golden.py)."""
    if native._missing_tools():
        pytest.skip(native._missing_tools())
    native.build()
    run = _python(CHECK, PEARL_NATIVE="1")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str([True] * len(native.MODULES))
    golden = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-v",
            "-p",
            "no:cacheprovider",
            str(ROOT / "tests" / "apps" / "test_golden.py"),
            "-k",
            "recorded_numbers",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PEARL_NATIVE": "1", native.ARENAS_ENV: "1"},
        cwd=ROOT,
        timeout=900,
    )
    assert golden.returncode == 0, golden.stdout[-3000:]
    assert "2 passed" in golden.stdout, golden.stdout[-3000:]


_HUGE_MB = """
import re
keep = [[i, str(i)] for i in range(1_500_000)]  # ~300 MB of objects under 512 bytes
text = open("/proc/self/smaps_rollup").read()
print(int(re.search(r"AnonHugePages:\\s+(\\d+)", text).group(1)) // 1024)
"""


@pytest.mark.skipif(
    not huge_page_env(), reason="this host grants huge pages to every mapping, or to none"
)
def test_the_builds_arena_allocator_puts_cpythons_objects_on_huge_pages():
    """The real effect on this host (huge pages only on request): CPython's own allocator
    (no PYTHONMALLOC) keeps most of a heap of small objects on 2 MiB pages with the build's
    arena allocator, and almost none without it."""
    if native._missing_tools():
        pytest.skip(native._missing_tools())
    native.build()
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONMALLOC", "GLIBC_TUNABLES")}

    def huge_mb(**extra: str) -> int:
        out = subprocess.run(
            [sys.executable, "-c", "import pearl\n" + _HUGE_MB],
            env={**base, "PEARL_NATIVE": "1", **extra},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr
        assert "could not load" not in out.stderr, out.stderr
        return int(out.stdout)

    assert huge_mb(**{native.ARENAS_ENV: "1"}) > 60  # ~300 MB here (a kernel may find fewer)
    assert huge_mb() < 20


def _reachable_packages(modules: tuple[str, ...], src: Path) -> set[str]:
    """The top-level packages the modules' imports reach, through every pearl module they
    import (function-level imports too: mypy follows those), as mypyc's type check does."""

    def path_of(module: str) -> Path | None:
        base = src.joinpath(*module.split("."))
        for p in (base.with_suffix(".py"), base / "__init__.py"):
            if p.is_file():
                return p
        return None

    seen: set[str] = set()
    outside: set[str] = set()
    todo = list(modules)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # its packages' __init__
        path = path_of(module)
        if path is None:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            for name in names:
                if name.split(".")[0] == "pearl":
                    if path_of(name) is not None:
                        todo.append(name)
                else:
                    outside.add(name.split(".")[0])
    return outside - set(sys.stdlib_module_names) - {"__future__"}


def test_the_build_type_checks_no_model_library():
    """mypyc type-checks everything the compiled modules' imports reach; a library they
    reach but do not use (torch, through the model catalog) cost ~5 minutes a build until
    its build config skipped it. A package newly reached must be skipped or named here."""
    used = {"numpy", "mypy_extensions"}  # what the compiled modules type against
    reached = _reachable_packages(native.MODULES, native.PACKAGE.parent)
    assert "numpy" in reached  # the scan is not empty
    assert reached - used <= set(native._SKIPPED), reached - used - set(native._SKIPPED)
    config = configparser.ConfigParser()
    config.read_string(native._MYPY_CONFIG)
    for package in native._SKIPPED:
        assert config[f"mypy-{package}.*"]["follow_imports"] == "skip"
