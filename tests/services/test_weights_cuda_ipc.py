"""The ``cuda_ipc`` weight transport.

On any machine: its pure pieces (bucket bookkeeping, the driver's acknowledgement loop, the
checks that refuse what CUDA IPC cannot do, handle rewriting, packing on a torch device). On a
machine with a CUDA GPU only: updates end to end, trainer and rollout colocated on GPU 0 (mirrors
the object-store tests in ``test_weights.py``, where the construction errors are checked against
a simulated cluster).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlinfra import Worker
from rlinfra.runtime.layout import Layout
from rlinfra.services.weights import WeightReceiver, WeightSender, WeightSync, WeightSyncError
from rlinfra.services.weights.buckets import (
    BucketSpec,
    Manifest,
    arrays_checksum,
    bucket_views,
    checksum,
    pack_torch,
    plan_buckets,
    unpack,
)
from rlinfra.services.weights.transports.base import Link
from rlinfra.services.weights.transports.cuda_handles import (
    CudaInfo,
    IpcBucket,
    LiveBuckets,
    cuda_info,
    ipc_problems,
    live_buckets,
    local_index,
    node_problems,
    on_device,
)
from rlinfra.services.weights.transports.cuda_ipc import CudaIpcReceiver, CudaIpcSender, CudaIpcTransport

torch = pytest.importorskip("torch")

needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the cuda_ipc transport maps GPU memory: needs a CUDA GPU"
)

# One GPU, shared by the trainer and the rollout worker (0.5 each in one placement group).
CFG = {"cluster": {"num_nodes": 1, "component_placement": {"trainer,rollout": "0"}}}
pytestmark = [pytest.mark.timeout(240), pytest.mark.cluster(CFG)]
BUCKET_BYTES = 256 * 1024


# ------------------------------------------------------------------------ bucket bookkeeping
def test_live_buckets_hold_at_most_two_and_free_what_was_acknowledged():
    live = LiveBuckets()
    live.hold(0, "bucket-0", 100)
    live.hold(1, "bucket-1", 60)
    with pytest.raises(RuntimeError, match=r"buckets \[0, 1\] are not acknowledged yet"):
        live.hold(2, "bucket-2", 100)
    live.release_through(0)
    live.hold(2, "bucket-2", 100)
    assert sorted(live.live) == [1, 2] and live.nbytes == 160
    with pytest.raises(RuntimeError, match="already shared"):
        live.hold(2, "again", 100)
    live.release_through(5)
    assert len(live) == 0
    assert (live.peak_count, live.peak_bytes) == (2, 160)
    live.hold(3, "bucket-3", 10)
    live.release_all()
    assert len(live) == 0


class _FakeSender:
    """The sender's side of the protocol, run in order as a single-threaded Ray actor would."""

    def __init__(self, received: dict[int, int]) -> None:
        self.live = LiveBuckets()
        self.received = received

    def share(self, version: int, index: int, acked: int) -> tuple[int, IpcBucket]:
        receivers = 2
        unfinished = [i for i in self.live.live if i <= acked and self.received.get(i, 0) < receivers]
        assert not unfinished, f"bucket(s) {unfinished} freed before every receiver copied them"
        self.live.release_through(acked)
        self.live.hold(index, f"buffer-{index}", 10)
        return 1000 + index, IpcBucket(index, 10, "gpu-0", print, ())


class _FakeLink(Link):
    """The ``Link`` the CUDA IPC transfer loop drives (its own ``stream``), with in-process fakes
    for the sender and receivers: a sender call runs at once, as the actor would run it next."""

    def __init__(self, sender: _FakeSender, received: dict[int, int]) -> None:
        self.sender = sender
        self.received = received

    def sender_call(self, method, *args):
        assert method is CudaIpcSender.weights_ipc_share
        answer = self.sender.share(*args)
        return SimpleNamespace(wait=lambda: [answer])

    def on_receivers(self, method, *args):
        version, index, bucket = args
        assert version == 3
        assert method is CudaIpcReceiver.weights_receive_ipc and bucket.index == index
        assert index in self.sender.live.live, f"bucket {index} was freed before it was received"
        self.received[index] = self.received.get(index, 0) + 2  # both receivers acknowledge
        return [1000 + index, 1000 + index]


@pytest.mark.parametrize("count", [0, 1, 2, 7])
def test_the_driver_loop_keeps_two_buckets_alive_and_frees_only_acknowledged_ones(count):
    received: dict[int, int] = {}
    sender = _FakeSender(received)
    spec = BucketSpec(0, 10, ())
    checksums, _ = CudaIpcTransport(_FakeLink(sender, received)).transfer(Manifest(3, (spec,) * count))
    assert checksums == {index: 1000 + index for index in range(count)}
    assert received == {index: 2 for index in range(count)}
    assert sender.live.peak_count == min(count, 2)
    assert len(sender.live) == min(count, 2)  # the last ones are freed by weights_close


# --------------------------------------------------------------------------- refusing early
def test_a_version_sent_without_checksums_is_refused_before_anything_is_sent():
    """``checksums`` switched off after construction reaches the transport with the manifest;
    CUDA IPC refuses it at admission, before a bucket is shared."""
    received: dict[int, int] = {}
    transport = CudaIpcTransport(_FakeLink(_FakeSender(received), received))
    transport.admit(Manifest(3, (BucketSpec(0, 10, ()),)))
    with pytest.raises(ValueError, match="the cuda_ipc transport always checksums"):
        transport.admit(Manifest(3, (BucketSpec(0, 10, ()),), hashed=False))
    assert received == {}


def _gpu(uuid: str = "GPU-a", visible: tuple[str, ...] = ("GPU-a", "GPU-b"), pid: int = 1) -> CudaInfo:
    return CudaInfo(True, "", uuid, visible, pid, "node-x")


def test_ipc_problems_name_each_worker_that_cannot_take_part():
    def no_cuda(pid: int) -> CudaInfo:
        return CudaInfo(False, "torch 2.4.0+cpu is built without CUDA", pid=pid, node_id="node-x")

    assert ipc_problems(_gpu(), {0: _gpu(pid=2), 1: _gpu("GPU-b", pid=3)}, "trainer rank 0", "rollout") == []

    receivers = {0: no_cuda(8), 1: no_cuda(9), 2: _gpu(pid=10)}
    problems = ipc_problems(no_cuda(7), receivers, "trainer rank 0", "rollout")
    assert problems == [
        "the sender (trainer rank 0) has no usable CUDA: torch 2.4.0+cpu is built without CUDA",
        "rollout rank(s) 0-1 have no usable CUDA: torch 2.4.0+cpu is built without CUDA",
    ]

    isolated = _gpu("GPU-b", visible=("GPU-b",), pid=4)
    problems = ipc_problems(
        _gpu(), {0: _gpu(pid=2), 1: isolated, 2: _gpu(pid=1)}, "trainer rank 0", "rollout"
    )
    assert len(problems) == 2
    assert "rollout rank(s) 1 cannot see the sender's GPU GPU-a" in problems[0]
    assert "isolate_accelerator=False" in problems[0]
    assert "rollout rank(s) 2 run in the sender's own process" in problems[1]


def test_node_problems_name_the_receivers_on_other_nodes():
    nodes = {0: "node 0", 1: "node 0", 2: "node 1", 3: "node 1", 4: "node 2"}
    (problem,) = node_problems("node 0", nodes, "trainer rank 0", "rollout")
    assert problem.startswith("rollout rank(s) 2-4 are on node 1, node 2, not on the sender's node 0")
    assert "transport='object_store'" in problem
    assert node_problems("node 0", {0: "node 0"}, "trainer rank 0", "rollout") == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the report of a process without CUDA")
def test_cuda_info_says_why_cuda_is_missing():
    info = cuda_info("node-x")
    assert not info.available and info.reason and info.node_id == "node-x"
    assert info.device_uuid is None


# -------------------------------------------------------------------------- handles, packing
def test_a_handle_is_pointed_at_the_receivers_index_of_the_senders_gpu():
    args = tuple(range(15))
    assert on_device(args, 3) == (0, 1, 2, 3, 4, 5, 3, 7, 8, 9, 10, 11, 12, 13, 14)
    with pytest.raises(RuntimeError, match="unexpected CUDA IPC handle layout"):
        on_device(args[:14], 0)
    with pytest.raises(RuntimeError, match="unexpected CUDA IPC handle layout"):
        on_device((*args[:6], "cuda:0", *args[7:]), 0)
    assert local_index("GPU-b", ("GPU-a", "GPU-b")) == 1
    with pytest.raises(RuntimeError, match="the sender's GPU GPU-c is not visible in this process"):
        local_index("GPU-c", ("GPU-a", "GPU-b"))


def mixed_state(device: str = "cpu") -> dict[str, object]:
    return {
        "embed": torch.arange(64 * 32, dtype=torch.float32, device=device).reshape(64, 32),
        "norm": torch.linspace(-2, 2, 40, device=device).to(torch.bfloat16),
        "mask": torch.arange(10, device=device) % 3 == 0,
        "steps": torch.tensor(7, dtype=torch.int64, device=device),  # 0-d
        "empty": torch.zeros((0, 4), dtype=torch.float32, device=device),
        "t": torch.arange(12, dtype=torch.float16, device=device).reshape(3, 4).t(),  # not contiguous
    }


def test_planning_reads_metadata_only_and_agrees_with_numpy():
    on_meta = {name: torch.empty_like(t, device="meta") for name, t in mixed_state().items()}
    as_numpy = {name: t.contiguous().numpy() for name, t in mixed_state().items() if name != "norm"}
    meta_plan = plan_buckets(on_meta, bucket_bytes=4096)  # meta tensors cannot be copied: no copy
    numpy_plan = plan_buckets(as_numpy, bucket_bytes=4096)
    meta_entries = [e for b in meta_plan for e in b.entries if e.name != "norm"]
    assert set(meta_entries) == {e for b in numpy_plan for e in b.entries}
    (bf16,) = [b for b in meta_plan if b.entries[0].name == "norm"]
    assert bf16.entries[0].dtype == "bfloat16" and bf16.nbytes == 80


def test_packing_on_a_torch_device_round_trips_with_the_same_checksums():
    state = mixed_state()
    for spec in plan_buckets(state, bucket_bytes=4096):
        buffer = pack_torch(state, spec, torch.empty(spec.nbytes, dtype=torch.uint8))
        digest = arrays_checksum(bucket_views(state, spec))
        assert checksum(buffer.numpy()) == digest  # what the object store transport would verify
        for name, view in unpack(buffer, spec).items():
            assert view.dtype == state[name].dtype and view.shape == state[name].shape
            assert torch.equal(view, state[name])
            assert view.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()  # a view
    spec = plan_buckets(state, bucket_bytes=4096)[0]
    with pytest.raises(ValueError, match="buffer holds"):
        pack_torch(state, spec, torch.empty(spec.nbytes + 1, dtype=torch.uint8))


# --------------------------------------------------------------------- end to end on a GPU
def make_state(version: int) -> dict[str, object]:
    """Deterministic weights on the current GPU, in five buckets of mixed dtypes."""
    return {
        "embed": torch.full((256, 128), float(version), dtype=torch.float32, device="cuda"),
        "layer.0": torch.full((128, 128), float(version * 2), dtype=torch.bfloat16, device="cuda"),
        "layer.1": torch.full((512, 256), float(version * 3), dtype=torch.float32, device="cuda"),
        "head": torch.full((64,), float(version * 5), dtype=torch.float64, device="cuda"),
        "steps": torch.full((3,), version, dtype=torch.int64, device="cuda"),
    }


class Trainer(WeightSender, Worker):
    def __init__(self) -> None:
        self.state = make_state(0)

    def weights_state(self):
        return self.state

    def train_to(self, version: int) -> None:
        self.state = make_state(version)

    def ipc_stats(self) -> dict[str, int]:
        """Buckets alive now and at most, since the process started (the memory bound, observed)."""
        live = live_buckets()
        return {"live": len(live), "peak_count": live.peak_count, "peak_bytes": live.peak_bytes}


class CorruptingTrainer(Trainer):
    """Flips a byte of bucket 1 on the GPU after checksumming it, as a faulty copy would."""

    def weights_ipc_share(self, version, index, acked):
        digest, handle = super().weights_ipc_share(version, index, acked)
        if index == 1:
            buffer, _ = live_buckets().live[index]
            buffer[7:8].bitwise_xor_(0xFF)
            torch.cuda.synchronize()  # corrupted before any receiver is handed the bucket
        return digest, handle


class Rollout(WeightReceiver, Worker):
    def __init__(self) -> None:
        self.set_initial_weights(make_state(0), version=0)

    def current(self) -> tuple[int, bool, list[str]]:
        """The version served, whether every tensor equals the trainer's, and their devices."""
        with self.serving(timeout_s=5) as weights:
            expected = make_state(weights.version)
            exact = sorted(weights.tensors) == sorted(expected) and all(
                torch.equal(weights.tensors[name], expected[name]) for name in expected
            )
            devices = sorted({weights.tensors[name].device.type for name in expected})
            return weights.version, exact, devices


@pytest.fixture
def colocated(cluster, placement):
    layouts, groups = [], []

    def launch(trainer_cls=Trainer):
        layout = Layout(cluster, placement, ["trainer", "rollout"], num_cpus=0.5)
        layouts.append(layout)
        trainer = trainer_cls.create_group().launch(
            cluster, placement.get_strategy("trainer"), name="trainer", layout=layout, num_cpus=0.5
        )
        groups.append(trainer)
        rollout = Rollout.create_group().launch(
            cluster,
            placement.get_strategy("rollout"),
            name="rollout",
            layout=layout,
            num_cpus=0.5,
            max_concurrency=4,
        )
        groups.append(rollout)
        return trainer, rollout

    yield launch
    for group in groups:
        group.shutdown()
    for layout in layouts:
        layout.release()


def ipc_stats(trainer) -> dict[str, int]:
    return trainer.execute_on(0).ipc_stats().wait(timeout=30)[0]


@needs_gpu
def test_cuda_ipc_update_end_to_end(colocated):
    trainer, rollout = colocated()
    sync = WeightSync(trainer, rollout, transport="cuda_ipc", bucket_bytes=BUCKET_BYTES)
    assert rollout.current().wait(timeout=30) == [(0, True, ["cuda"])]

    trainer.train_to(1).wait()
    prepared = sync.prepare(1)
    sizes = sorted((bucket.nbytes for bucket in prepared.manifest.buckets), reverse=True)
    assert len(sizes) == len(prepared.checksums) == 5
    report = sync.commit(prepared)  # verify compared every bucket's checksum as received
    assert report.version == 1 and sync.version == 1
    assert rollout.current().wait(timeout=30) == [(1, True, ["cuda"])]
    stats = ipc_stats(trainer)
    assert stats["live"] == 0  # every shared bucket was freed when the update closed
    assert stats["peak_count"] == 2 and stats["peak_bytes"] <= sizes[0] + sizes[1]

    for version in (2, 3):  # from version 3 on, the shadow reuses the last-but-one's GPU buffers
        trainer.train_to(version).wait()
        assert sync.update(version).version == version
        assert rollout.current().wait(timeout=30) == [(version, True, ["cuda"])]
    assert ipc_stats(trainer)["peak_count"] == 2


@needs_gpu
def test_cuda_ipc_corrupted_bucket_fails_verify_and_rolls_back(colocated):
    trainer, rollout = colocated(trainer_cls=CorruptingTrainer)
    sync = WeightSync(trainer, rollout, transport="cuda_ipc", bucket_bytes=BUCKET_BYTES)
    trainer.train_to(1).wait()
    with pytest.raises(WeightSyncError) as caught:
        sync.update(1)
    error = caught.value
    assert error.step == "verify"
    assert error.serving_version == 0 and sync.version == 0
    assert "checksum mismatch in bucket(s) [1]" in str(error)
    assert rollout.current().wait(timeout=30) == [(0, True, ["cuda"])]  # resumed, on the old weights
    assert ipc_stats(trainer)["live"] == 0


@needs_gpu
def test_cuda_ipc_a_wrong_byte_is_caught_after_checksums_were_refused_off(colocated):
    """Switching checksums off is refused at prepare (nothing staged, version 1 still served);
    switched back on, the next corrupted update is caught as on the first."""
    trainer, rollout = colocated(trainer_cls=CorruptingTrainer)
    sync = WeightSync(trainer, rollout, transport="cuda_ipc", bucket_bytes=BUCKET_BYTES)
    sync.checksums = False
    trainer.train_to(1).wait()
    with pytest.raises(WeightSyncError, match="the cuda_ipc transport always checksums"):
        sync.update(1)
    sync.checksums = True
    with pytest.raises(WeightSyncError) as caught:
        sync.update(1)
    assert caught.value.step == "verify" and "checksum mismatch in bucket(s) [1]" in str(caught.value)
    assert rollout.current().wait(timeout=30) == [(0, True, ["cuda"])]
