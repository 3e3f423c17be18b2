"""torch.distributed rendezvous over launched worker groups, on a simulated 2-node cluster.

No CUDA here, so every process group is gloo (the simulated GPUs only set CUDA_VISIBLE_DEVICES).
One cluster and two GPU groups (trainer, rollout: ranks 0-1 on node 0, 2-3 on node 1) are shared by
the module; tests that break a rendezvous launch a small CPU-only group of their own.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import time

import pytest
import ray

from rlinfra import Worker, WorkerGroupError
from rlinfra.runtime import process_groups
from rlinfra.runtime.calls import GroupCall, wait_all
from rlinfra.runtime.process_groups import cross_group
from rlinfra.runtime.rendezvous import bring_up, bring_up_cross, tear_down, tear_down_cross

pytest.importorskip("torch")

CFG = {
    "cluster": {
        "num_nodes": 2,
        "simulate": "2x4",
        "component_placement": {
            "trainer": "0-1,4-5",
            "rollout": "2-3,6-7",
            "flaky": {"node_group": "node", "placement": "0-1:0-2"},
        },
    }
}
pytestmark = [pytest.mark.timeout(180), pytest.mark.cluster(CFG)]
WEIGHTS = [0.5, 1.5, 2.5, 3.5, 4.5, 5.5]


class Peer(Worker):
    """A process that takes part in collectives on the default group or on a cross group."""

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def all_reduce_rank(self) -> float:
        import torch
        import torch.distributed as dist

        value = torch.tensor([float(self._rank + 1)])
        dist.all_reduce(value)
        return value.item()

    def exchange(self, name: str, weights: list[float] | None = None) -> dict:
        """Cross rank 0 sends ``weights``, everyone receives them, then sums cross ranks."""
        import torch

        group = cross_group(name)
        tensor = torch.tensor(weights) if weights is not None else torch.zeros(len(WEIGHTS))
        group.broadcast(tensor, src=0)
        total = group.all_reduce(torch.tensor([float(group.rank)]))
        group.barrier()
        return {
            "rank": group.rank,
            "world": group.world_size,
            "weights": tensor.tolist(),
            "sum": total.item(),
        }

    def spoil_rendezvous(self, rank: int) -> None:
        if self._rank == rank:
            os.environ["WORLD_SIZE"] = "three"


@pytest.fixture(scope="module")
def launch(cluster, placement):
    groups = []

    def start(component: str):
        group = Peer.create_group().launch(cluster, placement.get_strategy(component), name=component)
        groups.append(group)
        return group

    yield start
    for group in groups:
        group.shutdown()


@pytest.fixture(scope="module")
def trainer(launch):
    return launch("trainer")


@pytest.fixture(scope="module")
def rollout(launch):
    return launch("rollout")


@pytest.fixture
def trainer_up(trainer):
    bring_up(trainer, timeout_s=30)
    yield trainer
    tear_down(trainer)


@pytest.fixture
def flaky(cluster, placement):
    group = Peer.create_group().launch(cluster, placement.get_strategy("flaky"), name="flaky")
    yield group
    group.shutdown()


def bind_error(port: int) -> int | None:
    """The errno of binding ``port`` here (simulated nodes share this host), None if it binds.

    With ``SO_REUSEADDR``, as servers (torch's store included) bind: only a listener blocks it,
    not the TIME_WAIT connections a closed server leaves behind."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError as error:
            return error.errno
    return None


def test_rank0_holds_the_master_port_until_the_process_group_takes_it(trainer):
    _, port = trainer.master_address
    assert bind_error(port) == errno.EADDRINUSE
    bring_up(trainer, timeout_s=30)
    assert trainer.all_reduce_rank().wait() == [10.0] * 4
    assert bind_error(port) == errno.EADDRINUSE  # now torch's store listens on the same socket
    tear_down(trainer)
    deadline = time.monotonic() + 5
    while bind_error(port) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert bind_error(port) is None, "tear_down must free the port"
    _, fresh = trainer.master_address
    assert fresh != port and bind_error(fresh) == errno.EADDRINUSE


def test_gloo_all_reduce_across_two_nodes(trainer_up, cluster):
    nodes = trainer_up.node_id().wait()
    assert nodes == [cluster.nodes[0].node_id] * 2 + [cluster.nodes[1].node_id] * 2
    assert trainer_up.all_reduce_rank().wait() == [10.0] * 4


def test_cross_group_broadcasts_trainer_weights_to_every_rollout_worker(trainer_up, rollout):
    info = bring_up_cross("weights", [(trainer_up, [0]), (rollout, [3, 2, 1, 0])], timeout_s=30)
    try:
        assert info.world_size == 5 and info.backend == "gloo"
        assert info.cross_ranks == {("trainer", 0): 0, **{("rollout", rank): 1 + rank for rank in range(4)}}
        sent = trainer_up.execute_on(0).exchange("weights", WEIGHTS)
        received = rollout.exchange("weights").wait(timeout=30)
        assert sent.wait(timeout=30)[0]["rank"] == 0
        assert [r["rank"] for r in received] == [1, 2, 3, 4]
        assert all(r["weights"] == WEIGHTS and r["world"] == 5 and r["sum"] == 10.0 for r in received)
        assert trainer_up.all_reduce_rank().wait() == [10.0] * 4  # the default group is untouched
    finally:
        tear_down_cross(info)


def test_rank_failing_in_bring_up_is_named_within_seconds(flaky):
    flaky.spoil_rendezvous(2).wait()
    started = time.monotonic()
    with pytest.raises(WorkerGroupError) as caught:
        bring_up(flaky, timeout_s=10)
    assert time.monotonic() - started < 5
    error = caught.value
    assert error.failed_ranks == [2]
    assert error.failures[2].node_rank == 1
    assert "WORLD_SIZE='three' is not an integer" in error.failures[2].reason
    assert error.pending == [0, 1]  # still waiting in the store for rank 2


def test_dead_member_of_a_cross_group_is_named_before_the_other_group_times_out(trainer, flaky):
    ray.kill(flaky.actors[1], no_restart=True)
    started = time.monotonic()
    with pytest.raises(WorkerGroupError) as caught:
        bring_up_cross("doomed", [(trainer, [1]), (flaky, [0, 1, 2])], timeout_s=10)
    assert time.monotonic() - started < 5
    assert caught.value.group == "flaky" and caught.value.failed_ranks == [1]
    assert "process died" in caught.value.failures[1].reason


def test_cross_members_are_checked_before_anything_starts(trainer, rollout):
    with pytest.raises(ValueError, match=r"'rollout' has launched ranks 0-3; cannot take ranks \[4\]"):
        bring_up_cross("bad", [(trainer, [0]), (rollout, [4])])
    with pytest.raises(ValueError, match=r"repeated: \[0\]"):
        bring_up_cross("bad", [(trainer, [0]), (trainer, [0, 1])])
    with pytest.raises(ValueError, match="at least one member"):
        bring_up_cross("bad", [])


def test_a_member_that_never_answers_fails_at_the_driver_deadline(cluster, trainer):
    @ray.remote(num_cpus=0)
    def stuck() -> None:
        time.sleep(30)

    ref = stuck.remote()
    call = GroupCall(trainer, "joining cross group 'late'", [ref], [3], 1.0)
    started = time.monotonic()
    with pytest.raises(WorkerGroupError, match=r"rank 3 \(node 1\): no answer within 0\.2 s"):
        wait_all([call], 0.2)
    assert time.monotonic() - started < 2
    ray.cancel(ref, force=True)


def test_worker_side_errors_say_what_is_missing(monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(RuntimeError, match="MASTER_ADDR is not set: init_process_group runs inside"):
        process_groups.init_process_group()
    with pytest.raises(KeyError, match="not in cross group 'weights'"):
        cross_group("weights")
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match=r"pip install rlinfra\[torch\]"):
        process_groups.default_backend()
