"""Admission: a replaced or added rollout worker gets the version everyone serves before it serves.

A fresh receiver holds no weights, and ``serving()`` refuses it (``WeightsNotAdmittedError``):
it can never serve a stale or empty version. ``WeightSync.admit(ranks)`` then copies the committed
version from a live peer, worker to worker through the object store (the driver passes only a
reference), and the newcomer checks what it copied against the trainer's checksums of that
version before it takes it:

    peer       ``weights_snapshot``   its serving version as packed buckets (read under the gate's lock)
    newcomer   ``weights_admit``      copy each bucket, hashing as it lands; the version and every
                                       checksum must be the committed ones; then serve it

The trainer is not involved: by the time a rollout worker dies it may have trained further, and
the version to serve is the committed one, which only the rollout workers still hold. A group of
one rollout worker has no peer, so ``WeightSync`` keeps its snapshot of each committed version in
Ray's object store and admits a replacement from that. Initial
weights (set with ``set_initial_weights``, never sent by an update) have no trainer checksums;
they are checked end to end, the newcomer's hashes against the peer's.
"""

from typing import Any

import ray
import xxhash

from rlinfra.runtime.served_asleep import served_asleep
from rlinfra.services.weights import buckets
from rlinfra.services.weights.buffers import Buffers, Expected, check_holds
from rlinfra.services.weights.transports.base import ReceiverSide

SNAPSHOT_FETCH_TIMEOUT_S = 120.0  # a newcomer's wait for its peer's snapshot


class WeightsNotAdmittedError(RuntimeError):
    """A receiver was asked to serve before it was given weights (it was just replaced or added)."""


class AdmissionReceiver(ReceiverSide):
    """A rollout worker's side of admission: give a snapshot (as a peer), take one (as a newcomer)."""

    @served_asleep
    def weights_snapshot(self) -> Buffers:
        """The version this worker serves, as packed buckets with their checksums, in plain
        ``Buffers`` (host memory: a GPU engine's tensors are copied to the host by ``pack``; no
        tensor views, which the newcomer builds on its own copy)."""
        with self._weights() as state:
            current = state.current
        # Packed from the tensors served, in the version's own bucket layout (so the checksums
        # compare with the trainer's); initial weights, never laid out in buckets, get one now.
        specs = current.manifest.buckets or buckets.plan_buckets(current.tensors)
        return Buffers(current.version, buckets.Manifest(current.version, specs)).fill(current.tensors)

    @served_asleep
    def weights_admit(self, source: list[Any], expected: Expected) -> None:
        """Take the snapshot ``source[0]`` refers to (a peer's), verified, as the serving version.

        ``expected`` holds the committed version's checksums; without any (initial weights) the
        peer's are used. Raises ``WeightsVerifyError`` if the version or any bucket differs."""
        snapshot: Buffers = ray.get(source[0], timeout=SNAPSHOT_FETCH_TIMEOUT_S)
        taken = self.private_buffers(snapshot.version, snapshot.manifest)
        taken.allocate(None)
        for index, (target, incoming) in enumerate(zip(taken.buckets, snapshot.buckets, strict=True)):
            digest = xxhash.xxh3_64()
            buckets.copy_and_hash(target, incoming, digest)
            taken.checksums[index] = digest.intdigest()
        check_holds("admission", taken, Expected(expected.version, expected.checksums or snapshot.checksums))
        taken.build_views(self.weights_as_torch)
        self._weights_serve(taken)
