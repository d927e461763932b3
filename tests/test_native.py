"""The compiled engine (pearl.native): built per source version, loaded only where asked,
and the same results as the Python modules (the golden digests)."""

from __future__ import annotations

import ast
import configparser
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from pearl import native
from pearl.processes.env import simulation_env
from pearl.processes.huge_pages import huge_page_env

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


def _package_copy(dest: Path) -> Path:
    """A copy of the pearl package's sources with no build in it."""
    shutil.copytree(native.PACKAGE, dest, ignore=native._not_sources)
    return dest


def test_a_simulation_process_gets_the_compiled_engine_only_where_a_build_exists(tmp_path):
    copy = _package_copy(tmp_path / "pearl")
    assert native.native_env({}, copy) == {}  # nothing built for these sources
    folder = native.build_dir(copy)
    folder.mkdir(parents=True)
    (folder / native.MANIFEST).write_text('{"modules": {}}')
    assert native.native_env({}, copy) == {"PEARL_NATIVE": "1"}
    assert native.native_env({"PEARL_NATIVE": "0"}, copy) == {}  # the user's opt-out
    if native.built():
        env = {k: v for k, v in os.environ.items() if k != "PEARL_NATIVE"}
        assert simulation_env(env) == {**huge_page_env(env, arenas=True), "PEARL_NATIVE": "1"}


def test_an_edited_module_runs_python_until_built_again_and_a_build_replaces_its_elder(
    tmp_path,
):
    """Builds live in the package, one per interpreter: a new one removes the one it
    replaces (another interpreter's stays)."""
    copy = _package_copy(tmp_path / "pearl")
    for name in (f"{sys.implementation.cache_tag}-0123456789abcdef", "cpython-399-0123"):
        (copy / native.BUILDS / name).mkdir(parents=True)
    folder = native.build_dir(copy)
    folder.mkdir()
    (folder / native.MANIFEST).write_text('{"modules": {}}')  # "built": build returns it
    assert native.build(copy) == folder
    worker = native._source("pearl.sim.worker", copy)
    worker.write_text(worker.read_text() + "\n# an edit\n")
    assert not native.built(copy)


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
    _package_copy(tmp_path / "pearl")  # sources with no build beside them
    run = _python(CHECK, PEARL_NATIVE="1", PYTHONPATH=str(tmp_path))
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str([False] * len(native.MODULES))
    assert "no build of these sources" in run.stderr


def test_a_module_mypyc_rejects_fails_the_build_with_its_message(tmp_path):
    if native._missing_tools():
        pytest.skip(native._missing_tools())
    package = _package_copy(tmp_path / "pearl")
    runs = native._source("pearl.token_runs", package)
    runs.write_text(runs.read_text() + "\n\ndef broken() -> int:\n    return 'not an int'\n")
    with pytest.raises(native.NativeBuildError, match="Incompatible return value type"):
        native.build(package)
    assert not any((package / native.BUILDS).rglob("*.so"))


def test_the_compiled_modules_give_the_golden_digests(tmp_path):
    """Built as the package was installed (here where sources changed since), loaded by a
    process started with PEARL_NATIVE=1 (and CPython's arenas on huge pages, as
    simulation processes start), and the golden runs' records are bit for bit the Python
    modules' (tests/apps/test_golden.py)."""
    if native._missing_tools():
        pytest.skip(native._missing_tools())
    native.build()
    run = _python(CHECK, PEARL_NATIVE="1")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str([True] * len(native.MODULES))
    # A plugin that says, in the golden runs' own process, what ran them: which modules
    # were the compiled ones and whether the arena allocator's library was loaded.
    plugin = tmp_path / "what_ran.py"
    plugin.write_text(
        "import sys\n"
        "def pytest_sessionfinish(session):\n"
        "    from pearl import native\n"
        "    maps = open('/proc/self/maps').read()\n"
        "    compiled = [native.compiled(m) for m in native.MODULES]\n"
        "    arenas = native.ARENAS_LIBRARY in maps\n"
        "    print(f'WHAT RAN: compiled={compiled} arenas={arenas}')\n"
    )
    golden = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-v",
            "-s",
            "-p",
            "no:cacheprovider",
            "-p",
            "what_ran",
            str(ROOT / "tests" / "apps" / "test_golden.py"),
            "-k",
            "recorded_numbers",
        ],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "PEARL_NATIVE": "1",
            native.ARENAS_ENV: "1",
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])
            ),
        },
        cwd=ROOT,
        timeout=900,
    )
    assert golden.returncode == 0, golden.stdout[-3000:]
    assert "6 passed" in golden.stdout, golden.stdout[-3000:]
    expected = f"WHAT RAN: compiled={[True] * len(native.MODULES)} arenas=True"
    assert expected in golden.stdout, golden.stdout[-3000:]


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


@pytest.mark.slow
def test_a_wheel_carries_the_build_of_its_sources(tmp_path):
    """``pip wheel`` (as ``pip install`` builds one) runs setup.py's build step: the wheel
    holds the build for its sources and this interpreter, every module in it (~1-2 min)."""
    if native._missing_tools():
        pytest.skip(native._missing_tools())
    run = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (wheel,) = tmp_path.glob("pearl_rollout-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    build = native.build_dir().relative_to(native.PACKAGE.parent).as_posix()
    assert f"{build}/{native.MANIFEST}" in names, [n for n in names if "_compiled" in n]
    ext = str(sysconfig.get_config_var("EXT_SUFFIX"))
    for module in native.MODULES:
        assert f"{build}/{module.replace('.', '/')}{ext}" in names, module
    assert f"{build}/{native.ARENAS_LIBRARY}" in names
