"""``pearl plan`` on a Ray cluster: a real multi-node cluster on one machine (three raylets,
``ray.cluster_utils.Cluster``) runs the grid as tasks and gives the local pool's plan; a
node lost mid-grid loses only the runs it held, and a resume runs only those."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pearl.cli import app
from pearl.errors import ConfigError

ray = pytest.importorskip("ray")

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.fixture
def cluster():
    """A head node (the driver's, no CPU slot: it runs no task) and two nodes of one slot
    each; this process is not connected yet."""
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    nodes = [c.add_node(num_cpus=1) for _ in range(2)]
    c.wait_for_nodes()
    yield c, nodes
    ray.shutdown()
    c.shutdown()


def lose(cluster, node) -> None:
    """The node's machine is gone: its raylet and every process it started (the workers
    running tasks) killed at once. (Removing the raylet alone leaves a worker computing a
    pure-Python task to finish it and hand its result to the driver.)"""
    from procfs import process_tree

    raylet = node.all_processes["raylet"][0].process.pid
    processes = process_tree(raylet)
    cluster.remove_node(node, allow_graceful=False)
    for pid in processes:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def plan_args(folder: Path, name: str, *extra: str) -> list[str]:
    return [
        "plan",
        "--config",
        str(CONFIGS / "headline.yaml"),
        "rl.duration_s=60",
        "workload.profile=tiny",
        "policies=[roll,rlboost,pearl]",
        "elastic.segments=[segment2,segment3]",
        "plan.reserved_gpus=[4,8]",
        "plan.tp=[2]",
        "plan.check_seeds=1",
        "processes=2",
        f"logger.run_dir={folder}",
        f"logger.run_name={name}",
        *extra,
    ]


def same_plan(folder: Path) -> tuple[str, dict]:
    """plan.md, and plan.json without what differs by invocation (wall time, runs kept)."""
    plan = json.loads((folder / "plan.json").read_text())
    for key in ("wall_s", "runs_kept_before"):
        plan.pop(key)
    return (folder / "plan.md").read_text(), plan


def test_a_plan_on_a_three_raylet_cluster_is_the_local_pools_plan(tmp_path, cluster):
    c, _ = cluster
    local = CliRunner().invoke(app, plan_args(tmp_path, "local"))
    assert local.exit_code == 0, local.output
    on_ray = CliRunner().invoke(app, plan_args(tmp_path, "ray", f"plan.ray_address={c.address}"))
    assert on_ray.exit_code == 0, on_ray.output
    assert f"Ray tasks on {c.address}" in on_ray.output
    assert same_plan(tmp_path / "ray") == same_plan(tmp_path / "local")
    # Every run (2 traces x 6 configurations, roll's second trace a copy; 2 ranking checks
    # of each trace) is kept, the same files either way.
    kept = {p.name for p in (tmp_path / "ray" / "runs").iterdir()}
    assert kept == {p.name for p in (tmp_path / "local" / "runs").iterdir()}
    assert len(kept) == 12 + 4


@pytest.mark.slow  # ~32 s: a Ray cluster loses a node (the fast suite's budget)
def test_a_lost_node_loses_only_its_runs(tmp_path, cluster):
    """Four 8-second jobs on two one-slot nodes: two run at once, one node is lost once
    both have started; its job is reported lost, the other three finish on the node left."""
    from pearl.live.ray_pool import connect, run_on_ray

    c, nodes = cluster
    connect(c.address)
    done, lost = [], {}
    # A Python function each node has; each job leaves a mark when it starts.
    jobs = [(k, (["sh", "-c", f"touch {tmp_path}/started-{k}; sleep 8"],)) for k in range(4)]

    def lose_a_node() -> None:
        # Once both first jobs run (a fixed wait raced Ray's worker start on a busy host).
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("started-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        lose(c, nodes[0])

    killer = threading.Thread(target=lose_a_node)
    killer.start()
    start = time.monotonic()
    run_on_ray(subprocess.call, jobs, lambda key, _: done.append(key), lost.__setitem__)
    killer.join()
    assert len(lost) == 1 and len(done) == 3, (done, lost)
    assert set(done) | set(lost) == {0, 1, 2, 3}
    assert "died" in next(iter(lost.values()))
    assert time.monotonic() - start < 180


def test_a_jobs_own_error_ends_the_batch_with_that_error(cluster):
    from pearl.live.ray_pool import connect, run_on_ray

    c, _ = cluster
    connect(c.address)
    with pytest.raises(json.JSONDecodeError) as err:
        run_on_ray(json.loads, [("a", ("{",))], lambda *_: None, lambda *_: None)
    assert "raised by the Ray task running a" in "\n".join(err.value.__notes__)


def test_tasks_run_in_workers_started_with_the_extra_environment(cluster):
    from pearl.live.ray_pool import connect, run_on_ray

    c, _ = cluster
    connect(c.address)
    answers: dict = {}
    env = {"PEARL_TEST_RAY_ENV": "set"}
    run_on_ray(os.getenv, [("a", ("PEARL_TEST_RAY_ENV",))], answers.__setitem__, print, env=env)
    assert answers == {"a": "set"}


def test_an_address_where_no_cluster_answers_is_a_clear_error(tmp_path, monkeypatch):
    from pearl.live.ray_pool import connect

    if ray.is_initialized():
        ray.shutdown()
    with pytest.raises(ConfigError) as err:
        connect("127.0.0.1:1")
    assert "plan.ray_address" in str(err.value) and "ray start --head" in str(err.value)


def test_a_plan_that_lost_a_node_resumes_running_only_the_lost_runs(tmp_path, cluster):
    """A worker node removed mid-grid: the plan stops with RunsLost naming the runs it held,
    every run that finished is kept, and --resume (on the node left) runs only the missing
    ones."""
    from pearl.apps.plan import load_plan_config, run_plan
    from pearl.errors import RunsLost

    c, nodes = cluster
    args = plan_args(  # 4 runs on 2 slots
        tmp_path,
        "lost",
        f"plan.ray_address={c.address}",
        "policies=[pearl]",
        "plan.check_seeds=0",
        "rl.duration_s=600",
    )
    cfg = load_plan_config(args[2], args[3:])
    runs = tmp_path / "lost" / "runs"
    outcome: dict = {}

    def plan() -> None:
        try:
            outcome["plan"] = run_plan(cfg)
        except RunsLost as exc:
            outcome["lost"] = exc

    thread = threading.Thread(target=plan)
    thread.start()
    deadline = time.monotonic() + 300
    from procfs import process_tree, processes_named

    raylet = nodes[0].all_processes["raylet"][0].process.pid
    # A run executing on that node (Ray titles the worker ray::run_one meanwhile): a task
    # only leased there, not started, Ray would quietly place elsewhere.
    while not processes_named("ray::run_one", process_tree(raylet)):
        assert thread.is_alive() and time.monotonic() < deadline, outcome
        time.sleep(0.05)
    lose(c, nodes[0])
    thread.join(600)
    assert not thread.is_alive(), "the plan did not end after losing a node"
    assert "lost" in outcome, outcome
    assert "died" in str(outcome["lost"]) and "--resume" in str(outcome["lost"])
    kept = {p.name: p.stat().st_mtime_ns for p in runs.iterdir()}
    assert kept and not (tmp_path / "lost" / "plan.json").exists()
    done = CliRunner().invoke(app, ["plan", "--resume", str(tmp_path / "lost")])
    assert done.exit_code == 0, done.output
    plan = json.loads((tmp_path / "lost" / "plan.json").read_text())
    assert plan["runs_kept_before"] == len(kept)
    after = {p.name: p.stat().st_mtime_ns for p in runs.iterdir()}
    assert {k: after[k] for k in kept} == kept  # what finished was not run again
    assert len(after) == 4  # 2 pools x 2 traces
