"""The compiled engine (pearl.native): built per source version, loaded only where asked,
and the same results as the Python modules (the golden digests)."""

from __future__ import annotations

import ast
import configparser
import grp
import json
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from pearl import native
from pearl.models import catalog
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


def test_a_simulation_process_gets_the_compiled_engine_only_where_a_build_exists(tmp_path):
    env = {"PEARL_CACHE": str(tmp_path)}
    assert native.native_env(env) == {}  # nothing built for these sources
    folder = native.build_dir(env)
    folder.mkdir(parents=True)
    (folder / native.MANIFEST).write_text('{"modules": {}}')
    assert native.native_env(env) == {"PEARL_NATIVE": "1"}
    assert native.native_env({**env, "PEARL_NATIVE": "0"}) == {}  # the user's opt-out
    assert simulation_env(env) == {**huge_page_env(env, arenas=True), "PEARL_NATIVE": "1"}


# A shared library that, once loaded, leaves a mark: what a build planted by someone else
# would run in our process.
_PLANTED_C = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
    const char *mark = getenv("PLANTED_MARK");
    FILE *f = mark ? fopen(mark, "w") : NULL;
    if (f) { fputs("planted code ran", f); fclose(f); }
}
"""
EXT = str(sysconfig.get_config_var("EXT_SUFFIX"))


@pytest.fixture
def planted(tmp_path) -> Path:
    """A compiled library of foreign code, outside any cache."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()
    if shutil.which(compiler[0]) is None:
        pytest.skip(f"no C compiler ({compiler[0]!r})")
    source = tmp_path / "planted.c"
    source.write_text(_PLANTED_C)
    library = tmp_path / "planted.so"
    subprocess.run([*compiler, "-shared", "-fPIC", str(source), "-o", str(library)], check=True)
    return library


def _plant_build(cache: Path, manifest: dict, library: Path) -> Path:
    """A build folder of the current sources, laid out by hand: the manifest, and the
    library copied to each relative path the manifest names (modules and arenas)."""
    folder = native.build_dir({"PEARL_CACHE": str(cache)})
    folder.mkdir(parents=True)
    named = [*manifest.get("modules", {}).values(), manifest.get("arenas")]
    for relative in named:
        if isinstance(relative, str) and not Path(relative).is_absolute():
            (folder / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(library, folder / relative)
    (folder / native.MANIFEST).write_text(json.dumps(manifest))
    return folder


def _origins(cache: Path, mark: Path, modules: list[str], **env: str) -> list[str]:
    """Where a process asking for the compiled engine imports ``modules`` from, and that it
    said why it ran Python instead; fails if the planted library ran."""
    code = "import importlib, pearl\n" + "".join(
        f"print(importlib.import_module({m!r}).__file__)\n" for m in modules
    )
    run = _python(code, PEARL_NATIVE="1", PEARL_CACHE=str(cache), PLANTED_MARK=str(mark), **env)
    assert not mark.exists(), "the planted library ran in a process that imported pearl"
    assert run.returncode == 0, run.stderr
    assert "build is not loaded" in run.stderr, run.stderr
    return run.stdout.split()


@pytest.mark.parametrize(
    "case",
    ["another module", "an absolute path", "a path leaving the folder", "a symlink out", "arenas"],
)
def test_a_planted_manifest_loads_no_module_it_should_not_hold_nor_a_file_outside(
    tmp_path, planted, case
):
    """A manifest in the cache (writable by whoever planted it there) may name only the
    modules a build holds, each at its own place inside the folder: pearl.cli replaced by
    a foreign library, or a module (or the arena library) loaded from elsewhere, is refused
    and the Python modules run."""
    worker = f"pearl/sim/worker{EXT}"
    manifests = {
        "another module": {"modules": {"pearl.cli": f"pearl/cli{EXT}"}},
        "an absolute path": {"modules": {"pearl.sim.worker": str(planted)}},
        "a path leaving the folder": {"modules": {"pearl.sim.worker": f"../../../{worker}"}},
        "a symlink out": {"modules": {"pearl.sim.worker": worker}},
        "arenas": {"modules": {}, "arenas": str(planted)},
    }
    cache = tmp_path / "cache"
    folder = _plant_build(cache, manifests[case], planted)
    if case == "a symlink out":
        (folder / worker).unlink()
        (folder / worker).symlink_to(planted)
    files = _origins(
        cache,
        tmp_path / "mark",
        ["pearl.cli", "pearl.sim.worker"],
        **{native.ARENAS_ENV: "1"},
    )
    assert files == [str(native.PACKAGE / "cli.py"), str(native.PACKAGE / "sim" / "worker.py")]


def test_a_build_others_could_write_or_that_is_not_ours_is_refused(tmp_path, planted):
    """The same build (the layout ``build`` writes) is loaded only while nobody but this
    user could have written it: its folder, subfolders and files, and the folders above it."""
    worker = f"pearl/sim/worker{EXT}"
    cache = tmp_path / "cache"
    folder = _plant_build(cache, {"modules": {"pearl.sim.worker": worker}}, planted)

    def loads() -> bool:
        code = "import importlib.util, pearl; print(importlib.util.find_spec('pearl.sim.worker').origin)"
        run = _python(code, PEARL_NATIVE="1", PEARL_CACHE=str(cache))
        assert run.returncode == 0, run.stderr
        if run.stdout.strip() == str(folder / worker):
            return True
        assert run.stdout.strip() == str(native.PACKAGE / "sim" / "worker.py")
        assert "build is not loaded" in run.stderr, run.stderr
        return False

    assert loads()  # this user's, writable by this user only: the build is used
    for path, mode, restore in [
        (folder, 0o777, 0o755),
        (folder / worker, 0o757, 0o755),
        (folder / "pearl" / "sim", 0o775, 0o755),
        (folder / native.MANIFEST, 0o666, 0o644),
        (folder.parent, 0o777, 0o755),  # others could swap the build for theirs
    ]:
        path.chmod(mode)
        assert not loads(), f"loaded with {path} at mode {oct(mode)}"
        path.chmod(restore)
    folder.parent.chmod(0o1777)  # sticky, as /tmp: others may not move our build
    assert loads()
    folder.parent.chmod(0o755)
    if os.getuid() != 0:
        return  # giving a file to another user needs root
    for path in (folder, folder / worker, folder / native.MANIFEST):
        os.chown(path, 65534, -1)
        assert not loads(), f"loaded with {path} owned by uid 65534"
        os.chown(path, 0, -1)
    assert loads()


def test_a_build_that_is_not_trusted_is_neither_offered_nor_reused(tmp_path):
    """A simulation's processes are not told to load it (one warning here, not one per
    process) and ``build`` says why it will not use it instead of returning it."""
    env = {"PEARL_CACHE": str(tmp_path)}
    folder = native.build_dir(env)
    folder.mkdir(parents=True)
    (folder / native.MANIFEST).write_text('{"modules": {}}')
    assert native.native_env(env) == {"PEARL_NATIVE": "1"}
    folder.chmod(0o777)
    assert native.native_env(env) == {}
    with pytest.raises(native.NativeBuildError, match="will not be loaded: .* writable by"):
        native.build(env)


def test_the_cache_folders_pearl_makes_are_writable_by_their_owner_only_whatever_the_umask(
    tmp_path, monkeypatch
):
    """Under a umask of 002 (a group per user) ``mkdir -p`` makes group-writable folders,
    which the loader refuses above a build unless the group is the user's own: the folders
    a build and a model conversion make in the cache are 0755."""
    monkeypatch.setattr(catalog, "convert_gguf", lambda gguf, out: None)  # the folders only
    previous = os.umask(0o002)
    try:
        catalog.make_cache_folders(tmp_path / "cache" / "native")
        catalog.model_folder("smollm2-135m", root=tmp_path / "models-cache" / "pearl")
    finally:
        os.umask(previous)
    for folder in (
        tmp_path / "cache",
        tmp_path / "cache" / "native",
        tmp_path / "models-cache",
        tmp_path / "models-cache" / "pearl",
        tmp_path / "models-cache" / "pearl" / "models",
    ):
        assert folder.stat().st_mode & 0o777 == 0o755, folder


@pytest.mark.skipif(os.getuid() != 0, reason="giving a build to another user needs root")
def test_pruning_removes_only_this_users_builds(tmp_path):
    """Several users may share a cache: each prunes its own builds, oldest first."""
    builds = {}
    for age, name in enumerate(["newest", "older", "another users oldest"]):
        builds[name] = tmp_path / name
        builds[name].mkdir()
        (builds[name] / native.MANIFEST).write_text('{"modules": {}}')
        os.utime(builds[name], (1e9 - age, 1e9 - age))
    os.chown(builds["another users oldest"], 65534, -1)
    native._prune(tmp_path, keep=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["another users oldest", "newest"]


# Stands in for mypyc at the process boundary (``python -m mypyc`` in the build's copy of
# the package): an empty extension beside each source, so a build takes a second, not a
# minute. The arena library is compiled for real.
_FAKE_MYPYC = """
import sys, sysconfig
from pathlib import Path
for source in sys.argv[1:]:
    Path(source).with_suffix(sysconfig.get_config_var("EXT_SUFFIX")).write_bytes(b"")
"""


def _fake_mypyc(folder: Path) -> Path:
    """A folder to put first on a build's PYTHONPATH so that its ``mypyc`` is the fake."""
    (folder / "mypyc").mkdir(parents=True)
    (folder / "mypyc" / "__init__.py").write_text("")
    (folder / "mypyc" / "__main__.py").write_text(_FAKE_MYPYC)
    return folder


def _run_as(uid: int, code: str, cwd: Path, **env: str) -> str:
    """Run ``code`` as user ``uid`` (group ``uid``, no other groups) with ``env``; its stdout.
    The interpreter is this one, or the system's of the same version when this one is out
    of other users' reach (a virtual environment of root's own Python, here)."""
    pythonpath = os.pathsep.join(
        [env.pop("PYTHONPATH", ""), str(native.PACKAGE.parent), sysconfig.get_paths()["purelib"]]
    )
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for python in (sys.executable, f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        try:
            run = subprocess.run(
                [python, "-c", code],
                capture_output=True,
                text=True,
                cwd=cwd,
                user=uid,
                group=uid,
                extra_groups=[],
                env={
                    **os.environ,
                    "PYTHONPATH": pythonpath,
                    "PYTHONDONTWRITEBYTECODE": "1",
                    "HOME": str(cwd),
                    **env,
                },
                timeout=300,
            )
        except (PermissionError, FileNotFoundError):
            continue
        assert run.returncode == 0, f"as uid {uid}: {run.stderr}"
        return run.stdout
    pytest.skip(f"no {version} that uid {uid} may run")


@pytest.mark.skipif(os.getuid() != 0, reason="running as two other users needs root")
def test_users_sharing_a_cache_each_get_a_trusted_build_of_their_own():
    """The shared cache of docs/cluster.md (root's, mode 1777, its native/ too): the first
    user's build does not take the place of the next one's; each builds, and loads, its own."""
    if native._missing_tools():
        pytest.skip(native._missing_tools())
    shared = Path(tempfile.mkdtemp(prefix="pearl-shared-"))  # tmp_path is root's alone
    try:
        shared.chmod(0o755)
        cache = shared / "cache"
        for folder in (cache, cache / "native"):
            folder.mkdir()
            folder.chmod(0o1777)
        fake = _fake_mypyc(shared / "fake")
        code = (
            "from pearl import native\n"
            "native.build()\n"
            "print(native.trusted_build(native.build_dir()).folder, native.native_env())\n"
        )
        folders = {}
        for uid in (65534, 65533):
            out = _run_as(uid, code, shared, PEARL_CACHE=str(cache), PYTHONPATH=str(fake))
            folder, offered = out.split(" ", 1)
            assert offered.strip() == "{'PEARL_NATIVE': '1'}", out
            folders[uid] = Path(folder)
        assert folders[65534] != folders[65533]
        for uid, folder in folders.items():
            assert folder.is_relative_to(cache / "native")
            assert folder.stat().st_uid == uid
            assert (folder / native.MANIFEST).is_file()
        # Another user made uid 65532's folder first (mode 0700): refused with the reason,
        # no build, no traceback.
        squatted = folders[65534].parent.with_name("u65532")
        squatted.mkdir(mode=0o700)
        os.chown(squatted, 65533, 65533)
        code = (
            "from pearl import native\n"
            "print(native.native_env())\n"
            "try:\n"
            "    native.build()\n"
            "except native.NativeBuildError as exc:\n"
            "    print(exc)\n"
        )
        out = _run_as(65532, code, shared, PEARL_CACHE=str(cache), PYTHONPATH=str(fake))
        offered, refusal = out.splitlines()[:2]
        assert offered == "{}", out
        assert f"{squatted} (above the build) belongs to uid 65533" in refusal, out
    finally:
        shutil.rmtree(shared)


def _user_database(monkeypatch, *, members: list[str], others_with_it_primary: bool) -> str:
    """Group and user lookups as ``pearl.native`` reads them: this user (its process's uid
    and gid) and, if asked, another user whose primary group is this user's group; the
    group's listed members. Returns this user's name."""
    uid, gid = os.getuid(), os.getgid()
    me = pwd.struct_passwd(("me", "x", uid, gid, "", "/home/me", "/bin/sh"))
    users = [me]
    if others_with_it_primary:
        users.append(pwd.struct_passwd(("bob", "x", uid + 1, gid, "", "/home/bob", "/bin/sh")))
    groups = {gid: grp.struct_group(("me", "x", gid, list(members)))}

    def getgrgid(number: int) -> grp.struct_group:
        return groups[number]

    monkeypatch.setattr(pwd, "getpwall", lambda: list(users))
    monkeypatch.setattr(grp, "getgrgid", getgrgid)
    return "me"


@pytest.mark.parametrize(
    ("members", "others_with_it_primary", "trusted"),
    [
        ([], False, True),  # a user-private group (Debian/Ubuntu, umask 002)
        (["me"], False, True),  # the user listed in their own group
        (["alice"], False, False),  # alice may write there
        (["me", "alice"], False, False),
        ([], True, False),  # bob's primary group is ours too
    ],
)
def test_a_group_writable_folder_above_the_build_is_trusted_only_for_a_private_group(
    tmp_path, monkeypatch, members, others_with_it_primary, trusted
):
    """``~/.cache`` made 0775 by pip under a umask of 002: accepted when its group is this
    user's own (the user's primary group, no other member, no one else's primary group),
    refused when anyone else is in that group."""
    _user_database(monkeypatch, members=members, others_with_it_primary=others_with_it_primary)
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, os.getuid(), os.getgid())
    home.chmod(0o775)
    env = {"PEARL_CACHE": str(home / ".cache" / "pearl")}
    folder = native.build_dir(env)
    folder.mkdir(parents=True)
    (folder / native.MANIFEST).write_text('{"modules": {}}')
    if trusted:
        native.trusted_build(folder)
        assert native.native_env(env) == {"PEARL_NATIVE": "1"}
    else:
        with pytest.raises(native.UntrustedBuild, match=f"{home} .*writable by its group"):
            native.trusted_build(folder)
        assert native.native_env(env) == {}
    home.chmod(0o777)  # writable by everyone: refused whatever the group
    with pytest.raises(native.UntrustedBuild, match="writable by its group or others"):
        native.trusted_build(folder)


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another group needs root")
def test_a_group_writable_folder_of_another_group_is_refused(tmp_path, monkeypatch):
    _user_database(monkeypatch, members=[], others_with_it_primary=False)
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, os.getuid(), os.getgid() + 1)  # not this user's primary group
    home.chmod(0o775)
    folder = native.build_dir({"PEARL_CACHE": str(home / "cache")})
    folder.mkdir(parents=True)
    (folder / native.MANIFEST).write_text('{"modules": {}}')
    with pytest.raises(native.UntrustedBuild, match="writable by its group"):
        native.trusted_build(folder)


def test_a_build_that_would_not_be_loaded_fails_when_built_saying_why(tmp_path, monkeypatch):
    """A cache under a folder others may write: ``build`` refuses there and then, with the
    reason, instead of a warning in every simulation that follows."""
    if native._missing_tools():
        pytest.skip(native._missing_tools())
    monkeypatch.setenv("PYTHONPATH", str(_fake_mypyc(tmp_path / "fake")))
    ours = {"PEARL_CACHE": str(tmp_path / "ours")}
    assert native.trusted_build(native.build(ours)).folder == native.build_dir(ours)
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    with pytest.raises(native.NativeBuildError, match=f"{open_to_all} .*writable by its group"):
        native.build({"PEARL_CACHE": str(open_to_all / "cache")})


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


def test_the_compiled_modules_give_the_golden_digests(tmp_path):
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
    assert "3 passed" in golden.stdout, golden.stdout[-3000:]
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
