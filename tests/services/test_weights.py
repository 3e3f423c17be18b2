"""The weight-update version barrier on a simulated 2-node cluster with real Ray actors.

A trainer (rank 0 on node 0) publishes a small state dict in several buckets to four rollout
workers (two per node) that keep generating while new weights are staged. The object store's
memory bound is measured on Ray's own state.

Groups are reused by the next test that asks for the same kind when nothing happened to them
that a reset cannot undo (worker names are unique, so one pair is kept): that test gets them at
version 0 (the trainer's state and every receiver's weights set again, which drops whatever was
staged, paused or served), and makes its own ``WeightSync``. A group that lost a worker or joined
a torch.distributed group (broadcast) is shut down instead.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import ray

from rlinfra import Worker
from rlinfra.services.weights import WeightReceiver, WeightSender, WeightSync, WeightSyncError, filter_stale
from rlinfra.services.weights.buckets import arrays_checksum, bucket_views, checksum, copy_and_hash, pack

CFG = {
    "cluster": {
        "num_nodes": 2,
        "simulate": "2x4",
        "component_placement": {"trainer": "0", "rollout": "1-2,4-5", "local_rollout": "1-2"},
    }
}
pytestmark = [pytest.mark.timeout(240), pytest.mark.cluster(CFG)]
BUCKET_BYTES = 256 * 1024
MIB = 2**20
OBJECT_STORES = ["object_store", "object_store_shared"]  # private copies; zero-copy, one per node


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

    def reset(self) -> None:
        self.train_to(0)

    def reusable(self) -> bool:
        return not _in_process_group()

    def objects_alive(self, object_ids: list[str], expect: int, timeout_s: float = 5.0) -> int:
        """How many of these objects Ray (this process owns what it put) keeps alive: polls, up to
        ``timeout_s``, until it is ``expect`` — borrowers' releases reach the owner asynchronously."""
        deadline = time.monotonic() + timeout_s
        while True:
            table = ray._private.worker.global_worker.core_worker.get_all_reference_counts()
            alive = sum(object_id.encode() in table for object_id in object_ids)
            if alive == expect or time.monotonic() > deadline:
                return alive
            time.sleep(0.01)


class CorruptingTrainer(Trainer):
    """Flips a byte of bucket 1 after checksumming it, as a faulty link would: in what it puts
    (the object stores) and in what it broadcasts. Every version, or those given to ``corrupt``."""

    def __init__(self) -> None:
        super().__init__()
        self.corrupted: set[int] | None = None  # None: every version

    def corrupt(self, versions: list[int]) -> None:
        self.corrupted = set(versions)

    def reset(self) -> None:
        super().reset()
        self.corrupted = None

    def _corrupts(self, version: int, index: int) -> bool:
        return index == 1 and (self.corrupted is None or version in self.corrupted)

    def weights_put(self, version: int, index: int, bounded: bool = True):
        sending = self._weights_sending(version)
        arrays = bucket_views(sending.state, sending.buckets[index])
        digest = arrays_checksum(arrays) if sending.hashed else 0
        if self._corrupts(version, index):
            arrays = [array.copy() for array in arrays]
            arrays[0][7] ^= 0xFF
        return digest, [ray.put(arrays)]

    def weights_broadcast(self, version: int, group_name: str) -> dict[int, int]:
        import torch

        from rlinfra.runtime.process_groups import cross_group

        sending, group, digests = self._weights_sending(version), cross_group(group_name), {}
        for spec in sending.buckets:
            view, digests[spec.index] = pack(sending.state, spec, hashed=sending.hashed)
            if self._corrupts(version, spec.index):
                view[7] ^= 0xFF  # pack made the buffer: ours to write
            group.broadcast(torch.from_numpy(view), src=group.rank)
        return digests


class Rollout(WeightReceiver, Worker):
    def __init__(self, die_on_bucket: int | None = None, private_bucket: int | None = None) -> None:
        self.set_initial_weights(make_state(0), version=0)
        self.die_on_bucket = die_on_bucket
        self.private_bucket = private_bucket

    def reset(self) -> None:
        """Back to a fresh worker's weights: version 0, nothing staged, the gate open."""
        self.set_initial_weights(make_state(0), version=0)

    def reusable(self) -> bool:
        return not _in_process_group()

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

    def weights_receive(self, version, index, payload):
        if self.die_on_bucket == index and self._rank == 3:
            os._exit(9)
        return super().weights_receive(version, index, payload)

    def weights_map(self, version, index, refs, hashers, timeout_s):
        if self.die_on_bucket == index and self._rank == 3:
            os._exit(9)
        if self.private_bucket == index and self._rank == 3:  # serve a corrupted copy of its own
            arrays = [array.copy() for array in ray.get(refs[0])]
            arrays[0][7] ^= 0xFF
            refs = [ray.put(arrays)]
        return super().weights_map(version, index, refs, hashers, timeout_s)

    def hold_serving(self, seconds: float) -> int:
        """A forward pass that takes ``seconds`` (longer than a commit's drain deadline)."""
        with self.serving(timeout_s=5) as weights:
            time.sleep(seconds)
            return weights.version

    def held_checksums(self) -> int:
        """How many buckets of the serving version this worker holds a checksum of."""
        return len(self._weights().current.checksums)

    def in_flight(self) -> int:
        return self._weights().gate.in_flight

    def scribble(self) -> None:
        """What a careless user might do: write into a torch view of the serving weights."""
        import torch

        with self.serving(timeout_s=5) as weights:
            torch.from_numpy(weights.tensors["embed"])[0, 0] = -1.0

    def shared_mapping(self) -> dict:
        """How the serving weights are held: writable or not, object ids, and whether every
        tensor's bytes lie inside a mapping of Ray's object store in this process."""
        state = self._weights()
        with self.serving(timeout_s=5) as weights:
            tensors = list(weights.tensors.values())
        store_ranges = []
        with open("/proc/self/maps") as maps:
            for line in maps:
                if "plasma" in line:
                    start, end = (int(part, 16) for part in line.split()[0].split("-"))
                    store_ranges.append((start, end))
        addresses = [tensor.__array_interface__["data"][0] for tensor in tensors]
        return {
            "writeable": any(tensor.flags.writeable for tensor in tensors),
            "object_ids": [ref.hex() for ref in state.current.refs],
            "in_store": bool(store_ranges)
            and all(any(lo <= a < hi for lo, hi in store_ranges) for a in addresses),
        }


def _in_process_group() -> bool:
    distributed = sys.modules.get("torch.distributed")
    return distributed is not None and distributed.is_available() and distributed.is_initialized()


@pytest.fixture(scope="module")
def idle_groups():
    """(trainer class, component, rollout arguments) → the trainer and rollout group kept for reuse
    (at most one pair: the names ``trainer:0``, ``rollout:<rank>`` are taken while it lives)."""
    idle: dict[tuple, tuple] = {}
    yield idle
    _shut_down(idle)


def _shut_down(idle: dict[tuple, tuple]) -> None:
    for trainer, rollout in idle.values():
        trainer.shutdown()
        rollout.shutdown()
    idle.clear()


@pytest.fixture
def job(cluster, placement, idle_groups):
    used = []

    def launch(trainer_cls=Trainer, component="rollout", rollout_cls=Rollout, **rollout_kwargs):
        key = (trainer_cls, rollout_cls, component, tuple(sorted(rollout_kwargs.items())))
        if key in idle_groups:
            trainer, rollout = idle_groups.pop(key)
            trainer.reset().wait(timeout=30)
            rollout.reset().wait(timeout=30)
        else:
            _shut_down(idle_groups)  # another kind: its names must be free
            trainer = trainer_cls.create_group().launch(
                cluster, placement.get_strategy("trainer"), name="trainer"
            )
            rollout = rollout_cls.create_group(**rollout_kwargs).launch(
                cluster, placement.get_strategy(component), name=component, max_concurrency=4
            )
        used.append((key, trainer, rollout))
        return trainer, rollout

    yield launch
    for key, trainer, rollout in used:
        groups = (trainer, rollout)
        intact = not any(group.gone_ranks() for group in groups)
        if intact and all(all(group.reusable().wait(timeout=30)) for group in groups):
            _shut_down(idle_groups)
            idle_groups[key] = groups
        else:
            trainer.shutdown()
            rollout.shutdown()


def expect_serving(rollout, version: int) -> None:
    assert rollout.current().wait(timeout=10) == [(version, fingerprint(make_state(version)))] * 4


@pytest.mark.parametrize("transport", OBJECT_STORES)
def test_generation_continues_during_prepare_and_no_sample_mixes_versions(job, transport):
    trainer, rollout = job()
    sync = WeightSync(trainer, rollout, transport=transport, bucket_bytes=BUCKET_BYTES)
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
    assert 0 < report.held_s < report.pause_s  # the workers' own clocks: inside the driver's window
    expect_serving(rollout, 1)
    assert rollout.weights_changed().wait(timeout=10) == [[]] * 4  # what verify accepted, still


def test_versions_must_increase_and_staleness_is_bounded(job):
    trainer, rollout = job()
    sync = WeightSync(trainer, rollout, bucket_bytes=BUCKET_BYTES)
    with pytest.raises(ValueError, match="versions must increase"):
        sync.prepare(0)
    samples = [SimpleNamespace(version=v, value=f"s{v}") for v in (0, 1, 2, 3, 3)]
    fresh, dropped = filter_stale(samples, current_version=3, max_staleness=1)
    assert [s.version for s in fresh] == [2, 3, 3] and dropped == 2


@pytest.mark.parametrize("transport", OBJECT_STORES)
def test_corrupted_bucket_fails_verify_and_rolls_everyone_back(job, transport):
    trainer, rollout = job(trainer_cls=CorruptingTrainer)
    sync = WeightSync(trainer, rollout, transport=transport, bucket_bytes=BUCKET_BYTES)
    trainer.train_to(1).wait()
    with pytest.raises(WeightSyncError) as caught:
        sync.update(1)
    error = caught.value
    assert error.step == "verify"
    assert error.serving_version == 0 and sync.version == 0
    assert "checksum mismatch in bucket(s) [1]" in str(error)
    assert error.failed_ranks == [0, 1, 2, 3]
    expect_serving(rollout, 0)  # resumed: serving answers at once, on the old weights


@pytest.mark.parametrize("transport", [*OBJECT_STORES, "broadcast"])
def test_without_checksums_versions_are_still_verified_but_corruption_is_not(job, transport):
    """checksums=False is a trade the user makes knowingly: the same corrupted bucket that fails
    verify by default is now served. Nothing is hashed, the version barrier holds."""
    from rlinfra.runtime import rendezvous

    trainer, rollout = job(trainer_cls=CorruptingTrainer)
    info = None
    if transport == "broadcast":
        info = rendezvous.bring_up_cross(
            "weights", [(trainer, [0]), (rollout, [0, 1, 2, 3])], backend="gloo", timeout_s=30
        )
    try:
        sync = WeightSync(
            trainer,
            rollout,
            transport=transport,
            bucket_bytes=BUCKET_BYTES,
            checksums=False,
            cross_group="weights" if info else None,
        )
        trainer.train_to(1).wait()
        report = sync.update(1)
        assert report.version == 1 and sync.version == 1
        versions = [version for version, _ in rollout.current().wait(timeout=10)]
        assert versions == [1, 1, 1, 1]
        assert rollout.weights_changed().wait(timeout=10) == [[]] * 4  # nothing was hashed to compare
    finally:
        if info is not None:
            rendezvous.tear_down_cross(info)
    with pytest.raises(AssertionError):  # the corrupting trainer flipped a byte of what it sent
        expect_serving(rollout, 1)


ALL_HOST_TRANSPORTS = [*OBJECT_STORES, "broadcast"]


def _sync_over(trainer, rollout, transport: str, checksums: bool):
    """A ``WeightSync`` over ``transport``, and the cross group it needs (or ``None``)."""
    from rlinfra.runtime import rendezvous

    info = None
    if transport == "broadcast":
        info = rendezvous.bring_up_cross(
            "weights", [(trainer, [0]), (rollout, [0, 1, 2, 3])], backend="gloo", timeout_s=30
        )
    cross = "weights" if info else None
    sync = WeightSync(
        trainer,
        rollout,
        transport=transport,
        bucket_bytes=BUCKET_BYTES,
        checksums=checksums,
        cross_group=cross,
    )
    return sync, info


@pytest.mark.parametrize("transport", ALL_HOST_TRANSPORTS)
def test_checksums_switched_on_off_on_between_updates_each_version_verified_as_sent(job, transport):
    """One WeightSync, checksums on, off, on: every update commits. The update sent without
    checksums is verified by its version alone, whatever a receiver hashed (on the shared
    transport the node's hashers were still told to hash it, and verify then held their
    checksums against none sent); the one after it checks every byte again."""
    from rlinfra.runtime import rendezvous

    trainer, rollout = job()
    sync, info = _sync_over(trainer, rollout, transport, checksums=True)
    try:
        for version, checksums in ((1, True), (2, False), (3, True)):
            sync.checksums = checksums
            trainer.train_to(version).wait()
            report = sync.update(version)
            assert report.version == version and report.buckets >= 3
            expect_serving(rollout, version)
            # each version holds its own checksums: every bucket's, or none at all
            assert rollout.held_checksums().wait(timeout=10) == [report.buckets if checksums else 0] * 4
        assert sync.version == 3
        assert rollout.weights_changed().wait(timeout=10) == [[]] * 4
    finally:
        if info is not None:
            rendezvous.tear_down_cross(info)


@pytest.mark.parametrize("transport", ALL_HOST_TRANSPORTS)
def test_a_wrong_byte_is_caught_in_the_update_after_one_without_checksums(job, transport):
    """Checksums off for version 1 (clean), on for version 2, whose bucket 1 arrives with a
    flipped byte: verify catches exactly that bucket on every rank, and everyone is back on 1."""
    from rlinfra.runtime import rendezvous

    trainer, rollout = job(trainer_cls=CorruptingTrainer)
    trainer.corrupt([2]).wait()
    sync, info = _sync_over(trainer, rollout, transport, checksums=False)
    try:
        trainer.train_to(1).wait()
        assert sync.update(1).version == 1
        expect_serving(rollout, 1)
        sync.checksums = True
        trainer.train_to(2).wait()
        with pytest.raises(WeightSyncError) as caught:
            sync.update(2)
    finally:
        if info is not None:
            rendezvous.tear_down_cross(info)
    error = caught.value
    assert error.step == "verify" and error.failed_ranks == [0, 1, 2, 3]
    for rank in range(4):  # each rank names the one corrupted bucket, and nothing else
        assert re.search(
            rf"rank {rank} \(node \d\): WeightsVerifyError: verify failed: "
            r"checksum mismatch in bucket\(s\) \[1\]\n",
            str(error),
        )
    assert error.serving_version == 1 and sync.version == 1
    expect_serving(rollout, 1)


@pytest.mark.parametrize("transport", OBJECT_STORES)
def test_rollout_killed_mid_update_leaves_survivors_consistent(job, transport):
    trainer, rollout = job(die_on_bucket=1)
    sync = WeightSync(trainer, rollout, transport=transport, bucket_bytes=BUCKET_BYTES)
    trainer.train_to(1).wait()
    started = time.monotonic()
    with pytest.raises(WeightSyncError) as caught:
        sync.update(1)
    assert time.monotonic() - started < 20
    assert caught.value.step == "prepare"
    assert caught.value.failed_ranks == [3]
    assert sync.alive == [0, 1, 2] and sync.version == 0
    survivors = rollout.execute_on(0, 1, 2)
    assert survivors.current().wait(timeout=10) == [(0, fingerprint(make_state(0)))] * 3
    report = sync.update(2) if trainer.train_to(2).wait() else None
    assert report.version == 2
    assert survivors.current().wait(timeout=10) == [(2, fingerprint(make_state(2)))] * 3


@pytest.mark.parametrize("transport", OBJECT_STORES)
def test_trainer_error_after_pause_rolls_back_and_resumes(job, transport):
    trainer, rollout = job()
    sync = WeightSync(trainer, rollout, transport=transport, bucket_bytes=BUCKET_BYTES)
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


def test_generation_that_does_not_drain_fails_the_pause_and_everyone_stays_on_the_old_version(job):
    trainer, rollout = job()
    sync = WeightSync(trainer, rollout, bucket_bytes=BUCKET_BYTES, drain_timeout_s=0.5)
    trainer.train_to(1).wait()
    prepared = sync.prepare(1)
    slow = rollout.execute_on(3).hold_serving(3.0)
    deadline = time.monotonic() + 10
    while rollout.execute_on(3).in_flight().wait(timeout=10) != [1]:  # the call has started
        assert time.monotonic() < deadline
    with pytest.raises(WeightSyncError) as caught:
        sync.commit(prepared)  # pause, swap and verify in one call: ranks 0-2 swapped, then back
    assert caught.value.step == "pause" and caught.value.failed_ranks == [3]
    assert "still running after 0.5 s" in str(caught.value)
    assert sync.version == 0
    expect_serving(rollout, 0)
    assert slow.wait(timeout=10) == [0]  # the slow pass finished on the version it started with


def test_ctrl_c_during_an_update_rolls_back_resumes_and_passes_through(job):
    trainer, rollout = job()
    sync = WeightSync(trainer, rollout, bucket_bytes=BUCKET_BYTES)
    trainer.train_to(1).wait()
    prepared = sync.prepare(1)

    def ctrl_c() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # not a WeightSyncError: the caller is stopping
        sync.commit(prepared, while_paused=ctrl_c)
    assert sync.version == 0
    expect_serving(rollout, 0)  # resumed at once, on the old weights


def test_ctrl_c_while_resuming_passes_through(job, monkeypatch):
    """SIGTERM landed in ``resume`` once (CI, 2026-12-03) and the run ended as a failed update
    (status 1) instead of an interrupted one (130)."""
    trainer, rollout = job()
    sync = WeightSync(trainer, rollout, bucket_bytes=BUCKET_BYTES)
    trainer.train_to(1).wait()
    prepared = sync.prepare(1)
    call = rollout.call

    def ctrl_c_on_resume(method, *args, **kwargs):
        if method is WeightReceiver.weights_resume:
            raise KeyboardInterrupt
        return call(method, *args, **kwargs)

    monkeypatch.setattr(rollout, "call", ctrl_c_on_resume)
    with pytest.raises(KeyboardInterrupt):
        sync.commit(prepared)


def test_a_paused_gate_reopens_when_its_lease_runs_out(job):
    _, rollout = job()
    rollout.call(WeightReceiver.weights_pause, [0], args=("a-driver-that-died", 0.5, 5.0)).wait(timeout=10)
    started = time.monotonic()
    assert rollout.execute_on(0).current().wait(timeout=10)[0][0] == 0
    assert 0.2 < time.monotonic() - started < 5


def test_broadcast_transport_over_a_cross_component_group(job):
    from rlinfra.runtime import rendezvous

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


class BroadcastDyingRollout(Rollout):
    def weights_receive_broadcast(self, version, group_name, src=0):
        if self._rank == 3:
            os._exit(9)
        return super().weights_receive_broadcast(version, group_name, src)


def test_broadcast_with_a_receiver_killed_names_it_and_leaves_survivors_consistent(job):
    """The sender sees only "connection closed by peer"; the error must name the rollout worker
    that died, drop it, and say that the cross group needs bringing up again."""
    from rlinfra import WorkerGroupError
    from rlinfra.runtime import rendezvous

    trainer, rollout = job(rollout_cls=BroadcastDyingRollout)
    info = rendezvous.bring_up_cross(
        "weights", [(trainer, [0]), (rollout, [0, 1, 2, 3])], backend="gloo", timeout_s=30
    )
    sync = WeightSync(
        trainer, rollout, transport="broadcast", cross_group="weights", bucket_bytes=BUCKET_BYTES
    )
    trainer.train_to(1).wait()
    started = time.monotonic()
    with pytest.raises(WeightSyncError) as caught:
        sync.update(1)
    assert time.monotonic() - started < 20
    error = caught.value
    assert error.step == "prepare" and error.failed_ranks == [3]
    assert "rank 3 (node 1): the worker process died" in str(error)
    assert "lost a member: bring it up again" in str(error)
    assert sync.alive == [0, 1, 2] and sync.version == 0
    survivors = rollout.execute_on(0, 1, 2)
    assert survivors.current().wait(timeout=10) == [(0, fingerprint(make_state(0)))] * 3
    with pytest.raises(WorkerGroupError, match="rank 3"):  # the dead member cannot leave
        rendezvous.tear_down_cross(info)


# ------------------------------------------------------------------ the object store's memory bound
OBJECT_OVERHEAD = 4096  # per object in the store: the pickled list around a bucket's arrays


def big_state(version: int) -> dict[str, np.ndarray]:
    """12 MiB in 1 MiB tensors: twelve buckets of exactly 1 MiB with ``bucket_bytes=MIB``."""
    return {f"layers.{i}": np.full((MIB // 4,), version * 100 + i, dtype=np.float32) for i in range(12)}


class MeasuringTrainer(Trainer):
    """Records the most bytes of one update's buckets that Ray keeps alive at once.

    This process owns every bucket it puts, and the owner's reference table is what decides an
    object's lifetime (an entry stays while the driver or a receiver still references the object).
    A bucket only becomes alive at a put, so reading the table right after each put sees the peak.
    """

    def __init__(self) -> None:
        self.state = big_state(0)
        self.peak = (0, 0)

    def train_to(self, version: int) -> None:
        self.state = big_state(version)

    def weights_open(self, version, bucket_bytes, hashed=True):
        self.put_keys: dict[bytes, int] = {}
        return super().weights_open(version, bucket_bytes, hashed)

    def weights_put(self, version, index):
        digest, (ref,) = super().weights_put(version, index)
        self.put_keys[ref.hex().encode()] = self._weights_sending(version).buckets[index].nbytes
        table = ray._private.worker.global_worker.core_worker.get_all_reference_counts()
        alive = [nbytes for key, nbytes in self.put_keys.items() if key in table]
        self.peak = max(self.peak, (sum(alive), len(alive)))
        return digest, [ref]

    def put_peak(self) -> tuple[int, int]:
        return self.peak


class StorePoller:
    """Polls one node's raylet for its object store figures (``GetNodeStats``, what ``ray memory``
    reads) from a thread: the peak of pinned primary copies, which live objects hold, and of all
    bytes used, which also counts freed objects Ray has not deleted yet (it batches deletions)."""

    def __init__(self, node_id: str) -> None:
        from ray._private.grpc_utils import init_grpc_channel
        from ray.core.generated import node_manager_pb2, node_manager_pb2_grpc

        node = next(node for node in ray.nodes() if node["NodeID"] == node_id)
        channel = init_grpc_channel(f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}")
        self._stub = node_manager_pb2_grpc.NodeManagerServiceStub(channel)
        self._request = node_manager_pb2.GetNodeStatsRequest(include_memory_info=False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self.samples = 0
        self.peak_primary = 0
        self.peak_used = 0

    def _poll(self) -> None:
        while not self._stop.is_set():
            stats = self._stub.GetNodeStats(self._request, timeout=10).store_stats
            self.samples += 1
            self.peak_primary = max(self.peak_primary, stats.object_store_bytes_primary_copy)
            self.peak_used = max(self.peak_used, stats.object_store_bytes_used)
            time.sleep(0.002)

    def __enter__(self) -> StorePoller:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


# ------------------------------------------------------------- shared weights (object_store_shared)
def test_shared_weights_are_the_object_store_bytes_one_object_per_bucket_for_everyone(job):
    trainer, rollout = job()
    sync = WeightSync(trainer, rollout, transport="object_store_shared", bucket_bytes=BUCKET_BYTES)
    trainer.train_to(1).wait()
    report = sync.update(1)
    expect_serving(rollout, 1)
    mappings = rollout.shared_mapping().wait(timeout=10)
    # Every worker, on both nodes, serves read-only views lying inside its mapping of Ray's object
    # store (not a copy in its own heap), of the same objects: one per bucket, put once.
    assert all(m["in_store"] and not m["writeable"] for m in mappings)
    assert len({tuple(m["object_ids"]) for m in mappings}) == 1
    assert len(mappings[0]["object_ids"]) == report.buckets >= 3
    # Later versions bring new objects; once a version is committed, the one before it (kept
    # until then for rollback) is released, so between updates the store holds one version.
    held = [mappings[0]["object_ids"]]
    for version in (2, 3):
        trainer.train_to(version).wait()
        sync.update(version)
        expect_serving(rollout, version)
        held.append(rollout.shared_mapping().wait(timeout=10)[0]["object_ids"])
        assert len(held[-1]) == report.buckets and not set(held[-1]) & set(held[-2])
    assert trainer.objects_alive(held[2], expect=len(held[2])).wait()[0] == len(held[2])
    assert trainer.objects_alive(held[0] + held[1], expect=0).wait()[0] == 0


def test_shared_weights_one_copy_per_node_a_write_shows_on_the_node_and_is_detected(job):
    trainer, rollout = job()
    sync = WeightSync(trainer, rollout, transport="object_store_shared", bucket_bytes=BUCKET_BYTES)
    trainer.train_to(1).wait()
    sync.update(1)
    assert rollout.weights_changed().wait(timeout=10) == [[]] * 4
    rollout.execute_on(0).scribble().wait(timeout=10)
    # Rank 0 wrote into its view: rank 1 (same node) serves the same bytes, so sees it too;
    # node 1 pulled its own copy when the update arrived and is untouched. Bucket 0 holds "embed".
    assert rollout.weights_changed().wait(timeout=10) == [[0], [0], [], []]
    first = rollout.current().wait(timeout=10)
    assert first[0][1] == first[1][1] != fingerprint(make_state(1)) == first[2][1] == first[3][1]


def test_shared_weights_outlive_the_trainer_that_put_them(job):
    """The trainer owns the objects; when it dies Ray frees them, but the store does not reuse
    memory a worker still maps: the rollouts keep serving intact weights."""
    trainer, rollout = job()
    sync = WeightSync(trainer, rollout, transport="object_store_shared", bucket_bytes=BUCKET_BYTES)
    trainer.train_to(1).wait()
    sync.update(1)
    ray.kill(trainer.actors[0])
    # Fill most of the driver's node's store (150 MiB) so that freed memory would be handed out
    # again: ranks 0 and 1 map the trainer's primary copies there.
    churn = [ray.put(np.full(4 * MIB, 0xAB, dtype=np.uint8)) for _ in range(25)]
    assert rollout.current().wait(timeout=10) == [(1, fingerprint(make_state(1)))] * 4
    mappings = rollout.shared_mapping().wait(timeout=10)
    assert all(m["in_store"] for m in mappings)
    del churn


def test_shared_weights_a_worker_serving_an_unchecked_copy_fails_verify(job):
    """Bucket 0 is hashed on node 1 by rank 2; rank 3 swaps in a corrupted copy of its own. Its
    node's checksum is right, so only the identity check can catch it — and must."""
    trainer, rollout = job(private_bucket=0)
    sync = WeightSync(trainer, rollout, transport="object_store_shared", bucket_bytes=BUCKET_BYTES)
    trainer.train_to(1).wait()
    with pytest.raises(WeightSyncError) as caught:
        sync.update(1)
    assert caught.value.step == "verify" and caught.value.failed_ranks == [3]
    assert "bucket(s) [0] are not the objects checked on this node" in str(caught.value)
    expect_serving(rollout, 0)


def test_object_store_keeps_at_most_two_buckets_alive_while_sending_many(job):
    trainer, rollout = job(trainer_cls=MeasuringTrainer)
    sync = WeightSync(trainer, rollout, bucket_bytes=MIB)
    with StorePoller(trainer.worker_info[0]["node_id"]) as poller:
        for version in (1, 2, 3):
            trainer.train_to(version).wait()
            assert sync.update(version).buckets == 12
    assert rollout.current().wait(timeout=10) == [(3, fingerprint(big_state(3)))] * 4

    # The owner's view, exact: bucket i is alive while the receivers copy it and bucket i+1 is put.
    peak_bytes, peak_count = trainer.put_peak().wait()[0]
    assert (peak_bytes, peak_count) == (2 * MIB, 2)
    # The raylet's view, sampled: pinned primary copies on the trainer's node. At least one bucket
    # was seen in flight (the poller observes something), never more than two.
    assert poller.samples >= 10
    assert MIB <= poller.peak_primary <= 2 * (MIB + OBJECT_OVERHEAD)


class BigTrainer(Trainer):
    """80 MiB of zeros (never touched: no memory is used) — more than half a 150 MiB store."""

    def __init__(self) -> None:
        self.state = {"w": np.zeros(80 * MIB // 4, dtype=np.float32)}


def test_shared_weights_refuse_a_store_that_cannot_hold_two_versions(job):
    trainer, rollout = job(trainer_cls=BigTrainer)
    sync = WeightSync(trainer, rollout, transport="object_store_shared", bucket_bytes=16 * MIB)
    with pytest.raises(WeightSyncError) as caught:
        sync.update(1)
    message = str(caught.value)
    assert caught.value.step == "prepare" and sync.version == 0
    assert "keeps two versions (160 MiB)" in message and "the node of trainer rank 0" in message
    assert "Use transport='object_store'" in message
    expect_serving(rollout, 0)


def test_copy_and_hash_equals_copy_then_checksum():
    import xxhash

    source = np.random.default_rng(0).integers(0, 256, 3 * 1024 + 17, dtype=np.uint8)
    for chunk in (1, 1000, 1024, 10**6):
        target = np.zeros_like(source)
        digest = xxhash.xxh3_64()
        copy_and_hash(target, source, digest, chunk=chunk)
        assert np.array_equal(target, source) and digest.intdigest() == checksum(source)


def test_shared_buckets_are_viewed_in_place_read_only_arrays_included():
    """What a receiver of shared weights builds from the arrays Ray maps: typed views, no copy,
    for every dtype (bfloat16 too), and numpy keeps them read-only."""
    import torch

    from rlinfra.services.weights.buckets import bucket_views, plan_buckets, unpack_arrays

    state = {
        "embed": torch.arange(64 * 32, dtype=torch.float32).reshape(64, 32),
        "norm": torch.linspace(-2, 2, 40).to(torch.bfloat16),
        "mask": torch.arange(10) % 3 == 0,
        "steps": torch.tensor(7, dtype=torch.int64),
    }
    for spec in plan_buckets(state, bucket_bytes=4096):
        mapped = [array.copy() for array in bucket_views(state, spec)]  # as if from the store
        for array in mapped:
            array.flags.writeable = False
        as_torch = unpack_arrays(mapped, spec, as_torch=True)
        as_numpy = unpack_arrays(mapped, spec)
        for (name, view), array in zip(as_torch.items(), mapped, strict=True):
            assert view.dtype == state[name].dtype and view.shape == state[name].shape
            assert torch.equal(view, state[name])
            assert view.data_ptr() == array.ctypes.data  # a view of the mapped bytes, not a copy
            assert not as_numpy[name].flags.writeable
        with pytest.raises(ValueError, match="expected"):
            unpack_arrays(mapped[:-1] if len(mapped) > 1 else [mapped[0][:-1]], spec)
