"""The two sides of a weight update, as mixins for ``Worker`` classes.

``WeightSender`` (the trainer) packs its state dict into checksummed buckets; ``WeightReceiver``
(a rollout worker) keeps two buffers — *current*, which generation reads, and *shadow*, which an
update fills while generation goes on — and a gate that generation passes through:

    class Rollout(WeightReceiver, Worker):
        def generate(self, prompts):
            with self.serving() as weights:            # blocks only while paused for a swap
                return [Sample(weights.version, ...)]  # every sample carries its version

The gate is a lock with an owner and a lease: a driver that dies while the workers are paused
cannot leave them paused for ever — the pause ends on its own when the lease runs out.
Launch receivers with ``max_concurrency >= 2`` so that staging runs beside generation.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xxhash

from rlinfra.services.weights import cuda_ipc
from rlinfra.services.weights.buckets import (
    BucketSpec,
    Manifest,
    arrays_checksum,
    bucket_views,
    check_arrays,
    checksum,
    copy_and_hash,
    pack,
    plan_buckets,
    unpack,
    unpack_arrays,
)
from rlinfra.services.weights.cuda_ipc import CudaInfo, IpcBucket

DEFAULT_SERVE_TIMEOUT_S = 60.0
# Shared weights' checks: node id -> bucket index -> (object id, checksum of the object's bytes).
NodeChecks = Mapping[str, Mapping[int, tuple[str, int]]]


class WeightsPausedError(TimeoutError):
    """Generation waited longer than its deadline for a paused update to finish."""


class WeightsPauseError(RuntimeError):
    """The gate could not be closed: another update holds it, or generation did not drain in time."""


class WeightsSwapError(RuntimeError):
    """The staged version cannot be made current (not fully staged, or the gate is not ours)."""


class WeightsVerifyError(ValueError):
    """The weights a worker serves are not the version, or not the bytes, the trainer sent."""


@dataclass(frozen=True)
class WeightsView:
    """The weights a piece of generation uses: its version and tensors (read-only views)."""

    version: int
    tensors: Mapping[str, Any]


@dataclass
class _Buffers:
    version: int
    manifest: Manifest | None = None
    # numpy uint8 ("cpu"), torch uint8 on a GPU ("cuda"), or per bucket the list of uint8 arrays
    # Ray mapped from this node's object store ("shared", with the references that keep them).
    buckets: list[Any] = field(default_factory=list)
    refs: list[Any] = field(default_factory=list)
    device: str = "cpu"
    hashed: bool = True  # checksummed as received (WeightSync(checksums=False) turns it off)
    checksums: dict[int, int] = field(default_factory=dict)
    tensors: Mapping[str, Any] = field(default_factory=dict)


class _ReceiverState:
    def __init__(self, initial_version: int, tensors: Mapping[str, Any]) -> None:
        self.lock = threading.Condition()
        self.current = _Buffers(initial_version, tensors=dict(tensors))
        self.shadow: _Buffers | None = None
        self.previous: _Buffers | None = None
        self.paused_by: str | None = None
        self.pause_until = 0.0
        self.closed_at = 0.0  # when the gate last closed (time.monotonic)
        self.in_flight = 0
        self.served: dict[int, int] = {}  # version -> generation calls served with it


class WeightReceiver:
    """Mixin for workers that serve generation from weights the trainer publishes."""

    weights_as_torch = False  # unpack into torch tensors instead of numpy arrays

    # ------------------------------------------------------------------------ generation side
    def _weights(self) -> _ReceiverState:
        state = getattr(self, "_rlinfra_weights", None)
        if state is None:
            state = _ReceiverState(0, {})
            self._rlinfra_weights = state
        return state

    def set_initial_weights(self, tensors: Mapping[str, Any], version: int = 0) -> None:
        """Weights to serve before the first update (e.g. loaded from a checkpoint)."""
        self._rlinfra_weights = _ReceiverState(version, tensors)

    @property
    def weight_version(self) -> int:
        return self._weights().current.version

    @contextmanager
    def serving(self, timeout_s: float = DEFAULT_SERVE_TIMEOUT_S) -> Iterator[WeightsView]:
        """Use the current weights for one piece of generation. Waits (at most ``timeout_s``)
        while an update holds the gate; the version cannot change until the block exits."""
        state = self._weights()
        deadline = time.monotonic() + timeout_s
        with state.lock:
            while state.paused_by is not None:
                now = time.monotonic()
                if now >= state.pause_until:  # the owner's lease ran out: reopen the gate
                    state.paused_by = None
                    state.lock.notify_all()
                    break
                if now >= deadline:
                    raise WeightsPausedError(
                        f"generation waited {timeout_s:g} s for a weight update ({state.paused_by}) to finish"
                    )
                state.lock.wait(min(deadline, state.pause_until) - now)
            state.in_flight += 1
            view = WeightsView(state.current.version, state.current.tensors)
            state.served[view.version] = state.served.get(view.version, 0) + 1
        try:
            yield view
        finally:
            with state.lock:
                state.in_flight -= 1
                state.lock.notify_all()

    def weights_changed(self) -> list[int]:
        """Buckets of the serving version whose bytes no longer hash to what verify accepted.

        Nothing in rlinfra writes to serving weights, but torch views are writable, and shared
        weights (``object_store_shared``) are one copy per node: a worker writing into them
        changes them for every worker on its node. This rehashes every bucket (one pass over the
        weights) to find out. Initial weights, never verified, report nothing.
        """
        state = self._weights()
        with state.lock:
            current = state.current
        changed = []
        for index, bucket in enumerate(current.buckets):
            if index not in current.checksums:
                continue
            if current.device == "shared":
                digest = arrays_checksum(bucket)
            elif current.device == "cuda":
                digest = self._weights_staging().checksum(bucket)
            else:
                digest = checksum(bucket)
            if digest != current.checksums[index]:
                changed.append(index)
        return changed

    # -------------------------------------------------------------------------- update side
    def _weights_begin(self, manifest: Manifest, device: str = "cpu", hashed: bool = True) -> None:
        """Allocate (or reuse) shadow buffers for ``manifest``; generation keeps going.

        ``device="cuda"`` (the CUDA IPC transport) puts them on this worker's current GPU;
        ``device="shared"`` allocates nothing: the buckets will stay in the node's object store.
        """
        state = self._weights()
        with state.lock:
            reusable = state.previous if state.previous is not None else None
            state.previous = None
        shadow = _Buffers(manifest.version, manifest, device=device, hashed=hashed)
        if (
            reusable is not None
            and reusable.manifest is not None
            and reusable.device == device != "shared"
            and _same_layout(reusable.manifest, manifest)
        ):
            shadow.buckets = reusable.buckets  # double buffering: the last-but-one weights' memory
        elif device == "shared":  # dropping ``reusable`` released the last-but-one version's objects
            shadow.buckets = [None] * len(manifest.buckets)
            shadow.refs = [None] * len(manifest.buckets)
        elif device == "cuda":
            import torch

            gpu = torch.cuda.current_device()
            shadow.buckets = [
                torch.empty(bucket.nbytes, dtype=torch.uint8, device=gpu) for bucket in manifest.buckets
            ]
        elif device == "cpu":
            shadow.buckets = [np.empty(bucket.nbytes, dtype=np.uint8) for bucket in manifest.buckets]
        else:
            raise ValueError(f"shadow buffers go on 'cpu', 'cuda' or 'shared', not {device!r}")
        state.shadow = shadow

    def _weights_receive(self, version: int, index: int, payload: list[np.ndarray]) -> int:
        """Copy one bucket's tensors (zero-copy views of the object store) into the shadow
        buffer, checksumming what landed there as it lands (the entries tile the bucket, so this
        is the checksum of the whole shadow bucket)."""
        shadow = self._require_shadow(version)
        target = shadow.buckets[index]
        spec = shadow.manifest.buckets[index]
        check_arrays(payload, spec)
        digest = xxhash.xxh3_64()
        for entry, array in zip(spec.entries, payload, strict=True):
            source = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            landing = target[entry.offset : entry.offset + entry.nbytes]
            if shadow.hashed:
                copy_and_hash(landing, source, digest)
            else:
                np.copyto(landing, source)
        if not shadow.hashed:
            return 0
        shadow.checksums[index] = digest.intdigest()
        return shadow.checksums[index]

    def _weights_map(
        self, version: int, index: int, refs: list[Any], hashers: tuple[int, ...], timeout_s: float
    ) -> tuple[str, int | None]:
        """Keep bucket ``index`` where it is: the read-only arrays Ray maps from this node's
        object store become the shadow (no copy; every worker on the node maps the same bytes).
        The ranks in ``hashers`` (one per node) checksum it for their node.

        Returns the object's id and the checksum (``None`` where this rank did not hash).
        """
        import ray

        shadow = self._require_shadow(version)
        if shadow.device != "shared":
            raise RuntimeError(f"version {version} is staged on {shadow.device!r}, not in the object store")
        (ref,) = refs
        arrays = ray.get(ref, timeout=timeout_s)
        check_arrays(arrays, shadow.manifest.buckets[index])
        shadow.buckets[index], shadow.refs[index] = arrays, ref
        if getattr(self, "_rank", 0) not in hashers:
            return ref.hex(), None
        shadow.checksums[index] = arrays_checksum(arrays)
        return ref.hex(), shadow.checksums[index]

    def _weights_node_id(self) -> str:
        """The Ray node this worker runs on: workers there share one copy of shared weights."""
        node_id = getattr(self, "_rlinfra_node_id", None)
        if node_id is None:
            import ray

            node_id = self._rlinfra_node_id = ray.get_runtime_context().get_node_id()
        return node_id

    def _weights_receive_ipc(self, version: int, index: int, bucket: IpcBucket) -> int:
        """Map the sender's bucket (CUDA IPC, no copy), copy it into the GPU shadow, checksum what
        landed (through a host copy), and drop the mapping so the sender may free the bucket."""
        shadow = self._require_shadow(version)
        if shadow.device != "cuda":
            raise RuntimeError(f"version {version} is staged on {shadow.device!r}, not on a GPU")
        target = shadow.buckets[index]
        if bucket.nbytes != target.numel():
            raise ValueError(f"bucket {index}: got {bucket.nbytes} bytes, expected {target.numel()}")
        source = cuda_ipc.open_bucket(bucket, self._weights_cuda().visible_uuids)
        try:
            target.copy_(source)
            shadow.checksums[index] = self._weights_staging().checksum(target)  # waits for the copy
        finally:
            del source
        return shadow.checksums[index]

    def _weights_cuda_info(self) -> CudaInfo:
        return _cuda_info_here()

    def _weights_cuda(self) -> CudaInfo:
        info = getattr(self, "_rlinfra_cuda", None)
        if info is None:
            info = self._rlinfra_cuda = _cuda_info_here()
        return info

    def _weights_staging(self) -> cuda_ipc.HostStaging:
        staging = getattr(self, "_rlinfra_staging", None)
        if staging is None:
            staging = self._rlinfra_staging = cuda_ipc.HostStaging()
        return staging

    def _weights_receive_broadcast(self, version: int, group_name: str, src: int = 0) -> dict[int, int]:
        """Receive every bucket from a cross-component process group, in bucket order."""
        import torch

        from rlinfra.runtime.rendezvous import cross_group

        shadow = self._require_shadow(version)
        group = cross_group(group_name)
        for index, buffer in enumerate(shadow.buckets):
            group.broadcast(torch.from_numpy(buffer), src=src)
            if shadow.hashed:
                shadow.checksums[index] = checksum(buffer)
        return dict(shadow.checksums)

    def _weights_stage_done(self, version: int) -> None:
        """Build the tensor views of the shadow now, so that the swap itself is O(1)."""
        shadow = self._require_shadow(version)
        tensors: dict[str, Any] = {}
        view = unpack_arrays if shadow.device == "shared" else unpack
        for spec, buffer in zip(shadow.manifest.buckets, shadow.buckets, strict=True):
            if buffer is None:
                raise RuntimeError(f"version {version}: bucket {spec.index} never arrived")
            tensors.update(view(buffer, spec, as_torch=self.weights_as_torch))
        shadow.tensors = tensors

    def _weights_pause(self, owner: str, lease_s: float, drain_timeout_s: float) -> int:
        """Close the gate (owner + lease) and wait for in-flight generation to drain."""
        state = self._weights()
        deadline = time.monotonic() + drain_timeout_s
        with state.lock:
            if state.paused_by is not None and time.monotonic() < state.pause_until:
                raise WeightsPauseError(f"already paused by {state.paused_by}")
            state.closed_at = time.monotonic()
            state.paused_by, state.pause_until = owner, state.closed_at + lease_s
            while state.in_flight:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise WeightsPauseError(
                        f"{state.in_flight} generation call(s) still running after {drain_timeout_s:g} s"
                    )
                state.lock.wait(remaining)
            return state.served.get(state.current.version, 0)

    def _weights_swap(self, owner: str, version: int) -> int:
        """Make the shadow current (O(1)); keep the old current for rollback. Returns the old version."""
        state = self._weights()
        with state.lock:
            self._check_owner(state, owner)
            shadow = state.shadow
            if shadow is None or shadow.version != version or not shadow.tensors:
                raise WeightsSwapError(f"version {version} is not fully staged here")
            state.previous, state.current, state.shadow = state.current, shadow, None
            return state.previous.version

    def _weights_verify(
        self, version: int, expected: Mapping[int, int], node_checks: NodeChecks | None = None
    ) -> dict[str, Any]:
        """The version serving now and the checksum of every bucket as received.

        Shared weights (``device="shared"``) were hashed once per node, each bucket by one of the
        node's workers: ``node_checks`` maps node id → bucket → (object id, checksum), and this
        worker checks that every bucket it serves is the very object hashed on its node.
        """
        state = self._weights()
        with state.lock:
            current = state.current
            foreign: list[int] = []
            if current.device == "shared":
                checked = (node_checks or {}).get(self._weights_node_id(), {})
                for index in expected:
                    object_id, digest = checked.get(index, (None, None))
                    if digest is not None:
                        current.checksums[index] = digest
                    if current.refs[index] is None or current.refs[index].hex() != object_id:
                        foreign.append(index)
            mismatched = sorted(i for i, value in expected.items() if current.checksums.get(i) != value)
            problems = []
            if current.version != version:
                problems.append(f"serving version {current.version} (expected {version})")
            if mismatched:
                problems.append(f"checksum mismatch in bucket(s) {mismatched[:8]}")
            if foreign:
                problems.append(f"bucket(s) {foreign[:8]} are not the objects checked on this node")
            if problems:
                raise WeightsVerifyError("verify failed: " + "; ".join(problems))
            return {"version": current.version, "buckets": len(current.checksums)}

    def _weights_swap_verify(
        self, owner: str, version: int, expected: Mapping[int, int], node_checks: NodeChecks | None = None
    ) -> dict[str, Any]:
        """Swap, then verify, in one call: one round trip less while generation is paused. The
        semantics are those of the two steps in turn (every worker swaps and checks its own bytes;
        any failure anywhere rolls every worker back)."""
        self._weights_swap(owner, version)
        return self._weights_verify(version, expected, node_checks)

    def _weights_pause_swap_verify(
        self,
        owner: str,
        lease_s: float,
        drain_timeout_s: float,
        version: int,
        expected: Mapping[int, int],
        node_checks: NodeChecks | None = None,
    ) -> int:
        """Pause, swap and verify in one call — two round trips while generation is held instead
        of three. The gate stays closed after the swap until resume, which the driver sends only
        once every worker has verified, so no worker serves the new version while another still
        serves the old one, exactly as with a separate pause. Returns what pause returns."""
        drained = self._weights_pause(owner, lease_s, drain_timeout_s)
        self._weights_swap_verify(owner, version, expected, node_checks)
        return drained

    def _weights_rollback(self, owner: str, version: int) -> int:
        """Undo a swap to ``version`` (no-op if it did not happen); drop any staged shadow."""
        state = self._weights()
        with state.lock:
            state.shadow = None
            if state.current.version == version and state.previous is not None:
                state.current, state.previous = state.previous, state.current
            return state.current.version

    def _weights_resume(self, owner: str) -> tuple[int, float]:
        """Reopen the gate (only its owner may). Returns the version now serving and how long, by
        this worker's clock, the gate was closed (0 if it was not closed by ``owner``)."""
        state = self._weights()
        with state.lock:
            held = 0.0
            if state.paused_by == owner:
                state.paused_by = None
                held = time.monotonic() - state.closed_at
                state.lock.notify_all()
            return state.current.version, held

    def _weights_release_previous(self, version: int) -> bool:
        """Version ``version`` is committed everywhere: the one before it can no longer be rolled
        back to. Shared weights drop it now, so between updates a node's store holds one version
        (private buffers keep it as the next shadow's memory). True if something was released."""
        state = self._weights()
        with state.lock:
            previous = state.previous
            if previous is None or previous.device != "shared" or state.current.version != version:
                return False
            state.previous = None
        del previous  # outside the lock: dropping the references talks to Ray
        return True

    def _weights_stats(self) -> dict[str, Any]:
        state = self._weights()
        with state.lock:
            return {"version": state.current.version, "served": dict(state.served), "paused": state.paused_by}

    def _require_shadow(self, version: int) -> _Buffers:
        shadow = self._weights().shadow
        if shadow is None or shadow.version != version:
            raise RuntimeError(f"no staged weights for version {version}")
        return shadow

    @staticmethod
    def _check_owner(state: _ReceiverState, owner: str) -> None:
        if state.paused_by != owner:
            raise WeightsSwapError(f"the update gate is held by {state.paused_by!r}, not {owner!r}")


def _same_layout(first: Manifest, second: Manifest) -> bool:
    return [b.nbytes for b in first.buckets] == [b.nbytes for b in second.buckets]


def _cuda_info_here() -> CudaInfo:
    import ray

    node_id = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
    return cuda_ipc.cuda_info(node_id)


class WeightSender:
    """Mixin for the trainer: ``weights_state()`` returns the state dict to publish."""

    # How long a put waits for Ray to release the bucket two before it (see ``_weights_put``).
    weights_release_wait_s = 1.0

    def weights_state(self) -> Mapping[str, Any]:
        raise NotImplementedError("a WeightSender must implement weights_state() -> {name: tensor}")

    def _weights_open(self, version: int, bucket_bytes: int, hashed: bool = True) -> Manifest:
        """Fix the state to send (a reference, no copy) and its bucket layout, and whether its
        buckets are checksummed."""
        state = self.weights_state()
        self._rlinfra_sending = (version, state, plan_buckets(state, bucket_bytes))
        self._rlinfra_hashed = hashed
        self._rlinfra_puts = _OwnedPuts()
        self._weights_ipc_live().release_all()
        return Manifest(version, self._rlinfra_sending[2])

    def _weights_put(self, version: int, index: int, bounded: bool = True) -> tuple[int, list[Any]]:
        """Put bucket ``index``'s tensors into the object store as they are (one copy, no packing);
        returns the checksum of their bytes and ``[ref]``. ``bounded=False`` (shared weights,
        which stay in the store as the receivers' shadow) skips the wait described below.

        The driver asks for bucket i only once every receiver has copied bucket i - 2 and it has
        dropped its reference, but Ray tells the owner (this process) so asynchronously: without
        waiting for that here, a third bucket was seen alive beside two others in about 1 put of
        25 (``test_object_store_keeps_at_most_two_buckets_alive_while_sending_many`` then fails).
        The wait is usually nil (checksumming this bucket took longer) and at most
        ``weights_release_wait_s``; it keeps the object store's live buckets at two.
        """
        import ray

        state, spec = self._sending(version, index)
        arrays = bucket_views(state, spec)
        # Hashing in a thread beside Ray's copy gained nothing measurable on 2 cores (Ray's put
        # already copies with several threads), so the two run one after the other.
        digest = arrays_checksum(arrays) if getattr(self, "_rlinfra_hashed", True) else 0
        if not bounded:
            return digest, [ray.put(arrays)]
        puts = getattr(self, "_rlinfra_puts", None) or _OwnedPuts()
        puts.wait_released(through=index - 2, timeout_s=self.weights_release_wait_s)
        ref = ray.put(arrays)
        puts.track(index, ref)
        self._rlinfra_puts = puts
        return digest, [ref]

    def _weights_ipc_share(self, version: int, index: int, acked: int) -> tuple[int, IpcBucket]:
        """Pack bucket ``index`` on this GPU and share it by CUDA IPC; every receiver has copied
        the buckets ``<= acked``, which are freed first (so at most two are ever alive).

        Returns the checksum of the packed bytes and the handle receivers map.
        """
        state, spec = self._sending(version, index)
        live = self._weights_ipc_live()
        live.release_through(acked)
        buffer, digest, handle = cuda_ipc.share_bucket(state, spec, self._weights_ipc_staging())
        live.hold(index, buffer, spec.nbytes)
        return digest, handle

    def _weights_ipc_stats(self) -> dict[str, int]:
        """Buckets alive now and at most, since the process started (the memory bound, observed)."""
        live = self._weights_ipc_live()
        return {"live": len(live), "peak_count": live.peak_count, "peak_bytes": live.peak_bytes}

    def _weights_cuda_info(self) -> CudaInfo:
        return _cuda_info_here()

    def _weights_ipc_live(self) -> cuda_ipc.LiveBuckets:
        live = getattr(self, "_rlinfra_ipc_live", None)
        if live is None:
            live = self._rlinfra_ipc_live = cuda_ipc.LiveBuckets()
        return live

    def _weights_ipc_staging(self) -> cuda_ipc.HostStaging:
        staging = getattr(self, "_rlinfra_ipc_staging", None)
        if staging is None:
            staging = self._rlinfra_ipc_staging = cuda_ipc.HostStaging()
        return staging

    def _weights_broadcast(self, version: int, group_name: str) -> dict[int, int]:
        """Send every bucket through a cross-component process group (this rank is its src)."""
        import torch

        from rlinfra.runtime.rendezvous import cross_group

        group = cross_group(group_name)
        digests: dict[int, int] = {}
        buffer: np.ndarray | None = None
        for spec in self._rlinfra_sending[2]:
            state, spec = self._sending(version, spec.index)
            if buffer is None or buffer.nbytes < spec.nbytes:
                buffer = np.empty(spec.nbytes, dtype=np.uint8)
            hashed = getattr(self, "_rlinfra_hashed", True)
            view, digests[spec.index] = pack(state, spec, buffer[: spec.nbytes], hashed)
            group.broadcast(torch.from_numpy(view), src=group.rank)
        return digests

    def _weights_close(self, version: int) -> None:
        """The update is over (staged, or failed): forget the state and free shared buckets."""
        if getattr(self, "_rlinfra_sending", (None,))[0] == version:
            self._rlinfra_sending = None
            self._rlinfra_puts = None
            self._weights_ipc_live().release_all()

    def _sending(self, version: int, index: int) -> tuple[Mapping[str, Any], BucketSpec]:
        sending = getattr(self, "_rlinfra_sending", None)
        if sending is None or sending[0] != version:
            raise RuntimeError(f"no open weight export for version {version}")
        return sending[1], sending[2][index]


class _OwnedPuts:
    """The buckets this process put into the object store, and whether Ray still keeps them.

    The owner's reference table (``get_all_reference_counts``, keyed by hex object id) is what
    decides an object's lifetime: an entry stays while any process still references the object.
    It is a private Ray API, so it is checked on the first put (the object just put must be in
    it) and the wait is skipped if it does not behave as expected.
    """

    def __init__(self) -> None:
        self.keys: dict[int, bytes] = {}
        self.usable: bool | None = None

    def track(self, index: int, ref: Any) -> None:
        key = ref.hex().encode()
        if self.usable is None:
            table = _reference_table()
            self.usable = table is not None and key in table
        self.keys[index] = key

    def wait_released(self, through: int, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until buckets ``<= through`` are released; stop tracking
        them either way. True if they were released (or cannot be observed)."""
        keys = [self.keys.pop(index) for index in sorted(self.keys) if index <= through]
        if not keys or not self.usable:
            return True
        deadline = time.monotonic() + timeout_s
        while True:
            table = _reference_table()
            if table is None or not any(key in table for key in keys):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.0005)


def _reference_table() -> Mapping[bytes, Any] | None:
    try:
        import ray

        return ray._private.worker.global_worker.core_worker.get_all_reference_counts()
    except Exception:  # not in a Ray worker, or Ray changed the private API
        return None
