"""What every transport is made of: a driver side (``Transport``) and the worker sides it calls.

A transport module holds all three sides of one way of moving a version's buckets:

    driver     a ``Transport`` subclass: ``transfer`` moves every bucket into the receivers'
               shadows through a ``Link`` (the sending rank and the receivers still alive);
               ``shadow`` is the ``Buffers`` kind the receivers stage the version in
    sender     a ``SenderSide`` mixin: the methods the driver calls on the trainer
    receiver   a ``ReceiverSide`` mixin: the methods the driver calls on the rollout workers

``WeightSender`` and ``WeightReceiver`` are made of every transport's mixins; the barrier
(prepare → pause → swap → verify → resume) never asks which transport it drives. Calls go by
method (``link.on_receivers(ObjectStoreReceiver.weights_receive, ...)``), never by name.
"""

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from rlinfra.runtime.calls import GroupCall
from rlinfra.runtime.errors import WorkerGroupError
from rlinfra.runtime.group import WorkerGroup
from rlinfra.runtime.served_asleep import served_asleep
from rlinfra.services.weights.buckets import BucketSpec, Manifest
from rlinfra.services.weights.buffers import Buffers, DoubleBuffers, NodeChecks


def gone_ranks(error: BaseException) -> list[int]:
    """The ranks a failed call found gone (their process or node), not merely failing."""
    failures = error.failures.items() if isinstance(error, WorkerGroupError) else []
    return [rank for rank, failure in failures if failure.gone]


@dataclass(eq=False)
class Link:
    """The sending rank and the receivers still in the update, each call under one deadline.

    A call that finds receivers gone (their process or node) drops them from ``alive``: they take
    no further part, as they serve nothing.
    """

    sender: WorkerGroup
    sender_rank: int
    receivers: WorkerGroup
    timeout_s: float

    def __post_init__(self) -> None:
        self.alive = list(self.receivers.ranks)

    def sender_call(self, method: Callable[..., Any], *args: Any) -> GroupCall:
        """``method`` started on the sending rank; ``wait()[0]`` is its answer."""
        return self.sender.call(method, [self.sender_rank], args=args, timeout=self.timeout_s)

    def on_sender(self, method: Callable[..., Any], *args: Any) -> Any:
        return self.sender_call(method, *args).wait()[0]

    def stream(
        self, method: Callable[..., Any], manifest: Manifest, args_of: Callable[[int], tuple[Any, ...]]
    ) -> Iterator[tuple[int, Any]]:
        """The sending rank's answers to ``method(*args_of(i))`` for every bucket i, in order. Bucket
        i + 1 is asked for before bucket i is handed out, so the sender prepares the next bucket
        while the receivers take this one; bucket i is dropped before i + 2 is asked for."""
        count = len(manifest.buckets)
        pending = [self.sender_call(method, *args_of(0))] if count else []
        for index in range(count):
            answer = pending.pop().wait()[0]  # popped: the call's reference goes with it
            if index + 1 < count:
                pending.append(self.sender_call(method, *args_of(index + 1)))
            yield index, answer
            del answer

    def receivers_call(self, method: Callable[..., Any], *args: Any) -> GroupCall:
        """``method`` started on every receiver still alive; ``wait`` it with ``Link.wait``."""
        return self.receivers.call(method, self.alive, args=args, timeout=self.timeout_s)

    def on_receivers(self, method: Callable[..., Any], *args: Any) -> list[Any]:
        return self.wait(self.receivers_call(method, *args))

    def wait(self, call: GroupCall) -> list[Any]:
        """The receivers' answers; on a failure, forget the ones that are gone, then raise."""
        try:
            return call.wait()
        except WorkerGroupError as error:
            self.forget_dead(error)
            raise

    def forget_dead(self, error: WorkerGroupError) -> None:
        """Ranks whose process or node is gone take no further part (they serve nothing)."""
        dead_nodes = self.receivers.cluster.dead_node_ranks()
        gone = set(gone_ranks(error))
        gone |= {rank for rank in self.alive if self.receivers.node_rank_of(rank) in dead_nodes}
        self.alive[:] = [rank for rank in self.alive if rank not in gone]


class Transport:
    """The driver side of one transport. ``shadow`` is the kind of buffers receivers stage in."""

    shadow: ClassVar[type[Buffers]] = Buffers

    def __init__(self, link: Link, cross_group: str | None = None) -> None:
        self.link = link
        self.cross_group = cross_group

    def check(self, checksums: bool) -> None:
        """Refuse at construction, before any update, what cannot work (here: nothing)."""

    def admit(self, manifest: Manifest) -> None:
        """Refuse, before anything is staged, a version this transport cannot take (here: none)."""

    def transfer(self, manifest: Manifest) -> tuple[dict[int, int], NodeChecks | None]:
        """Move every bucket into the receivers' shadows; returns the sender's checksums, and for
        shared weights what each node hashed."""
        raise NotImplementedError

    def committed(self, version: int) -> None:
        """``version`` is served everywhere and can no longer be rolled back (here: nothing to do)."""

    def failure_note(self, error: BaseException) -> str:
        """What a failed update's error should add for this transport (here: nothing)."""
        return ""


@dataclass(frozen=True)
class Sending:
    """The update a sender has open: the state it fixed (a reference, no copy), its bucket layout,
    and whether the buckets are checksummed."""

    version: int
    state: Mapping[str, Any]
    buckets: tuple[BucketSpec, ...]
    hashed: bool


class SenderSide:
    """What every transport's sender side builds on: the update open in this process."""

    def _weights_sending(self, version: int) -> Sending:
        sending = getattr(self, "_rlinfra_sending", None)
        if sending is None or sending.version != version:
            raise RuntimeError(f"no open weight export for version {version}")
        return sending

    def _weights_forget(self) -> None:
        """Drop the open update; a transport that holds more for it (live buckets) extends this."""
        self._rlinfra_sending: Sending | None = None


class ReceiverSide:
    """What every transport's receiver side builds on: this worker's gate and buffers."""

    weights_as_torch = False  # unpack into torch tensors instead of numpy arrays
    # The private host buffers this receiver stages a version in (object_store, broadcast,
    # admission): a subclass where other processes must read them (``MappableBuffers``).
    private_buffers: ClassVar[type[Buffers]] = Buffers

    @served_asleep
    def set_initial_weights(self, tensors: Mapping[str, Any], version: int = 0) -> None:
        """Weights to serve before the first update (e.g. loaded from a checkpoint)."""
        self._weights_serve(Buffers(version, Manifest(version, ()), tensors=dict(tensors)))

    def _weights_serve(self, first: Buffers) -> None:
        """Serve ``first`` from now on: initial weights, or an admitted copy of the serving version."""
        self._rlinfra_weights = DoubleBuffers(first)

    def _weights(self) -> DoubleBuffers:
        if getattr(self, "_rlinfra_weights", None) is None:
            self.set_initial_weights({})
        return self._rlinfra_weights

    def _weights_shadow(self, version: int) -> Any:
        """The shadow staging ``version``, of the buffers kind its transport began it with."""
        shadow = self._weights().shadow
        if shadow is None or shadow.version != version:
            raise RuntimeError(f"no staged weights for version {version}")
        return shadow
