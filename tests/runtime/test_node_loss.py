"""A simulated node that dies (its raylet killed, as in a crash) surfaces as a WorkerGroupError
naming every rank it held, within seconds, and the driver lives on; restarted, the node takes its
rank back and workers are placed on it again."""

from __future__ import annotations

import threading
import time

import pytest
import ray

from rlinfra import Cluster, ComponentPlacement, Worker, WorkerGroupError
from rlinfra.runtime.errors import ClusterError

CFG = {"cluster": {"num_nodes": 3, "simulate": "3x2", "component_placement": {"trainer": "0-5"}}}
pytestmark = [pytest.mark.timeout(120), pytest.mark.cluster(CFG)]


class Blocker(Worker):
    def block(self) -> None:
        threading.Event().wait()

    def ping(self) -> int:
        return self._rank


def test_killed_node_names_its_ranks_within_five_seconds(cluster):
    placement = ComponentPlacement(CFG, cluster)
    group = Blocker.create_group().launch(cluster, placement.get_strategy("trainer"), name="trainer")
    try:
        assert group.ping().wait() == list(range(6))
        call = group.block()
        started = time.monotonic()
        cluster.kill_node(2)
        with pytest.raises(WorkerGroupError) as caught:
            call.wait(timeout=60)
        assert time.monotonic() - started < 5.0
        error = caught.value
        assert error.failed_ranks == [4, 5]
        assert all(f.node_rank == 2 and "node 2 was lost" in f.reason for f in error.failures.values())
        assert error.pending == [0, 1, 2, 3]
        assert cluster.dead_node_ranks() == {2}
        assert ray.get(ray.put(41), timeout=10) == 41  # the driver lives on, Ray still serves it
    finally:
        group.shutdown()


def test_a_restarted_node_takes_its_rank_back_and_workers_again(cluster):
    """After the loss above: node 2 comes back with a new node id, under the same rank, with its
    devices; a group launched again puts ranks 4-5 there, as before the loss."""
    lost_id = cluster.nodes[2].node_id
    assert cluster.dead_node_ranks() == {2}
    cluster.restart_node(2)
    assert cluster.dead_node_ranks() == set()
    assert cluster.nodes[2].node_id != lost_id and cluster.nodes[2].rank == 2
    with pytest.raises(ClusterError, match="node 2 is running"):
        cluster.restart_node(2)
    with pytest.raises(ClusterError, match="node 0 is the head"):
        cluster.restart_node(0)
    attached = Cluster(cluster_cfg=CFG["cluster"])  # on the Ray it did not start
    with pytest.raises(ClusterError, match="cannot kill node: this Cluster is attached"):
        attached.kill_node(2)
    placement = ComponentPlacement(CFG, cluster)
    group = Blocker.create_group().launch(cluster, placement.get_strategy("trainer"), name="trainer")
    try:
        assert group.ping().wait() == list(range(6))
        rank_of = {node.node_id: node.rank for node in cluster.nodes}
        assert [rank_of[info["node_id"]] for info in group.worker_info] == [0, 0, 1, 1, 2, 2]
    finally:
        group.shutdown()
