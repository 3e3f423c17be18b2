"""``WeightSync``: move new weights from the trainer to rollout workers behind a version barrier.

    prepare  (generation goes on)   stage version v into every worker's shadow buffer
    pause                            close the gate (owner + lease), drain in-flight generation
    swap                             shadow becomes current: O(1), nothing is copied while paused
    verify                           every worker serves v and holds exactly the trainer's bytes
    resume   (always, in a finally)  reopen the gate — whatever failed before

A failure anywhere rolls every surviving worker back to the previous version (nothing ever
serves a mix of versions), leaves the version number unchanged, and raises ``WeightSyncError``
naming the step and the workers. slime pauses generation for the whole transfer and its lock has
no timeout; here only the O(1) swap and a checksum comparison happen while paused. Pause, swap
and verify go to each worker in one call (its gate stays closed until resume, which is sent once
every worker has verified), so generation is held for two round trips; with a ``while_paused``
step they are separate calls (three).

Transports (``TRANSPORTS``):

* ``"object_store"`` (default): buckets go through Ray's object store one at a time, so at most
  two buckets are alive there (the sender waits for Ray to release bucket i - 2 before putting
  bucket i); zero-copy reads on one node, works across nodes. Freed buckets stay in the store,
  evictable, until Ray's batched deletion (about a second) or a new object needs the room.
* ``"object_store_shared"``: zero-copy on every node. The receivers keep the buckets where Ray
  maps them — read-only views of their node's object store — as their shadow, so a node holds one
  copy of each version whatever the number of workers on it, nothing is copied on a receiver, and
  each bucket is hashed once per node (by one of its workers, in turn); at verify every worker
  checks that it serves exactly the objects hashed on its node. The store holds two versions
  while an update runs (serving and staged) and one between updates (the previous version is
  released once the new one is committed); a node whose object store cannot hold two is refused
  at prepare.
  Weights are read-only (numpy enforces it; torch views of them must not be written to).
* ``"broadcast"``: a torch.distributed cross-component group from ``rlinfra.rendezvous`` (gloo
  here, nccl on GPUs).
* ``"cuda_ipc"``: for colocated GPU workers (sender and receivers on one node, receivers able to
  see the sender's GPU): buckets are packed on the sender's GPU and mapped by the receivers with
  CUDA IPC, at most two alive at once; only the small handles go through Ray. Checked at
  construction: CUDA in every process, one node, the sender's GPU visible to every receiver
  (``rlinfra.services.weights.cuda_ipc``).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray

from rlinfra.runtime.errors import WorkerGroupError
from rlinfra.runtime.group import WorkerGroup
from rlinfra.services.weights import cuda_ipc
from rlinfra.services.weights.buckets import DEFAULT_BUCKET_BYTES, Manifest
from rlinfra.services.weights.roles import (
    NodeChecks,
    WeightsPauseError,
    WeightsSwapError,
    WeightsVerifyError,
)

TRANSPORTS = ("object_store", "object_store_shared", "broadcast", "cuda_ipc")
# Where each transport stages a version on a receiver (``WeightReceiver._weights_begin``).
SHADOW_DEVICE = {
    "object_store": "cpu",
    "object_store_shared": "shared",
    "broadcast": "cpu",
    "cuda_ipc": "cuda",
}
# How long a failed broadcast waits for the receivers to say which of them died.
BLAME_GRACE_S = 3.0
# Reasons (from rlinfra.runtime.calls) that mean a worker is gone rather than merely failing.
_GONE = ("the worker process died", "the worker became unreachable", "its node")


def _let_through(error: BaseException) -> None:
    """Ctrl-C (``KeyboardInterrupt``) and ``SystemExit`` pass through unchanged once the workers
    are rolled back and resumed: the caller is stopping, not facing a failed update."""
    if not isinstance(error, Exception):
        raise error


def _failed_step(step: str, error: BaseException) -> str:
    """Which step a call that did several (pause + swap + verify, or swap + verify) failed in:
    the furthest one any worker raised in; ``step`` (the call's first) when no worker said."""
    failures = error.failures.values() if isinstance(error, WorkerGroupError) else []
    reached = [
        name
        for name, kind in (
            ("verify", WeightsVerifyError),
            ("swap", WeightsSwapError),
            ("pause", WeightsPauseError),
        )
        if any(failure.reason.startswith(kind.__name__) for failure in failures)
    ]
    return reached[0] if reached else step


class WeightSyncError(RuntimeError):
    """A weight update failed; every surviving worker was rolled back and resumed."""

    def __init__(self, step: str, version: int, serving: int, cause: BaseException, note: str = "") -> None:
        self.step = step
        self.version = version
        self.serving_version = serving
        self.cause = cause
        self.failed_ranks = cause.failed_ranks if isinstance(cause, WorkerGroupError) else []
        super().__init__(
            f"weight update to version {version} failed at '{step}'; every surviving worker is back "
            f"on version {serving} and resumed.\n{cause}" + (f"\n{note}" if note else "")
        )


@dataclass
class UpdateReport:
    """What one update cost. ``pause_s`` is the window from pause to resume as the driver sees
    it (pause sent → every resume answered), which bounds the time generation is held;
    ``held_s`` is that time itself: the longest any worker's gate stayed closed, by the worker's
    own clock (one round trip shorter). ``prepare_s`` overlaps with generation."""

    version: int
    nbytes: int
    buckets: int
    prepare_s: float
    pause_s: float
    total_s: float
    drained: list[int] = field(default_factory=list)
    held_s: float = 0.0

    @property
    def bandwidth_gbps(self) -> float:
        return self.nbytes / max(self.prepare_s, 1e-9) / 1e9


@dataclass
class Prepared:
    """Version ``version`` staged on every receiver, with the sender's checksums."""

    version: int
    manifest: Manifest
    checksums: dict[int, int]
    prepare_s: float
    node_checks: NodeChecks | None = None  # object_store_shared: what each node hashed


class WeightSync:
    """Versioned weight updates from rank ``sender_rank`` of ``sender`` to every receiver rank.

    Versions are integers owned by the trainer side and must increase. ``cross_group`` is the name
    of a cross-component process group (``rendezvous.bring_up_cross``) for the broadcast transport,
    with the sender at cross rank 0. ``transport="cuda_ipc"`` asks every worker about its CUDA
    at construction and raises ``ValueError`` naming what cannot work (no CUDA, another node,
    the sender's GPU not visible) before any update is attempted.

    ``checksums=False`` skips every hash (sender and receivers): verify then checks versions only,
    and a corrupted bucket is served. It exists to measure what the checksums cost and for links
    so fast that hashing is the bottleneck; the default verifies every byte.
    """

    def __init__(
        self,
        sender: WorkerGroup,
        receivers: WorkerGroup,
        *,
        transport: str = "object_store",
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        sender_rank: int = 0,
        cross_group: str | None = None,
        step_timeout_s: float = 120.0,
        drain_timeout_s: float = 30.0,
        lease_s: float = 60.0,
        initial_version: int = 0,
        checksums: bool = True,
    ) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"unknown transport {transport!r}; expected one of {TRANSPORTS}")
        if transport == "broadcast" and not cross_group:
            raise ValueError("the broadcast transport needs cross_group=<name> (rendezvous.bring_up_cross)")
        if transport == "cuda_ipc" and not checksums:
            raise ValueError("the cuda_ipc transport always checksums (checksums=False is not supported)")
        self.sender = sender
        self.receivers = receivers
        self.transport = transport
        self.bucket_bytes = bucket_bytes
        self.sender_rank = sender_rank
        self.cross_group = cross_group
        self.step_timeout_s = step_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self.lease_s = lease_s
        self.version = initial_version
        self.checksums = checksums
        self.alive = list(receivers.ranks)
        if transport == "cuda_ipc":
            self._check_cuda_ipc()

    # ------------------------------------------------------------------------------- protocol
    def update(self, version: int) -> UpdateReport:
        """``prepare`` then ``commit``: the whole protocol for one new version."""
        started = time.perf_counter()
        prepared = self.prepare(version)
        report = self.commit(prepared)
        report.total_s = time.perf_counter() - started
        return report

    def prepare(self, version: int) -> Prepared:
        """Stage ``version`` into every receiver's shadow buffer while generation continues."""
        if version <= self.version:
            raise ValueError(f"versions must increase: {version} after {self.version}")
        started = time.perf_counter()
        try:
            manifest = self._sender_call("_weights_open", version, self.bucket_bytes, self.checksums)
            node_checks = None
            if self.transport == "object_store_shared":
                self._check_store_room(manifest.nbytes)
            self._receivers_call("_weights_begin", manifest, SHADOW_DEVICE[self.transport], self.checksums)
            if self.transport == "object_store":
                checksums = self._transfer_object_store(manifest)
            elif self.transport == "object_store_shared":
                checksums, node_checks = self._transfer_shared(manifest)
            elif self.transport == "cuda_ipc":
                checksums = self._transfer_cuda_ipc(manifest)
            else:
                checksums = self._transfer_broadcast(manifest)
            self._receivers_call("_weights_stage_done", version)
            if not self.checksums:
                checksums, node_checks = {}, None  # verify then checks versions only
        except BaseException as error:
            self._recover(version, resume_owner=None)
            _let_through(error)
            raise self._error("prepare", version, error) from error
        finally:
            self._sender_call_quietly("_weights_close", version)
        return Prepared(version, manifest, checksums, time.perf_counter() - started, node_checks)

    def commit(self, prepared: Prepared, while_paused: Callable[[], None] | None = None) -> UpdateReport:
        """Pause → swap → verify → resume (always). On any failure: roll back, resume, raise.

        ``while_paused`` runs with generation held, before the swap (e.g. the trainer flushing a
        cache); if it raises, the update is rolled back like any other failure.
        """
        version = prepared.version
        owner = f"weight-sync:{uuid.uuid4().hex[:8]}:v{version}"
        step = "pause"
        paused_at = time.perf_counter()
        drained: list[int] = []
        checks = (version, prepared.checksums, prepared.node_checks)
        try:
            if while_paused is None:
                drained = self._receivers_call(
                    "_weights_pause_swap_verify", owner, self.lease_s, self.drain_timeout_s, *checks
                )
            else:
                drained = self._receivers_call("_weights_pause", owner, self.lease_s, self.drain_timeout_s)
                step = "while paused"
                while_paused()
                step = "swap"
                self._receivers_call("_weights_swap_verify", owner, *checks)
        except BaseException as error:
            if step != "while paused":
                step = _failed_step(step, error)
            self._recover(version, resume_owner=owner)
            _let_through(error)
            raise self._error(step, version, error) from error
        step = "resume"
        try:
            resumed = self._receivers_call("_weights_resume", owner)
        except BaseException as error:
            raise self._error(step, version, error) from error
        pause_s = time.perf_counter() - paused_at
        self.version = version
        if self.transport == "object_store_shared":
            # Nothing waits for this (generation is already back): the store frees the version
            # before, which no rollback needs any more, while the next one is being trained.
            for rank in self.alive:
                self.receivers.actors[rank]._weights_release_previous.remote(version)
        return UpdateReport(
            version,
            prepared.manifest.nbytes,
            len(prepared.manifest.buckets),
            prepared.prepare_s,
            pause_s,
            prepared.prepare_s + pause_s,
            drained,
            max((held for _, held in resumed), default=0.0),
        )

    # ----------------------------------------------------------------------------- transports
    def _transfer_object_store(self, manifest: Manifest) -> dict[int, int]:
        """One bucket at a time through the object store; the sender packs bucket i+1 while the
        receivers copy bucket i, so at most two buckets are in flight."""
        version = manifest.version
        checksums: dict[int, int] = {}
        count = len(manifest.buckets)
        sender = self.sender.actors[self.sender_rank]
        next_put = sender._weights_put.remote(version, 0) if count else None
        for index in range(count):
            digest, (ref,) = self._get_sender(next_put, "_weights_put")
            next_put = sender._weights_put.remote(version, index + 1) if index + 1 < count else None
            checksums[index] = digest
            self._receivers_call("_weights_receive", version, index, ref)
            del ref
        return checksums

    def _transfer_shared(self, manifest: Manifest) -> tuple[dict[int, int], NodeChecks]:
        """Every bucket put once and mapped (not copied) by every receiver. The buckets stay in the
        store as the receivers' shadow, so there is no memory to win by holding a put back until
        the receivers are done: the driver hands each bucket out as soon as it is in the store and
        collects the answers at the end. Bucket i is hashed on each node by that node's
        (i mod n)-th worker."""
        version = manifest.version
        count = len(manifest.buckets)
        sender = self.sender.actors[self.sender_rank]
        ranks_by_node: dict[str, list[int]] = {}
        for rank in self.alive:
            ranks_by_node.setdefault(self._node_id(self.receivers, rank), []).append(rank)
        checksums: dict[int, int] = {}
        mapping: list[list[Any]] = []
        next_put = sender._weights_put.remote(version, 0, False) if count else None
        for index in range(count):
            digest, refs = self._get_sender(next_put, "_weights_put")
            next_put = sender._weights_put.remote(version, index + 1, False) if index + 1 < count else None
            checksums[index] = digest
            hashers = tuple(ranks[index % len(ranks)] for ranks in ranks_by_node.values())
            hashers = hashers if self.checksums else ()
            mapping.append(
                [
                    self.receivers.actors[rank]._weights_map.remote(
                        version, index, refs, hashers, self.step_timeout_s
                    )
                    for rank in self.alive
                ]
            )
            del refs
        node_checks: dict[str, dict[int, tuple[str, int]]] = {}
        for index, refs in enumerate(mapping):
            answers = self._wait_receivers("_weights_map", refs)
            for rank, (object_id, digest) in zip(self.alive, answers, strict=True):
                if digest is not None:
                    node = self._node_id(self.receivers, rank)
                    node_checks.setdefault(node, {})[index] = (object_id, digest)
        return checksums, node_checks

    def _check_store_room(self, nbytes: int) -> None:
        """Shared weights keep two versions in the object store of every node involved while an
        update runs (the serving one, kept for rollback until the commit, and the staged one);
        refuse before anything is sent where a store is smaller, instead of filling it and
        stalling every put."""
        ranks = {self._node_id(self.sender, self.sender_rank): f"{self.sender.name} rank {self.sender_rank}"}
        for rank in self.alive:
            ranks.setdefault(self._node_id(self.receivers, rank), f"{self.receivers.name} rank {rank}")
        capacity = {
            node["NodeID"]: node.get("Resources", {}).get("object_store_memory", 0) for node in ray.nodes()
        }
        needed = 2 * nbytes
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

    @staticmethod
    def _node_id(group: WorkerGroup, rank: int) -> str:
        """The Ray node id the worker started on (reported by the worker when it came up)."""
        return group.worker_info[rank]["node_id"]

    def _transfer_cuda_ipc(self, manifest: Manifest) -> dict[int, int]:
        """Like the object store, one bucket at a time, but only CUDA IPC handles travel: the sender
        packs bucket i+1 on its GPU while the receivers copy bucket i, and frees bucket i-1 (every
        receiver acknowledged it) before packing, so at most two buckets are alive."""
        version = manifest.version
        checksums: dict[int, int] = {}
        count = len(manifest.buckets)
        sender = self.sender.actors[self.sender_rank]
        next_share = sender._weights_ipc_share.remote(version, 0, -1) if count else None
        for index in range(count):
            digest, handle = self._get_sender(next_share, "_weights_ipc_share")
            if index + 1 < count:
                next_share = sender._weights_ipc_share.remote(version, index + 1, index - 1)
            checksums[index] = digest
            self._receivers_call("_weights_receive_ipc", version, index, handle)
        return checksums

    def _check_cuda_ipc(self) -> None:
        """Refuse, before any update, what CUDA IPC cannot do: receivers on another node (from
        where Ray started each worker), then processes without CUDA, receivers that cannot see the
        sender's GPU, or a receiver in the sender's own process (asked of every worker)."""
        sender_name = f"{self.sender.name} rank {self.sender_rank}"
        problems = cuda_ipc.node_problems(
            self._node_of(self.sender, self.sender_rank),
            {rank: self._node_of(self.receivers, rank) for rank in self.alive},
            sender_name,
            self.receivers.name,
        )
        if not problems:
            sender_info = self._sender_call("_weights_cuda_info")
            receiver_infos = dict(zip(self.alive, self._receivers_call("_weights_cuda_info"), strict=True))
            problems = cuda_ipc.ipc_problems(sender_info, receiver_infos, sender_name, self.receivers.name)
        if problems:
            raise ValueError(
                "the cuda_ipc transport cannot work here:\n"
                + "\n".join(f"  {problem}" for problem in problems)
            )

    @staticmethod
    def _node_of(group: WorkerGroup, rank: int) -> str:
        """``node <rank> (<ray node id>)``: the Ray node id where the worker started, if known."""
        node_rank = group.node_rank_of(rank)
        info = group.worker_info[rank] if rank < len(group.worker_info) else {}
        node_id = info.get("node_id", "")
        return f"node {node_rank} ({node_id[:8]})" if node_id else f"node {node_rank}"

    def _transfer_broadcast(self, manifest: Manifest) -> dict[int, int]:
        version = manifest.version
        sender = self.sender.actors[self.sender_rank]
        send = sender._weights_broadcast.remote(version, self.cross_group)
        refs = [
            self.receivers.actors[rank]._weights_receive_broadcast.remote(version, self.cross_group)
            for rank in self.alive
        ]
        try:
            checksums = self._get_sender(send, "_weights_broadcast")
        except WorkerGroupError as sender_error:
            self._blame_dead_receivers(refs, sender_error)
            raise
        self._wait_receivers("_weights_receive_broadcast", refs)
        return checksums

    def _blame_dead_receivers(self, refs: list[Any], sender_error: WorkerGroupError) -> None:
        """A collective fails for every member when one dies, and the sender usually notices
        first ("connection closed by peer"). Give the receivers a moment to say who died: if one
        did, raise that — it names the dead worker — and stop counting on it. Survivors still
        blocked in the collective are reported as still running, not waited for."""
        try:
            self.receivers._call("_weights_receive_broadcast", refs, list(self.alive)).wait(
                timeout=BLAME_GRACE_S
            )
        except WorkerGroupError as error:
            if any(failure.reason.startswith(_GONE) for failure in error.failures.values()):
                self._forget_dead(error)
                raise error from sender_error

    # ---------------------------------------------------------------------------------- calls
    def _receivers_call(self, method: str, *args: Any) -> list[Any]:
        refs = [getattr(self.receivers.actors[rank], method).remote(*args) for rank in self.alive]
        return self._wait_receivers(method, refs)

    def _wait_receivers(self, method: str, refs: list[Any]) -> list[Any]:
        try:
            return self.receivers._call(method, refs, list(self.alive)).wait(timeout=self.step_timeout_s)
        except WorkerGroupError as error:
            self._forget_dead(error)
            raise

    def _sender_call(self, method: str, *args: Any) -> Any:
        ref = getattr(self.sender.actors[self.sender_rank], method).remote(*args)
        return self._get_sender(ref, method)

    def _get_sender(self, ref: Any, method: str) -> Any:
        call = self.sender._call(method, [ref], [self.sender_rank])
        return call.wait(timeout=self.step_timeout_s)[0]

    def _sender_call_quietly(self, method: str, *args: Any) -> None:
        with contextlib.suppress(Exception):  # the sender's own failure is already being reported
            self._sender_call(method, *args)

    def _forget_dead(self, error: WorkerGroupError) -> None:
        """Ranks whose process or node is gone take no further part (they serve nothing)."""
        cluster = self.receivers._cluster
        dead_nodes = cluster.dead_node_ranks() if cluster is not None else set()
        gone = {rank for rank, failure in error.failures.items() if failure.reason.startswith(_GONE)}
        gone |= {rank for rank in self.alive if self.receivers.node_rank_of(rank) in dead_nodes}
        self.alive = [rank for rank in self.alive if rank not in gone]

    def _recover(self, version: int, resume_owner: str | None) -> None:
        """Roll every surviving receiver back from ``version`` (dropping staged weights), then
        reopen the gate if it was closed. Best effort on each survivor, bounded in time."""
        self._on_survivors("_weights_rollback", resume_owner or "", version)
        if resume_owner is not None:
            self._on_survivors("_weights_resume", resume_owner)

    def _on_survivors(self, method: str, *args: Any) -> None:
        refs = [getattr(self.receivers.actors[rank], method).remote(*args) for rank in self.alive]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=self.step_timeout_s)

    def _error(self, step: str, version: int, error: BaseException) -> WeightSyncError:
        if isinstance(error, WeightSyncError):
            return error
        note = ""
        failures = error.failures.values() if isinstance(error, WorkerGroupError) else []
        if self.transport == "broadcast" and any(f.reason.startswith(_GONE) for f in failures):
            note = (
                f"The cross-component group {self.cross_group!r} lost a member: bring it up again "
                "without the dead workers (rendezvous.bring_up_cross) before the next broadcast update."
            )
        return WeightSyncError(step, version, self.version, error, note)
