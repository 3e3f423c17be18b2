"""Admission: a rollout worker killed for real, replaced into its bundle, serves nothing until
``WeightSync.admit`` gives it the committed version, verified; then it takes part in updates."""

from __future__ import annotations

import os

import numpy as np
import pytest

from rlinfra import Worker, WorkerGroupError
from rlinfra.services.weights import WeightReceiver, WeightSender, WeightSync, WeightSyncError

CFG = {
    "cluster": {"num_nodes": 2, "simulate": "2x4", "component_placement": {"trainer": "0", "rollout": "1-3"}}
}
pytestmark = [pytest.mark.timeout(240), pytest.mark.cluster(CFG)]
TRANSPORTS = ["object_store", "object_store_shared"]


def make_state(version: int) -> dict[str, np.ndarray]:
    return {
        "embed": np.full((128, 64), version, dtype=np.float32),
        "head": np.full((32,), version * 3, dtype=np.float64),
    }


class Trainer(WeightSender, Worker):
    def __init__(self) -> None:
        self.state = make_state(0)

    def weights_state(self):
        return self.state

    def train_to(self, version: int) -> None:
        self.state = make_state(version)


class Rollout(WeightReceiver, Worker):
    def __init__(self) -> None:
        if self.incarnation == 0:  # a replaced worker waits for admission instead
            self.set_initial_weights(make_state(0), version=0)

    def current(self) -> tuple[int, float]:
        with self.serving(timeout_s=5) as weights:
            return weights.version, float(np.asarray(weights.tensors["head"])[0])

    def die(self) -> None:
        os._exit(5)

    def corrupt_serving(self) -> None:
        """Flip a byte of the serving bucket, as a stray write would."""
        with self._weights() as state:
            state.current.buckets[0][3] ^= 0xFF


@pytest.fixture
def job(cluster, placement):
    groups = []

    def launch(transport: str):
        trainer = Trainer.create_group().launch(cluster, placement.get_strategy("trainer"), name="trainer")
        rollout = Rollout.create_group().launch(
            cluster, placement.get_strategy("rollout"), name="rollout", max_concurrency=2
        )
        groups.extend([trainer, rollout])
        sync = WeightSync(trainer, rollout, transport=transport, bucket_bytes=16 * 1024, step_timeout_s=30)
        return trainer, rollout, sync

    yield launch
    for group in groups:
        group.shutdown()


def update(trainer, sync, version: int) -> None:
    trainer.train_to(version).wait()
    sync.update(version)


def kill_and_replace(rollout, rank: int) -> None:
    """A real death, then a replacement (incarnation 1: it starts without weights)."""
    with pytest.raises(WorkerGroupError):
        rollout.execute_on(rank).die().wait(timeout=30)
    assert rollout.gone_ranks() == [rank]
    rollout.replace(rank)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_replaced_worker_serves_nothing_until_admitted_then_the_committed_version(job, transport):
    trainer, rollout, sync = job(transport)
    update(trainer, sync, 1)
    update(trainer, sync, 2)
    kill_and_replace(rollout, 1)

    with pytest.raises(WorkerGroupError) as refused:
        rollout.execute_on(1).current().wait(timeout=30)
    assert "WeightsNotAdmittedError" in str(refused.value) and "rollout:1 has no weights yet" in str(
        refused.value
    )

    assert sync.admit([1]) == 2
    assert rollout.current().wait(timeout=30) == [(2, 6.0)] * 3
    update(trainer, sync, 3)  # the newcomer takes part in the next update like the others
    assert rollout.current().wait(timeout=30) == [(3, 9.0)] * 3


def test_admission_checks_the_copy_against_the_committed_checksums(job):
    trainer, rollout, sync = job("object_store")
    update(trainer, sync, 1)
    rollout.execute_on(0).corrupt_serving().wait(timeout=30)  # rank 0 is the peer copied from
    kill_and_replace(rollout, 2)
    with pytest.raises(WeightSyncError) as failed:
        sync.admit([2])
    assert failed.value.step == "admit" and "checksum mismatch in bucket(s) [0]" in str(failed.value)
    with pytest.raises(WorkerGroupError):  # still serving nothing, never the corrupted copy
        rollout.execute_on(2).current().wait(timeout=30)


def test_initial_weights_are_admitted_checked_end_to_end(job):
    _, rollout, sync = job("object_store")
    kill_and_replace(rollout, 0)  # no update yet: the peers serve the initial weights
    assert sync.admit([0]) == 0
    assert rollout.current().wait(timeout=30) == [(0, 0.0)] * 3


def test_a_staged_version_must_be_abandoned_before_admission(job):
    trainer, rollout, sync = job("object_store")
    trainer.train_to(1).wait()
    sync.prepare(1)
    kill_and_replace(rollout, 1)
    with pytest.raises(RuntimeError, match="version 1 is staged"):
        sync.admit([1])
    assert sync.abandon() == 1
    assert sync.admit([1]) == 0
    sync.commit(sync.prepare(1))  # staged again, now on all three
    assert rollout.current().wait(timeout=30) == [(1, 3.0)] * 3
