"""The ``"object_store_shared"`` transport: zero-copy on every node, one copy of a version per node.

The receivers keep the buckets where Ray maps them — read-only views of their node's object
store — as their shadow, so a node holds one copy of each version whatever the number of workers
on it, and nothing is copied on a receiver. Each bucket is hashed once per node (by one of its
workers, in turn); at verify every worker checks that it serves exactly the objects hashed on its
node. The store holds two versions while an update runs (serving and staged) and one between
updates (the previous version is released once the new one is committed); a node whose object
store cannot hold two is refused at prepare. Weights are read-only (numpy enforces it; torch
views of them must not be written to). The sender side is the object store's put, unbounded
(``ObjectStoreSender.weights_put(..., bounded=False)``).
"""

from dataclasses import dataclass, field
from typing import Any

import ray

from rlinfra.runtime.calls import GroupCall
from rlinfra.runtime.served_asleep import served_asleep
from rlinfra.services.weights import buckets
from rlinfra.services.weights.buffers import Buffers, Expected, NodeChecks
from rlinfra.services.weights.transports.base import ReceiverSide, Transport
from rlinfra.services.weights.transports.object_store import ObjectStoreSender


@dataclass
class SharedBuffers(Buffers):
    """One version kept where Ray maps it: per bucket the list of read-only uint8 arrays of this
    node's object store, and the reference that keeps them there. ``node_id`` is where they lie."""

    refs: list[Any] = field(default_factory=list)
    node_id: str = ""
    views = staticmethod(buckets.unpack_arrays)

    def allocate(self, spare: Buffers | None) -> None:
        """Nothing to allocate: dropping ``spare`` released the last-but-one version's objects."""
        self.buckets = [None] * len(self.manifest.buckets)
        self.refs = [None] * len(self.manifest.buckets)
        self.node_id = ray.get_runtime_context().get_node_id()

    def digest(self, index: int) -> int:
        return buckets.arrays_checksum(self.buckets[index])

    def adopt_checks(self, expected: Expected) -> list[str]:
        """Each bucket was hashed by one worker of the node: take its checksum, and name the
        buckets this worker serves that are not the very object hashed on its node."""
        checked = (expected.node_checks or {}).get(self.node_id, {})
        foreign = []
        for index in expected.checksums:
            object_id, digest = checked.get(index, (None, None))
            if digest is not None:
                self.checksums[index] = digest
            if self.refs[index] is None or self.refs[index].hex() != object_id:
                foreign.append(index)
        return [f"bucket(s) {foreign[:8]} are not the objects checked on this node"] if foreign else []


class SharedTransport(Transport):
    """The driver: every bucket put once and handed to every receiver at once; the node checks."""

    shadow = SharedBuffers

    def admit(self, manifest: buckets.Manifest) -> None:
        """Shared weights keep two versions in the object store of every node involved while an
        update runs (the serving one, kept for rollback until the commit, and the staged one);
        refuse before anything is sent where a store is smaller, instead of filling it and
        stalling every put."""
        link = self.link
        ranks = {link.sender.node_id_of(link.sender_rank): f"{link.sender.name} rank {link.sender_rank}"}
        for rank in link.alive:
            ranks.setdefault(link.receivers.node_id_of(rank), f"{link.receivers.name} rank {rank}")
        capacity = {n["NodeID"]: n.get("Resources", {}).get("object_store_memory", 0) for n in ray.nodes()}
        needed = 2 * manifest.nbytes
        small = [
            f"the node of {who} ({node_id[:8]}) has {capacity[node_id] / 2**20:.0f} MiB"
            for node_id, who in ranks.items()
            if node_id in capacity and capacity[node_id] < needed
        ]
        if small:
            raise ValueError(
                f"the object_store_shared transport keeps two versions ({needed / 2**20:.0f} MiB) in "
                f"the object store of each node, but {'; '.join(small)}. Use transport='object_store' "
                "(private copies, two buckets in flight) or give the nodes larger object stores."
            )

    def transfer(self, manifest: buckets.Manifest) -> tuple[dict[int, int], NodeChecks]:
        """Every bucket put once and mapped (not copied) by every receiver. The buckets stay in the
        store as the receivers' shadow, so there is no memory to win by holding a put back until
        the receivers are done: the driver hands each bucket out as soon as it is in the store and
        collects the answers at the end. Bucket i is hashed on each node by that node's
        (i mod n)-th worker."""
        link, version = self.link, manifest.version
        by_node: dict[str, list[int]] = {}  # the ranks that take turns hashing, per node (none: unhashed)
        for rank in link.alive if manifest.hashed else ():
            by_node.setdefault(link.receivers.node_id_of(rank), []).append(rank)
        checksums: dict[int, int] = {}
        mapping: list[GroupCall] = []
        unbounded_puts = link.stream(ObjectStoreSender.weights_put, manifest, lambda i: (version, i, False))
        for index, (digest, refs) in unbounded_puts:
            checksums[index] = digest
            hashers = tuple(ranks[index % len(ranks)] for ranks in by_node.values())
            args = (version, index, refs, hashers, link.timeout_s)
            mapping.append(link.receivers_call(SharedReceiver.weights_map, *args))
            del refs, args
        node_checks: dict[str, dict[int, tuple[str, int]]] = {}
        for index, call in enumerate(mapping):
            for rank, (object_id, digest) in zip(call.ranks, link.wait(call), strict=True):
                if digest is not None:
                    node_checks.setdefault(link.receivers.node_id_of(rank), {})[index] = (object_id, digest)
        return checksums, node_checks

    def committed(self, version: int) -> None:
        """Nothing waits for this (generation is already back): the store frees the version
        before, which no rollback needs any more, while the next one is being trained."""
        self.link.receivers_call(SharedReceiver.weights_release_previous, version)


class SharedReceiver(ReceiverSide):
    """A rollout worker's side: buckets kept where Ray maps them, hashed once per node."""

    @served_asleep
    def weights_map(
        self, version: int, index: int, refs: list[Any], hashers: tuple[int, ...], timeout_s: float
    ) -> tuple[str, int | None]:
        """Keep bucket ``index`` where it is: the read-only arrays Ray maps from this node's
        object store become the shadow (no copy; every worker on the node maps the same bytes).
        The ranks in ``hashers`` (one per node) checksum it for their node.

        Returns the object's id and the checksum (``None`` where this rank did not hash).
        """
        shadow = self._weights_shadow(version)
        (ref,) = refs
        arrays = ray.get(ref, timeout=timeout_s)  # checked against the bucket's entries by build_views
        shadow.buckets[index], shadow.refs[index] = arrays, ref
        if getattr(self, "_rank", 0) in hashers:
            shadow.checksums[index] = buckets.arrays_checksum(arrays)
        return ref.hex(), shadow.checksums.get(index)

    @served_asleep
    def weights_release_previous(self, version: int) -> None:
        """Version ``version`` is committed everywhere: the one before it can no longer be rolled
        back to. Shared weights drop it now, so between updates a node's store holds one version
        (private buffers keep it as the next shadow's memory)."""
        with self._weights() as state:
            previous = state.previous
            if not isinstance(previous, SharedBuffers) or state.current.version != version:
                return
            state.previous = None
        del previous  # outside the lock: dropping the references talks to Ray
