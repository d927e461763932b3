"""``pearl train`` on a Ray cluster it joins: a real multi-node cluster on one machine (three
raylets, ``ray.cluster_utils.Cluster``), actors placed by Ray's resources and strategies, the
run folder saying which node ran what, and a whole node lost mid-run."""

import importlib.util
import json
import random
from pathlib import Path

import pytest
from tiny_model import tiny_chat_model

from pearl.errors import ConfigError


def test_a_call_whose_process_ray_killed_for_memory_counts_as_the_actor_dying():
    """Ray's memory monitor killing an actor's process mid-call raises ``OutOfMemoryError``,
    not an actor error: a rollout worker or trainer lost that way is a death (replaced, or
    the run stops in one line), as a killed or crashed one is; what the actor's own code
    raised is not, even an exception of the same name."""
    rex = pytest.importorskip("ray.exceptions")
    from pearl.live.cluster import process_death

    assert process_death(rex.OutOfMemoryError("1 worker(s) were killed due to low memory"))
    assert process_death(rex.ActorDiedError()) and process_death(rex.WorkerCrashedError())
    raised = rex.RayTaskError("load_weights", "Traceback ...", ValueError("bad weights"))
    assert not process_death(raised)
    own = rex.RayTaskError("f", "Traceback ...", rex.OutOfMemoryError("x")).as_instanceof_cause()
    assert isinstance(own, rex.OutOfMemoryError) and not process_death(own)
    assert not process_death(ValueError("not Ray's"))


def test_cluster_settings_are_checked_with_the_key_and_what_is_valid():
    from pearl.config.train import load_train_config

    ok = load_train_config(None, ["cluster.ray_address=10.0.0.1:6379"])
    assert ok.cluster.ray_address == "10.0.0.1:6379"
    assert load_train_config(None, ["cluster.ray_address=auto"]).cluster.ray_address == "auto"
    bad = {
        "cluster.ray_address=ray://10.0.0.1:10001": "Ray Client",
        "cluster.ray_address=10.0.0.1": "host:port",
        "cluster.ray_address=head:99999": "host:port",
        "cluster.worker_resources={CPU: 2}": "CPU slot",
        "cluster.trainer_resources={gpu_node: 0}": "positive",
    }
    for override, says in bad.items():
        with pytest.raises(ConfigError) as err:
            load_train_config(None, [override])
        assert says in str(err.value) and override.split("=")[0].split(".")[1] in str(err.value)


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    return tiny_chat_model(tmp_path_factory.mktemp("tiny-chat"))


def _node_loss():
    """benchmarks/node_loss.py: the three-node cluster and the node-loss harness."""
    path = Path(__file__).parents[2] / "benchmarks" / "node_loss.py"
    spec = importlib.util.spec_from_file_location("node_loss", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def three_nodes():
    """A head node (the driver's, 2 CPU slots: trainer, spare) and two rollout nodes with 2
    slots and 2 units of a ``rollout`` resource each; this process is not connected yet."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    cluster, rollout_nodes = _node_loss().three_nodes()
    yield cluster, rollout_nodes
    ray.shutdown()
    cluster.shutdown()


def test_a_joined_cluster_places_actors_by_resources_and_survives_losing_a_node(
    chat_model, tmp_path, three_nodes
):
    bench = _node_loss()
    cluster, rollout_nodes = three_nodes
    folder = tmp_path / "multinode"
    steps = 12
    overrides = [
        f"model.name={chat_model}",
        "rollout.tasks_per_step=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=16",
        "rollout.max_context_tokens=1024",
        f"run.steps={steps}",
        "run.eval_tasks=0",
    ]
    out = bench.run_losing_a_node(
        cluster, rollout_nodes, folder, overrides, lose_at=3, rng=random.Random(0)
    )
    lost = out["lost"]
    assert lost and lost["after_steps"] < steps, f"the node went only after the last step: {lost}"

    events = bench.events(folder)
    placed = [e for e in events if e.get("kind") == "placed"]
    trainer = [e for e in placed if e["actor"] == "trainer"]
    first_two = [e for e in placed if e["actor"] == "rollout"][:2]
    rollout_ids = {n.node_id for n in rollout_nodes}
    # the trainer on the driver's node (the head: no rollout resource), one worker per node
    assert len(trainer) == 1 and trainer[0]["node_id"] not in rollout_ids
    assert {e["node_id"] for e in first_two} == rollout_ids
    # the lost node's worker failed, was taken out, and its replacement runs on the survivor
    # (a start Ray sends to the lost node before it declares it dead fails and is retried)
    audit = bench.audit(folder, 4, lost["node_id"])
    assert audit["failures"] == 1 == out["counters"]["worker_failures"]
    assert audit["replacements"] == 1 and audit["replacements_on_lost_node"] == 0
    # every trajectory of every step finished exactly once, with all its turns
    assert audit["steps"] == steps and audit["lost"] == 0 == audit["duplicated"]
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert all(r["turns"] == 12 for r in rows)
    # the summary's node table: which node ran what
    nodes = json.loads((folder / "summary.json").read_text())["nodes"]
    assert set(nodes) == rollout_ids | {trainer[0]["node_id"]}
    assert "trainer" in nodes[trainer[0]["node_id"]]["actors"]
