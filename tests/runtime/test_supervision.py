"""Replacing dead workers: ``WorkerGroup.replace`` on a simulated 3-node cluster, with real kills
(``os._exit`` inside the worker, SIGKILL from outside, a killed raylet)."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from rlinfra import Worker, WorkerGroupError
from rlinfra.runtime.supervision import REFUSED, REPLACED, RestartBudgetExhausted, UnreplaceableError

CFG = {
    "cluster": {
        "num_nodes": 3,
        "simulate": "3x2",
        "component_placement": {
            "rollout": {"placement": "0-3", "restart": {"max": 3, "within_s": 600}},
            "fragile": {"placement": "0-1:0", "restart": {"max": 1, "within_s": 600}},
            "doomed": "4-5",
        },
    }
}
pytestmark = [pytest.mark.timeout(180), pytest.mark.cluster(CFG)]


class Probe(Worker):
    def __init__(self, tag: str = "") -> None:
        self.tag = tag
        self.constructed = True

    def identity(self) -> dict:
        return {
            "rank": self._rank,
            "pid": os.getpid(),
            "node": self._cluster_node_rank,
            "devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "master": (os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")),
            "tag": self.tag,
            "incarnation": self.incarnation,
        }

    def die(self) -> None:
        os._exit(3)

    def block(self) -> None:
        threading.Event().wait()


@pytest.fixture
def launched(cluster, placement):
    groups = []

    def launch(component: str, **kwargs):
        group = Probe.create_group(tag=component).launch(
            cluster, placement.get_strategy(component), name=component, **kwargs
        )
        groups.append(group)
        return group

    yield launch
    for group in groups:
        group.shutdown()


def by_rank(group) -> dict[int, dict]:
    return dict(enumerate(group.identity().wait(timeout=30)))


def test_replaced_worker_keeps_rank_node_devices_and_environment(launched):
    group = launched("rollout")
    before = by_rank(group)
    with pytest.raises(WorkerGroupError) as died:
        group.execute_on(1).die().wait(timeout=30)
    assert "died" in died.value.failures[1].reason
    assert group.gone_ranks() == [1]

    restart = group.replace(1, reason="test kill")

    after = by_rank(group)
    assert after[1]["pid"] != before[1]["pid"]
    assert (before[1]["incarnation"], after[1]["incarnation"]) == (0, 1)
    for key in ("rank", "node", "devices", "master", "tag"):
        assert after[1][key] == before[1][key], key
    assert [after[r]["pid"] for r in (0, 2, 3)] == [before[r]["pid"] for r in (0, 2, 3)]
    assert group.worker_info[1]["pid"] == after[1]["pid"]  # what stack_of and gone_ranks use
    assert (restart.component, restart.rank, restart.node_rank) == ("rollout", 1, 0)
    assert restart.outcome == REPLACED
    assert restart.reason == "test kill" and restart.took_s < 30
    assert group.restarts == [restart]


def test_sigkilled_worker_is_found_gone_and_replaced(launched):
    group = launched("rollout")
    victim = by_rank(group)[2]
    os.kill(victim["pid"], signal.SIGKILL)
    with pytest.raises(WorkerGroupError):
        group.identity().wait(timeout=30)
    assert group.gone_ranks() == [2]
    group.replace(2)
    assert by_rank(group)[2]["devices"] == victim["devices"]
    assert group.gone_ranks() == []


def test_a_stuck_worker_is_replaced_by_killing_it_first(launched):
    group = launched("rollout", stuck_after=1.0)
    old_pid = by_rank(group)[3]["pid"]
    with pytest.raises(WorkerGroupError) as stuck:
        group.execute_on(3).block().wait(timeout=30)
    assert stuck.value.kind == "stuck"
    assert group.gone_ranks() == []  # stuck is alive: not for supervision to guess
    group.replace(3, reason="stuck")
    assert by_rank(group)[3]["pid"] != old_pid


def test_restart_budget_spent_is_refused_and_recorded(launched):
    group = launched("fragile")
    assert group.restart_budget.policy.max_restarts == 1
    for _ in range(2):
        with pytest.raises(WorkerGroupError):
            group.execute_on(0).die().wait(timeout=30)
        if not group.restarts:
            group.replace(0)
    with pytest.raises(RestartBudgetExhausted) as spent:
        group.replace(0)
    assert "fragile:0 (node 0)" in str(spent.value) and "1 replacement(s) within 600 s" in str(spent.value)
    assert [attempt.outcome for attempt in group.restarts] == [REPLACED, REFUSED]


def test_ranks_of_a_lost_node_are_unreplaceable(cluster, launched):
    group = launched("doomed")
    blocked = group.block()
    cluster.kill_node(2)
    with pytest.raises(WorkerGroupError) as lost:
        blocked.wait(timeout=30)
    assert all("node 2 was lost" in failure.reason for failure in lost.value.failures.values())
    assert group.gone_ranks() == [0, 1]
    with pytest.raises(UnreplaceableError) as gone:
        group.replace(0)
    assert "doomed:0 (node 2)" in str(gone.value) and "node is gone" in str(gone.value)
    assert group.restarts[-1].outcome == REFUSED


def test_removed_ranks_stop_and_come_back_in_their_bundles(launched):
    group = launched("rollout")
    before = by_rank(group)
    group.remove([3])
    assert group.ranks == [0, 1, 2]
    assert len(group.identity().wait(timeout=30)) == 3  # broadcasts reach the running ranks only
    with pytest.raises(ValueError, match="removed: \\[3\\]"):
        group.execute_on(3)
    group.add([3])
    after = by_rank(group)
    assert group.ranks == [0, 1, 2, 3] and after[3]["pid"] != before[3]["pid"]
    assert (after[3]["devices"], after[3]["node"]) == (before[3]["devices"], before[3]["node"])
    assert after[3]["incarnation"] == 1
    assert group.restarts == []  # elastic changes are not replacements: no budget spent


def test_elastic_changes_that_cannot_be_made_are_refused(launched):
    group = launched("rollout")
    with pytest.raises(ValueError, match="cannot remove every rank"):
        group.remove([0, 1, 2, 3])
    with pytest.raises(ValueError, match="running; cannot add 1"):
        group.add([1])
    group.remove([2])
    with pytest.raises(ValueError, match="cannot replace 2"):
        group.replace(2)
