"""Joining a Ray cluster that runs with token authentication (Ray >= 2.52, ``RAY_AUTH_MODE=token``).

A real cluster started as an operator would (``ray get-auth-token --generate``, then
``ray start --head`` with the token in its environment), on loopback, free ports and a temp
dir of its own; drivers are fresh processes going through PEARL's joins
(``pearl.live.cluster.ensure_ray`` for ``cluster.ray_address``, ``pearl.live.ray_pool.connect``
for ``plan.ray_address``). With the cluster's token a driver runs a Ray task there; without it,
or with another one, the join ends in one ``ConfigError`` naming the setting and the token
variables.

Loopback needs ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` on the head and on the drivers: without
it Ray replaces 127.0.0.1 by the machine's address (and binds every interface). The same
setting refuses a second ``ray start`` node, so the cluster is one raylet. Teardown kills only
the processes carrying this cluster's mark in their environment (never ``ray stop``, which
stops every Ray instance of the machine).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from procfs import processes_with_environment, wait_until_gone

ray_exceptions = pytest.importorskip("ray.exceptions")
if not hasattr(ray_exceptions, "AuthenticationError"):
    pytest.skip("this Ray has no token authentication (2.52+)", allow_module_level=True)


MARK = "PEARL_TEST_RAY_TOKEN_CLUSTER"
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}

# A driver as `pearl train` / `pearl plan` joins: argv[1] the address, argv[2] which join.
# Prints the node a Ray task ran on, or the ConfigError the join ended in.
DRIVER = """
import json, sys
import ray
from pearl.errors import ConfigError
from pearl.live.cluster import actor_location, ensure_ray
from pearl.live.ray_pool import connect
try:
    ensure_ray(1, sys.argv[1]) if sys.argv[2] == "train" else connect(sys.argv[1])
except ConfigError as exc:
    print(json.dumps({"config_error": str(exc)}))
    sys.exit(0)
where = ray.remote(num_cpus=1)(actor_location)
print(json.dumps({"ran_on": ray.get(where.remote(), timeout=120)}))
"""


@dataclass(frozen=True)
class TokenCluster:
    address: str
    token: str
    token_path: Path
    environment: dict[str, str]  # what every process of the test starts with (no RAY_AUTH_*)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; main()"]
    return subprocess.run([*command, *args], env=env, capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def token_cluster() -> Iterator[TokenCluster]:
    # A short path: Ray's unix sockets live under it (108-byte limit).
    root = Path(tempfile.mkdtemp(prefix="pearl-ray-token-", dir="/tmp"))
    home = root / "home"  # no ~/.ray/auth_token of the user's is read, none is written
    home.mkdir()
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    environment |= {"HOME": str(home), MARK: str(root), "PYTHONUNBUFFERED": "1"}
    try:
        made = _ray_cli("get-auth-token", "--generate", env=environment)
        assert made.returncode == 0, made.stderr
        token_path = root / "auth_token"
        shutil.move(home / ".ray" / "auth_token", token_path)
        token_path.chmod(0o600)  # Ray writes it with the umask's mode (0644 here)
        token = token_path.read_text().strip()
        port = _free_port()
        head = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_path)}
        started = _ray_cli(
            "start",
            "--head",
            f"--port={port}",
            "--num-cpus=1",
            "--include-dashboard=false",
            f"--dashboard-port={_free_port()}",
            f"--ray-client-server-port={_free_port()}",
            f"--dashboard-agent-listen-port={_free_port()}",
            f"--temp-dir={root / 'ray'}",
            "--disable-usage-stats",
            env=environment | head | LOOPBACK,
        )
        assert started.returncode == 0, started.stdout + started.stderr
        yield TokenCluster(f"127.0.0.1:{port}", token, token_path, environment)
    finally:
        ours = processes_with_environment(MARK, str(root))
        for pid in ours:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        left = wait_until_gone(ours, timeout_s=30)
        shutil.rmtree(root, ignore_errors=True)
        assert not left, f"processes of the test's Ray cluster still running: {left}"


def _drive(cluster: TokenCluster, join: str, auth: dict[str, str]) -> dict:
    """One driver process joining ``cluster`` through PEARL (``join``: "train" or "plan")
    with ``auth`` as its RAY_AUTH_* environment; what it printed."""
    env = cluster.environment | LOOPBACK | auth
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, cluster.address, join],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_driver_with_the_clusters_token_joins_and_runs_a_task(token_cluster):
    """The token in the environment (``pearl train``) or in a file (``pearl plan``)."""
    cluster = token_cluster
    ways = [
        ("train", {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": cluster.token}),
        ("plan", {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(cluster.token_path)}),
    ]
    with ThreadPoolExecutor(len(ways)) as pool:
        answers = list(pool.map(lambda way: _drive(cluster, *way), ways))
    for (join, _), answer in zip(ways, answers, strict=True):
        assert "ran_on" in answer, (join, answer)
        assert answer["ran_on"]["node_ip"] == "127.0.0.1"


def test_a_driver_without_the_clusters_token_is_refused_with_one_clear_error(token_cluster):
    cluster = token_cluster
    # Ray retries a refused head once a second for ~20 s before giving up; two tries show
    # the same refusal (RAY_gcs_server_port_wait_time_s is Ray's own budget for them).
    quick = {"RAY_gcs_server_port_wait_time_s": "2"}
    wrong = "0" * len(cluster.token)
    cases = [
        ("train", {}, "cluster.ray_address"),  # token auth not turned on here at all
        ("train", {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": wrong}, "cluster.ray_address"),
        ("train", {"RAY_AUTH_MODE": "token"}, "cluster.ray_address"),  # no token anywhere
        ("plan", {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": wrong}, "plan.ray_address"),
    ]
    with ThreadPoolExecutor(len(cases)) as pool:
        answers = list(pool.map(lambda case: _drive(cluster, case[0], case[1] | quick), cases))
    for (join, auth, setting), answer in zip(cases, answers, strict=True):
        assert "config_error" in answer, (join, auth, answer)
        error = answer["config_error"]
        assert f"{setting}='{cluster.address}'" in error, error
        assert "token authentication refused this driver" in error, error
        for variable in ("RAY_AUTH_MODE=token", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
            assert variable in error, error
        assert "Traceback" not in error and cluster.token not in error
        if auth.get("RAY_AUTH_TOKEN") == wrong:
            assert "missing or incorrect" in error, error


PRIVATE = """
import json, os
from pearl.live.cluster import ensure_ray
ensure_ray(1)
import ray
mode = ray.get(ray.remote(num_cpus=1)(lambda: os.environ.get("RAY_AUTH_MODE")).remote())
print(json.dumps({
    "worker_mode": mode,
    "token_file": os.path.exists(os.path.expanduser("~/.ray/auth_token")),
    "own_token": len(os.environ.get("RAY_AUTH_TOKEN", "")),
}))
ray.shutdown()
"""


def test_a_private_runtime_keeps_its_token_out_of_files_others_can_read(tmp_path):
    """Left to itself, Ray turns token authentication on for a new local runtime and writes
    the token to ~/.ray/auth_token with the umask's mode (0644), where any local user could
    read it and join; PEARL's private runtime gets a fresh token of its own in its
    processes' environment instead, and writes no file."""
    mark = str(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env |= {"HOME": str(tmp_path), MARK: mark}
    try:
        done = subprocess.run(
            [sys.executable, "-c", PRIVATE], env=env, capture_output=True, text=True, timeout=180
        )
    finally:
        ours = processes_with_environment(MARK, mark)
        for pid in ours:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_until_gone(ours, timeout_s=30)
    assert done.returncode == 0, done.stderr[-4000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer == {"worker_mode": "token", "token_file": False, "own_token": 64}
