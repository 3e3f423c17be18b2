"""The two sides of a weight update, as mixins for ``Worker`` classes.

``WeightSender`` (the trainer) fixes the state dict to send and its bucket layout when the driver
opens an update; ``WeightReceiver`` (a rollout worker) keeps two buffers — *current*, which
generation reads, and *shadow*, which an update fills while generation goes on (``buffers``) —
and a gate that generation passes through (``gate``):

    class Rollout(WeightReceiver, Worker):
        def generate(self, prompts):
            with self.serving() as weights:            # blocks only while paused for a swap
                return [Sample(weights.version, ...)]  # every sample carries its version

The gate is a lock with an owner and a lease: a driver that dies while the workers are paused
cannot leave them paused for ever — the pause ends on its own when the lease runs out.
Launch receivers with ``max_concurrency >= 2`` so that staging runs beside generation.

The steps the barrier calls (open and close; begin, stage done, pause, swap, verify, rollback,
resume) are here; the steps that move bytes are the transports' sides, which these mixins are
made of (``transports/``).
"""

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from rlinfra.runtime.served_asleep import served_asleep
from rlinfra.services.weights.admission import AdmissionReceiver, WeightsNotAdmittedError
from rlinfra.services.weights.buckets import Manifest, plan_buckets
from rlinfra.services.weights.buffers import Buffers, Expected, WeightsView
from rlinfra.services.weights.transports.base import Sending
from rlinfra.services.weights.transports.broadcast import BroadcastReceiver, BroadcastSender
from rlinfra.services.weights.transports.object_store import ObjectStoreReceiver, ObjectStoreSender
from rlinfra.services.weights.transports.shared import SharedReceiver

DEFAULT_SERVE_TIMEOUT_S = 60.0


class WeightReceiver(AdmissionReceiver, ObjectStoreReceiver, SharedReceiver, BroadcastReceiver):
    """Mixin for workers that serve generation from weights the trainer publishes.

    ``weights_as_torch = True`` (a class attribute) unpacks into torch tensors instead of numpy
    arrays. Until it has weights (``set_initial_weights``, or ``WeightSync.admit`` for a replaced
    or added worker) a receiver serves nothing: ``serving()`` raises ``WeightsNotAdmittedError``.
    """

    # ------------------------------------------------------------------------ generation side
    @contextmanager
    def serving(self, timeout_s: float = DEFAULT_SERVE_TIMEOUT_S) -> Iterator[WeightsView]:
        """Use the current weights for one piece of generation. Waits (at most ``timeout_s``)
        while an update holds the gate; the version cannot change until the block exits."""
        if getattr(self, "_rlinfra_weights", None) is None:
            raise WeightsNotAdmittedError(
                f"{getattr(self, '_worker_name', type(self).__name__)} has no weights yet: a replaced or "
                "added worker serves nothing until WeightSync.admit gives it the serving version"
            )
        with self._weights() as state:
            state.gate.enter(timeout_s)
            view = WeightsView(state.current.version, state.current.tensors)
        try:
            yield view
        finally:
            with state:
                state.gate.leave()

    @served_asleep
    def weights_changed(self) -> list[int]:
        """Buckets of the serving version whose bytes no longer hash to what verify accepted.

        Nothing in rlinfra writes to serving weights, but torch views are writable, and shared
        weights (``object_store_shared``) are one copy per node: a worker writing into them
        changes them for every worker on its node. This rehashes every bucket (one pass over the
        weights) to find out. Initial weights, never verified, report nothing.
        """
        with self._weights() as state:
            current = state.current
        return [i for i in sorted(current.checksums) if current.digest(i) != current.checksums[i]]

    # -------------------------------------------------------------------------- update side
    @served_asleep
    def weights_begin(self, manifest: Manifest, kind: type[Buffers] = Buffers) -> None:
        """Stage ``manifest`` into a new shadow of buffers ``kind`` (the transport's), reusing the
        last-but-one version's memory where it can; generation keeps going. The shadow hashes
        what lands only if the manifest says the version is checksummed."""
        with self._weights() as state:
            spare, state.previous = state.previous, None
        kind = self.private_buffers if kind is Buffers else kind
        shadow = kind(manifest.version, manifest)
        shadow.allocate(spare)
        state.shadow = shadow

    @served_asleep
    def weights_stage_done(self, version: int) -> None:
        """Build the tensor views of the shadow now, so that the swap itself is O(1)."""
        self._weights_shadow(version).build_views(self.weights_as_torch)

    @served_asleep
    def weights_pause(self, owner: str, lease_s: float, drain_timeout_s: float) -> None:
        """Close the gate (owner + lease) and wait for in-flight generation to drain."""
        with self._weights() as state:
            state.gate.close(owner, lease_s, drain_timeout_s)

    @served_asleep
    def weights_swap(self, owner: str, version: int) -> None:
        """Make the shadow current (O(1)); keep the old current for rollback."""
        with self._weights() as state:
            state.swap(owner, version)

    @served_asleep
    def weights_verify(self, expected: Expected) -> None:
        """Check the version serving now and the checksum of every bucket as received against
        what the sender sent (``Buffers.adopt_checks``: shared weights, hashed once per node,
        check that every bucket served is the very object hashed on this node)."""
        with self._weights() as state:
            state.verify(expected)

    @served_asleep
    def weights_swap_verify(self, owner: str, expected: Expected) -> None:
        """Swap, then verify, in one call: one round trip less while generation is paused. The
        semantics are those of the two steps in turn (every worker swaps and checks its own bytes;
        any failure anywhere rolls every worker back)."""
        self.weights_swap(owner, expected.version)
        self.weights_verify(expected)

    @served_asleep
    def weights_pause_swap_verify(
        self, owner: str, lease_s: float, drain_timeout_s: float, expected: Expected
    ) -> None:
        """Pause, swap and verify in one call — two round trips while generation is held instead
        of three. The gate stays closed after the swap until resume, which the driver sends only
        once every worker has verified, so no worker serves the new version while another still
        serves the old one, exactly as with a separate pause."""
        self.weights_pause(owner, lease_s, drain_timeout_s)
        self.weights_swap_verify(owner, expected)

    @served_asleep
    def weights_rollback(self, version: int) -> None:
        """Undo a swap to ``version`` (no-op if it did not happen); drop any staged shadow."""
        with self._weights() as state:
            state.rollback(version)

    @served_asleep
    def weights_resume(self, owner: str) -> tuple[int, float]:
        """Reopen the gate (only its owner may). Returns the version now serving and how long, by
        this worker's clock, the gate was closed (0 if it was not closed by ``owner``)."""
        with self._weights() as state:
            return state.current.version, state.gate.open(owner)


class WeightSender(ObjectStoreSender, BroadcastSender):
    """Mixin for the trainer: ``weights_state()`` returns the state dict to publish."""

    @served_asleep
    def weights_state(self) -> Mapping[str, Any]:
        raise NotImplementedError("a WeightSender must implement weights_state() -> {name: tensor}")

    @served_asleep
    def weights_open(self, version: int, bucket_bytes: int, hashed: bool = True) -> Manifest:
        """Fix the state to send (a reference, no copy) and its bucket layout, and whether its
        buckets are checksummed."""
        state = self.weights_state()
        self._weights_forget()
        self._rlinfra_sending = Sending(version, state, plan_buckets(state, bucket_bytes), hashed)
        return Manifest(version, self._rlinfra_sending.buckets, hashed)

    @served_asleep
    def weights_close(self, version: int) -> None:
        """The update is over (staged, or failed): forget the state and free shared buckets."""
        sending = getattr(self, "_rlinfra_sending", None)
        if sending is not None and sending.version == version:
            self._weights_forget()
