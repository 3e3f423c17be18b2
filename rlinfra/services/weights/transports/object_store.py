"""The ``"object_store"`` transport (the default): buckets through Ray's object store, one at a time.

    per bucket i   sender    put bucket i's tensors as they are (one copy, no packing), checksummed
                   receivers copy it into a private shadow, hashing what lands as it lands
                   driver    asks for bucket i + 1 while the receivers copy bucket i

So at most two buckets are alive in the store: the sender waits for Ray to release bucket i - 2
before putting bucket i. Zero-copy reads on one node; works across nodes. Freed buckets stay in
the store, evictable, until Ray's batched deletion (about a second) or a new object needs the room.
"""

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import ray
import xxhash

from rlinfra.runtime.deadline import Deadline
from rlinfra.runtime.served_asleep import served_asleep
from rlinfra.services.weights import buckets
from rlinfra.services.weights.transports.base import ReceiverSide, SenderSide, Transport


class ObjectStoreTransport(Transport):
    """The driver: one bucket in flight to the receivers, the next one being put meanwhile."""

    def transfer(self, manifest: buckets.Manifest) -> tuple[dict[int, int], None]:
        """One bucket at a time through the object store; the sender puts bucket i+1 while the
        receivers copy bucket i, so at most two buckets are in flight."""
        link, version = self.link, manifest.version
        checksums: dict[int, int] = {}
        puts = link.stream(ObjectStoreSender.weights_put, manifest, lambda i: (version, i))
        for index, (digest, (ref,)) in puts:
            checksums[index] = digest
            link.on_receivers(ObjectStoreReceiver.weights_receive, version, index, ref)
            del ref
        return checksums, None


class ObjectStoreSender(SenderSide):
    """The trainer's side: each bucket put into the object store, at most two alive."""

    # How long a put waits for Ray to release the bucket two before it (see ``weights_put``).
    weights_release_wait_s = 1.0
    _rlinfra_puts: dict[int, bytes] | None = None  # hex object id of each bucket put and maybe alive

    @served_asleep
    def weights_put(self, version: int, index: int, bounded: bool = True) -> tuple[int, list[Any]]:
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
        sending = self._weights_sending(version)
        arrays = buckets.bucket_views(sending.state, sending.buckets[index])
        # Hashing in a thread beside Ray's copy gained nothing measurable on 2 cores (Ray's put
        # already copies with several threads), so the two run one after the other.
        digest = buckets.arrays_checksum(arrays) if sending.hashed else 0
        if not bounded:
            return digest, [ray.put(arrays)]
        puts = self._rlinfra_puts = self._rlinfra_puts or {}
        _wait_released([puts.pop(i) for i in sorted(puts) if i <= index - 2], self.weights_release_wait_s)
        ref = ray.put(arrays)
        puts[index] = ref.hex().encode()
        return digest, [ref]

    def _weights_forget(self) -> None:
        super()._weights_forget()
        self._rlinfra_puts = None


class ObjectStoreReceiver(ReceiverSide):
    """A rollout worker's side: each bucket copied into the private shadow, hashed as it lands."""

    @served_asleep
    def weights_receive(self, version: int, index: int, payload: list[np.ndarray]) -> None:
        """Copy one bucket's tensors (zero-copy views of the object store) into the shadow
        buffer, checksumming what landed there as it lands (the entries tile the bucket, so this
        is the checksum of the whole shadow bucket)."""
        shadow = self._weights_shadow(version)
        target, spec = shadow.buckets[index], shadow.manifest.buckets[index]
        buckets.check_arrays(payload, spec)
        digest = xxhash.xxh3_64() if shadow.manifest.hashed else None
        for entry, array in zip(spec.entries, payload, strict=True):
            source = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            buckets.copy_and_hash(target[entry.offset : entry.offset + entry.nbytes], source, digest)
        if digest is not None:
            shadow.checksums[index] = digest.intdigest()


def _wait_released(keys: list[bytes], timeout_s: float) -> None:
    """Wait (at most ``timeout_s``) until Ray no longer keeps the objects this process put under
    ``keys`` (hex object ids). The owner's reference table (``get_all_reference_counts``) is what
    decides an object's lifetime: an entry stays while any process still references the object. It
    is a private Ray API: where it is missing, or does not hold the objects at all (Ray changed it),
    nothing is waited for."""
    deadline = Deadline.after(timeout_s)
    while keys and not deadline.expired:
        table = _reference_table()
        if table is None or not any(key in table for key in keys):
            return
        time.sleep(0.0005)


def _reference_table() -> Mapping[bytes, Any] | None:
    try:
        return ray._private.worker.global_worker.core_worker.get_all_reference_counts()  # type: ignore[attr-defined]
    except Exception:  # not in a Ray worker, or Ray changed the private API
        return None
