"""The import rules of docs/architecture.md: dependencies point down, the control plane is
pure, the simulated world imports neither torch nor the reports, programs sit on top."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "pearl"

# Which of PEARL's packages each package may import (besides itself). Every import counts,
# function-level ones too. ``apps`` and ``cli`` are the programs: nothing else imports them.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "token_runs": set(),  # token sequences as runs over id walks (the simulator's contexts)
    "redaction": set(),  # secrets out of configs written or logged
    "durable_files": set(),  # files whole or untouched on a full disk
    "native": set(),  # the engine compiled (imported by pearl/__init__, and by setup.py alone)
    "models": {"errors"},
    "engine": {"models", "errors", "token_runs"},
    "workloads": {"errors", "token_runs"},
    "envs": {"errors"},
    "agents": {"control", "envs", "models", "errors", "redaction"},
    "control": {"workloads", "errors", "token_runs"},
    "engine_turns": {"control", "engine", "token_runs"},
    "sim": {
        "control",
        "engine",
        "engine_turns",
        "models",
        "workloads",
        "errors",
        "token_runs",
    },
    "live": {
        "control",
        "durable_files",
        "engine",
        "engine_turns",
        "envs",
        "models",
        "workloads",
        "errors",
    },
    "processes": {"native"},  # the processes PEARL starts for runs, and their environment
    # the programs' schemas: train's checks a backend's capabilities (pearl.live.worker);
    # simulate's engine section takes its defaults from the simulated worker's
    "config": {"control", "workloads", "errors", "redaction", "live", "sim"},
    "report": {"control", "durable_files", "errors", "redaction"},
    "apps": {
        "agents",
        "native",
        "config",
        "control",
        "durable_files",
        "engine",
        "engine_turns",
        "envs",
        "errors",
        "live",
        "models",
        "processes",
        "redaction",
        "report",
        "sim",
        "workloads",
    },
    "cli": {
        "apps",
        "config",
        "control",
        "durable_files",
        "errors",
        "models",
        "report",
        "workloads",
    },
}


def _package(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return parts[0] if parts[0] != "__init__" else ""


def _pearl_imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
            if node.module == "pearl":  # from pearl import x
                names = [f"pearl.{a.name}" for a in node.names]
        out += [(node.lineno, n) for n in names if n.startswith("pearl.")]
    return out


def _violations() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        package = _package(path)
        if not package:
            continue
        assert package in ALLOWED, f"{path}: package {package!r} has no import rule here"
        for line, name in _pearl_imports(path):
            target = name.split(".")[1]
            if target != package and target != "__version__" and target not in ALLOWED[package]:
                found.append(f"{path.relative_to(SRC.parent)}:{line}: {package} imports {name}")
    return found


def test_every_import_points_down_the_layers():
    assert _violations() == []


def test_the_rule_check_catches_an_upward_import(tmp_path, monkeypatch):
    """The scan sees function-level imports: a control module importing the simulator."""
    fake = tmp_path / "pearl"
    (fake / "control").mkdir(parents=True)
    (fake / "control" / "bad.py").write_text(
        "def f():\n    from pearl.sim.worker import SimulatedWorker\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "SRC", fake)
    assert _violations() == ["pearl/control/bad.py:2: control imports pearl.sim.worker"]


def _module_graph() -> dict[str, set[str]]:
    """Each pearl module's imports of other pearl modules (function-level and type-only ones
    too): ``pearl.a.b`` for a module, its package's name for an ``__init__``."""
    modules = {}
    for path in SRC.rglob("*.py"):
        if "_compiled" in path.parts:
            continue
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:  # from pearl.a import b: module pearl.a.b, or pearl.a
                    full = f"{node.module}.{alias.name}"
                    targets.add(full if full in modules else node.module)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_two_modules_import_each_other_even_indirectly():
    assert _cycles(_module_graph()) == []


def test_the_cycle_check_sees_a_cycle_through_three_modules():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


@pytest.mark.parametrize(
    ("packages", "forbidden"),
    [
        (
            ("sim", "control", "workloads"),
            ("torch", "ray", "matplotlib", "pearl.report", "pearl.live", "pearl.apps"),
        ),
        (("control",), ("pearl.engine", "pearl.sim", "pearl.live", "torch", "ray")),
    ],
)
def test_importing_a_layer_loads_nothing_above_it(packages, forbidden):
    """Import every module of the simulated world (and separately the control plane) in a
    fresh interpreter: torch, Ray, the reports, the live world and the programs stay out."""
    modules = [
        ".".join(("pearl",) + p.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
        for package in packages
        for p in sorted((SRC / package).rglob("*.py"))
    ]
    script = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    loaded = set(__import__("json").loads(out))
    bad = sorted(m for m in loaded if any(m == f or m.startswith(f + ".") for f in forbidden))
    assert bad == []


def _third_party_imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


def test_only_the_live_world_imports_ray():
    """Ray is the live world's: programs reach it through ``pearl.live`` (cluster slots,
    a worker's crash, the trainer's death, the plan grid's Ray tasks)."""
    found = [
        f"{path.relative_to(SRC.parent)}:{line}: {name}"
        for path in sorted(SRC.rglob("*.py"))
        if path.relative_to(SRC).parts[0] != "live"
        for line, name in _third_party_imports(path)
        if name == "ray" or name.startswith("ray.")
    ]
    assert found == []


def _long_functions(root: Path, limit: int) -> list[str]:
    """Functions (methods, nested ones) longer than ``limit`` lines, def to last line."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if "_compiled" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(
                        f"{path.relative_to(root.parent)}:{node.lineno} {node.name} {lines}"
                    )
    return found


def test_no_function_is_longer_than_a_screen():
    """60 lines: one job a function, read on one screen (split along the domain's seams)."""
    assert _long_functions(SRC, 60) == []


def test_the_length_check_counts_a_function_from_def_to_its_last_line(tmp_path):
    (tmp_path / "pearl").mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(60))
    (tmp_path / "pearl" / "m.py").write_text(f"def f():\n{body}\n\ndef g():\n    pass\n")
    assert _long_functions(tmp_path / "pearl", 60) == ["pearl/m.py:1 f 61"]
    assert _long_functions(tmp_path / "pearl", 61) == []
