"""Worker groups on a real, simulated heterogeneous Ray cluster.

One cluster for the whole module (starting Ray costs seconds): nodes 0-1 with 4 logical GPUs each,
node 2 a robot node (two robots from the config, no GPUs), node 3 CPU-only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import ray

from rlinfra import ComponentPlacement, Worker, WorkerGroupError
from rlinfra.placement import ClusterSpec
from rlinfra.runtime.layout import ReservationError

ENV_NAMES = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "CUDA_VISIBLE_DEVICES",
    "MASTER_ADDR",
    "MASTER_PORT",
    "ROBOT_SDK",
]

CFG = {
    "cluster": {
        "num_nodes": 4,
        "simulate": "4,4,0,0",
        "component_placement": {
            "actor": {"node_group": "gpu", "placement": "0-7"},
            "rollout": {"node_group": "gpu", "placement": "0-1:0-3"},
            "env": {"node_group": "robot", "placement": "0-1:0-3"},
            "agent": {"node_group": "node", "placement": "3:0-2"},
            "test_worker": {"node_group": "a800", "placement": "0-3"},
        },
        "node_groups": [
            {"label": "gpu", "node_ranks": "0-1"},
            {"label": "a800", "node_ranks": 0},
            {
                "label": "robot",
                "node_ranks": [2],
                "hardware": {
                    "type": "robot",
                    "configs": [{"node_rank": 2, "ip": "10.1.0.1"}, {"node_rank": 2}],
                },
                "env_configs": [{"node_ranks": 2, "env_vars": [{"ROBOT_SDK": "/opt/sdk"}]}],
            },
        ],
    }
}
pytestmark = [pytest.mark.timeout(180), pytest.mark.cluster(CFG)]


class Probe(Worker):
    """Reports what a worker process sees; can fail or block on request."""

    def __init__(self, tag: str = "probe") -> None:
        super().__init__()
        self.tag = tag
        self.rank_seen_in_init = self._rank

    def env(self) -> dict:
        seen = {name: os.environ.get(name) for name in ENV_NAMES}
        seen["rank_in_init"] = self.rank_seen_in_init
        seen["node_id"] = ray.get_runtime_context().get_node_id()
        return seen

    def echo(self, value, suffix=""):
        return f"{self._rank}:{value}{suffix}"

    def double(self, chunk):
        return [2 * item for item in chunk]

    def fail_on(self, rank: int) -> int:
        if self._rank == rank:
            raise ValueError(f"rank {rank} refuses")
        return self._rank

    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return self._rank

    def die_or_block(self, rank: int) -> None:
        if self._rank == rank:
            os._exit(7)
        threading.Event().wait()  # stands for a collective that never completes


class BrokenInit(Worker):
    def __init__(self, bad_rank: int) -> None:
        if self._rank == bad_rank:
            raise RuntimeError("cannot open the simulator")


@pytest.fixture
def launched(cluster, placement):
    groups = []

    def launch(component: str, cls=Probe, *args, **kwargs):
        group = cls.create_group(*args).launch(
            cluster, placement_strategy=placement.get_strategy(component), name=component, **kwargs
        )
        groups.append(group)
        return group

    yield launch
    for group in groups:
        group.shutdown()


def test_discovery_builds_the_same_spec_as_a_dry_run(cluster, placement):
    assert [node.rank for node in cluster.nodes] == [0, 1, 2, 3]
    assert [node.accelerator[1] for node in cluster.nodes] == [4, 4, 0, 0]
    dry = ComponentPlacement(CFG, ClusterSpec.from_config(CFG["cluster"], [4, 4, 0, 0]))
    for name in dry.components:
        assert placement.get_placements(name) == dry.get_placements(name)


def test_resource_ledger_check(cluster):
    cluster.require(GPU=8)
    with pytest.raises(Exception, match=r"GPU: required 16, Ray has 8"):
        cluster.require(GPU=16)


def test_gpu_workers_see_their_env_and_only_their_device(launched, cluster, available_gpus):
    actor = launched("actor")
    seen = actor.env().wait()
    assert [s["RANK"] for s in seen] == [str(r) for r in range(8)]
    assert {s["WORLD_SIZE"] for s in seen} == {"8"}
    assert [s["CUDA_VISIBLE_DEVICES"] for s in seen] == ["0", "1", "2", "3"] * 2
    assert [s["LOCAL_RANK"] for s in seen] == ["0", "1", "2", "3"] * 2
    assert [s["NODE_RANK"] for s in seen] == ["0"] * 4 + ["1"] * 4
    assert [s["node_id"] for s in seen] == [cluster.nodes[0].node_id] * 4 + [cluster.nodes[1].node_id] * 4
    assert [s["rank_in_init"] for s in seen] == list(range(8))
    assert len({(s["MASTER_ADDR"], s["MASTER_PORT"]) for s in seen}) == 1
    assert seen[0]["MASTER_PORT"].isdigit()
    assert available_gpus(0) == pytest.approx(0)
    assert ray.get_actor("actor:3") is not None


def test_shared_devices_use_fractional_reservations(launched, available_gpus):
    assert available_gpus(8) == pytest.approx(8)
    rollout = launched("rollout")
    seen = rollout.env().wait()
    assert [s["CUDA_VISIBLE_DEVICES"] for s in seen] == ["0", "0", "1", "1"]
    assert [s["LOCAL_RANK"] for s in seen] == ["0", "1", "2", "3"]
    assert available_gpus(6) == pytest.approx(6)


def test_robot_and_cpu_components_get_node_group_env(launched, cluster):
    env = launched("env").env().wait()
    assert [s["NODE_RANK"] for s in env] == ["2"] * 4
    assert {s["ROBOT_SDK"] for s in env} == {"/opt/sdk"}
    assert all(s["CUDA_VISIBLE_DEVICES"] in (None, "") for s in env)
    agent = launched("agent").env().wait()
    assert [s["node_id"] for s in agent] == [cluster.nodes[3].node_id] * 3
    assert [s["LOCAL_RANK"] for s in agent] == ["0", "1", "2"]
    assert {s["ROBOT_SDK"] for s in agent} == {None}


def test_seed_example_placement_isolates_four_workers(launched):
    seen = launched("test_worker").env().wait()
    assert [s["CUDA_VISIBLE_DEVICES"] for s in seen] == ["0", "1", "2", "3"]


def test_isolation_off_keeps_true_local_rank_and_hides_nothing(launched):
    seen = launched("rollout", isolate_accelerator=False).env().wait()
    assert [s["LOCAL_RANK"] for s in seen] == ["0", "1", "2", "3"]
    assert {s["CUDA_VISIBLE_DEVICES"] for s in seen} == {None}


def test_ranks_are_stable_across_launches(cluster, placement):
    def launch_and_map():
        group = Probe.create_group().launch(cluster, placement.get_strategy("actor"), name="actor")
        try:
            return [(s["node_id"], s["CUDA_VISIBLE_DEVICES"]) for s in group.env().wait()]
        finally:
            group.shutdown()

    first = launch_and_map()
    assert launch_and_map() == first


def test_dispatch_broadcast_subset_scatter_split(launched):
    rollout = launched("rollout")
    assert rollout.echo("x", suffix="!").wait() == ["0:x!", "1:x!", "2:x!", "3:x!"]
    assert rollout.execute_on(1, 3).echo("y").wait() == ["1:y", "3:y"]
    assert rollout.echo.scatter(["a", "b", "c", "d"]).wait() == ["0:a", "1:b", "2:c", "3:d"]
    assert rollout.double.split(list(range(10))).wait() == [2 * i for i in range(10)]
    assert np.array_equal(rollout.double.split(np.arange(6)).wait(), np.arange(6) * 2)
    with pytest.raises(ValueError, match=r"rollout\.echo: 3 per-rank arguments for 4 ranks"):
        rollout.echo.scatter(["a", "b", "c"])
    with pytest.raises(AttributeError, match="no method 'missing'"):
        rollout.missing()
    with pytest.raises(ValueError, match="cannot execute on"):
        rollout.execute_on(4)


def test_method_error_names_rank_node_traceback_and_keeps_other_results(launched):
    actor = launched("actor")
    with pytest.raises(WorkerGroupError) as caught:
        actor.fail_on(5).wait()
    error = caught.value
    assert error.failed_ranks == [5]
    assert error.failures[5].node_rank == 1
    assert "ValueError: rank 5 refuses" in error.failures[5].reason
    assert "Traceback" in error.failures[5].traceback or "fail_on" in error.failures[5].traceback
    assert set(error.results) == {0, 1, 2, 3, 4, 6, 7}
    assert "worker group 'actor'" in str(error) and "node 1" in str(error)


def test_call_deadline_is_an_error_not_a_hang(launched):
    rollout = launched("rollout")
    started = time.monotonic()
    with pytest.raises(WorkerGroupError, match=r"no answer within 0\.5 s"):
        rollout.sleep(30).wait(timeout=0.5)
    assert time.monotonic() - started < 5


def test_dead_worker_surfaces_within_two_seconds_while_others_block(launched):
    actor = launched("actor")
    call = actor.die_or_block(6)
    started = time.monotonic()
    with pytest.raises(WorkerGroupError) as caught:
        call.wait(timeout=60)
    assert time.monotonic() - started < 2.0
    assert caught.value.failed_ranks == [6]
    assert "process died" in caught.value.failures[6].reason
    assert caught.value.failures[6].node_rank == 1
    assert caught.value.pending == [0, 1, 2, 3, 4, 5, 7]


def test_constructor_failure_names_rank_and_releases_everything(cluster, placement, available_gpus):
    with pytest.raises(WorkerGroupError) as caught:
        BrokenInit.create_group(2).launch(cluster, placement.get_strategy("actor"), name="broken")
    error = caught.value
    assert error.failed_ranks == [2]
    assert "RuntimeError: cannot open the simulator" in error.failures[2].reason
    assert error.failures[2].node_rank == 0
    alive = [pg for pg in ray.util.placement_group_table().values() if pg["state"] == "CREATED"]
    assert alive == []
    assert available_gpus(8) == pytest.approx(8)


def test_unsatisfiable_reservation_fails_within_the_launch_deadline(launched, cluster, placement):
    launched("actor")  # holds every GPU
    started = time.monotonic()
    with pytest.raises(ReservationError, match="could not reserve") as caught:
        Probe.create_group().launch(cluster, placement.get_strategy("actor"), name="second", launch_timeout=2)
    assert time.monotonic() - started < 10
    message = str(caught.value)
    assert "worker group 'second'" in message
    assert "node 0: CPU=4 requested" in message and "GPU=4 requested, 0 free (short by 4)" in message


def test_a_second_driver_attaches_by_address_and_leaves_the_cluster_running(cluster):
    address = ray.get_runtime_context().gcs_address
    script = (
        "import json\n"
        "from rlinfra import Cluster\n"
        f"c = Cluster(cluster_cfg={{'num_nodes': 4, 'address': {address!r}}})\n"
        "print(json.dumps([n.node_id for n in c.nodes]))\n"
        "c.shutdown()\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=90, env=env
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [node.node_id for node in cluster.nodes]
    assert ray.get(ray.put("still here"), timeout=10) == "still here"
    assert len(cluster.dead_node_ranks()) == 0
