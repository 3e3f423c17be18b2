"""The weight-update version barrier on a simulated 2-node cluster with real Ray actors.

A trainer (rank 0 on node 0) publishes a small state dict in several buckets to four rollout
workers (two per node) that keep generating while new weights are staged.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import ray

from rlinfra import Worker
from rlinfra.services.weights import (
    Stamped,
    WeightReceiver,
    WeightSender,
    WeightSync,
    WeightSyncError,
    filter_stale,
)
from rlinfra.services.weights.buckets import bucket_arrays

pytestmark = pytest.mark.timeout(240)

CFG = {
    "cluster": {
        "num_nodes": 2,
        "simulate": "2x4",
        "component_placement": {"trainer": "0", "rollout": "1-2,4-5"},
    }
}
BUCKET_BYTES = 256 * 1024


def make_state(version: int) -> dict[str, np.ndarray]:
    """Deterministic weights for a version: every tensor is filled with a function of it."""
    return {
        "embed": np.full((256, 128), version, dtype=np.float32),
        "layer.0": np.full((128, 128), version * 2, dtype=np.float32),
        "layer.1": np.full((128, 128), version * 3, dtype=np.float32),
        "head": np.full((64,), version * 5, dtype=np.float64),
        "steps": np.full((3,), version, dtype=np.int64),
    }


def fingerprint(tensors) -> tuple:
    return tuple(float(np.asarray(tensors[name]).reshape(-1)[0]) for name in sorted(tensors))


class Trainer(WeightSender, Worker):
    def __init__(self) -> None:
        self.state = make_state(0)

    def weights_state(self):
        return self.state

    def train_to(self, version: int) -> None:
        self.state = make_state(version)


class CorruptingTrainer(Trainer):
    """Flips a byte of bucket 1 after checksumming it, as a faulty link would."""

    def _weights_put(self, version: int, index: int):
        state, spec = self._sending(version, index)
        arrays, digest = bucket_arrays(state, spec)
        if index == 1:
            arrays = [array.copy() for array in arrays]
            arrays[0][7] ^= 0xFF
        return digest, [ray.put(arrays)]


class Rollout(WeightReceiver, Worker):
    def __init__(self, die_on_bucket: int | None = None) -> None:
        self.set_initial_weights(make_state(0), version=0)
        self.die_on_bucket = die_on_bucket

    def generate_for(self, seconds: float) -> list[tuple]:
        samples = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with self.serving(timeout_s=30) as weights:
                first = fingerprint(weights.tensors)
                time.sleep(0.002)  # the "forward pass": weights must not change underneath it
                last = fingerprint(weights.tensors)
                samples.append((weights.version, time.time(), first, last))
        return samples

    def current(self) -> tuple[int, tuple]:
        with self.serving(timeout_s=5) as weights:
            return weights.version, fingerprint(weights.tensors)

    def _weights_receive(self, version, index, payload):
        if self.die_on_bucket == index and self._rank == 3:
            os._exit(9)
        return super()._weights_receive(version, index, payload)


@pytest.fixture
def job(cluster, placement):
    groups = []

    def launch(trainer_cls=Trainer, **rollout_kwargs):
        trainer = trainer_cls.create_group().launch(
            cluster, placement.get_strategy("trainer"), name="trainer"
        )
        rollout = Rollout.create_group(**rollout_kwargs).launch(
            cluster, placement.get_strategy("rollout"), name="rollout", max_concurrency=4
        )
        groups.extend([trainer, rollout])
        return trainer, rollout

    yield launch
    for group in groups:
        group.shutdown()


def expect_serving(rollout, version: int) -> None:
    assert rollout.current().wait(timeout=10) == [(version, fingerprint(make_state(version)))] * 4


def test_generation_continues_during_prepare_and_no_sample_mixes_versions(job):
    trainer, rollout = job()
    sync = WeightSync(trainer, rollout, bucket_bytes=BUCKET_BYTES)
    generation = rollout.generate_for(4.0)
    time.sleep(0.5)  # let generation get going on version 0 (pacing, not synchronisation)
    trainer.train_to(1).wait()
    staging_started = time.time()
    prepared = sync.prepare(1)
    staging_ended = time.time()
    report = sync.commit(prepared)
    samples = [sample for per_rank in generation.wait(timeout=30) for sample in per_rank]

    assert report.version == 1 and sync.version == 1
    assert report.buckets >= 3
    during = [s for s in samples if s[0] == 0 and staging_started <= s[1] <= staging_ended]
    assert during, "generation must keep running on the old weights while version 1 is staged"
    for version, _, first, last in samples:
        assert first == last == fingerprint(make_state(version))  # one version per sample
    assert {s[0] for s in samples} <= {0, 1}
    assert report.pause_s < report.total_s
    expect_serving(rollout, 1)


def test_versions_must_increase_and_staleness_is_bounded(job):
    trainer, rollout = job()
    sync = WeightSync(trainer, rollout, bucket_bytes=BUCKET_BYTES)
    with pytest.raises(ValueError, match="versions must increase"):
        sync.prepare(0)
    samples = [Stamped(v, f"s{v}") for v in (0, 1, 2, 3, 3)]
    fresh, dropped = filter_stale(samples, current_version=3, max_staleness=1)
    assert [s.version for s in fresh] == [2, 3, 3] and dropped == 2


def test_corrupted_bucket_fails_verify_and_rolls_everyone_back(job):
    trainer, rollout = job(trainer_cls=CorruptingTrainer)
    sync = WeightSync(trainer, rollout, bucket_bytes=BUCKET_BYTES)
    trainer.train_to(1).wait()
    with pytest.raises(WeightSyncError) as caught:
        sync.update(1)
    error = caught.value
    assert error.step == "verify"
    assert error.serving_version == 0 and sync.version == 0
    assert "checksum mismatch in bucket(s) [1]" in str(error)
    assert error.failed_ranks == [0, 1, 2, 3]
    expect_serving(rollout, 0)  # resumed: serving answers at once, on the old weights


def test_rollout_killed_mid_update_leaves_survivors_consistent(job):
    trainer, rollout = job(die_on_bucket=1)
    sync = WeightSync(trainer, rollout, bucket_bytes=BUCKET_BYTES)
    trainer.train_to(1).wait()
    started = time.monotonic()
    with pytest.raises(WeightSyncError) as caught:
        sync.update(1)
    assert time.monotonic() - started < 20
    assert caught.value.step == "prepare"
    assert caught.value.failed_ranks == [3]
    assert sync.alive == [0, 1, 2] and sync.version == 0
    survivors = rollout.execute_on([0, 1, 2])
    assert survivors.current().wait(timeout=10) == [(0, fingerprint(make_state(0)))] * 3
    report = sync.update(2) if trainer.train_to(2).wait() else None
    assert report.version == 2
    assert survivors.current().wait(timeout=10) == [(2, fingerprint(make_state(2)))] * 3


def test_trainer_error_after_pause_rolls_back_and_resumes(job):
    trainer, rollout = job()
    sync = WeightSync(trainer, rollout, bucket_bytes=BUCKET_BYTES)
    trainer.train_to(1).wait()
    prepared = sync.prepare(1)

    def trainer_fails() -> None:
        raise RuntimeError("trainer lost its optimizer state")

    with pytest.raises(WeightSyncError, match="failed at 'while paused'") as caught:
        sync.commit(prepared, while_paused=trainer_fails)
    assert isinstance(caught.value.cause, RuntimeError)
    expect_serving(rollout, 0)
    # The next attempt works: nothing was left half-done.
    report = sync.update(2) if trainer.train_to(2).wait() else None
    assert report.version == 2
    expect_serving(rollout, 2)


def test_a_paused_gate_reopens_when_its_lease_runs_out(job):
    _, rollout = job()
    ray.get(rollout.actors[0]._weights_pause.remote("a-driver-that-died", 0.5, 5.0), timeout=10)
    started = time.monotonic()
    assert rollout.execute_on([0]).current().wait(timeout=10)[0][0] == 0
    assert 0.2 < time.monotonic() - started < 5


def test_broadcast_transport_over_a_cross_component_group(job):
    from rlinfra import rendezvous

    trainer, rollout = job()
    info = rendezvous.bring_up_cross(
        "weights", [(trainer, [0]), (rollout, [0, 1, 2, 3])], backend="gloo", timeout_s=30
    )
    try:
        sync = WeightSync(
            trainer, rollout, transport="broadcast", cross_group="weights", bucket_bytes=BUCKET_BYTES
        )
        trainer.train_to(3).wait()
        report = sync.update(3)
        assert report.version == 3
        expect_serving(rollout, 3)
    finally:
        rendezvous.tear_down_cross(info)
