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

Transports (``TRANSPORTS``; one module each under ``transports/``): ``"object_store"`` (the
default; private copies, two buckets in flight), ``"object_store_shared"`` (zero-copy, one copy
per node) and ``"broadcast"`` (a torch.distributed cross-component group). The protocol here
never asks which one it drives.
"""

import contextlib
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any

import ray

from rlinfra.runtime.calls import GroupCall
from rlinfra.runtime.errors import WorkerGroupError
from rlinfra.runtime.group import WorkerGroup
from rlinfra.services.weights.buckets import DEFAULT_BUCKET_BYTES, Manifest
from rlinfra.services.weights.buffers import Expected, NodeChecks, WeightsSwapError, WeightsVerifyError
from rlinfra.services.weights.gate import WeightsPauseError
from rlinfra.services.weights.roles import WeightReceiver, WeightSender
from rlinfra.services.weights.transports import BY_NAME
from rlinfra.services.weights.transports.base import Link

TRANSPORTS = tuple(BY_NAME)
# The steps of a combined call, furthest first, each with the error a worker raises in it.
STEP_ERRORS = (("verify", WeightsVerifyError), ("swap", WeightsSwapError), ("pause", WeightsPauseError))


def _failed_step(step: str, error: BaseException) -> str:
    """Which step a call that did several (pause + swap + verify, or swap + verify) failed in:
    the furthest one any worker raised in; ``step`` (the call's first) when no worker said."""
    reasons = [f.reason for f in error.failures.values()] if isinstance(error, WorkerGroupError) else []
    for name, kind in STEP_ERRORS:
        if any(reason.startswith(kind.__name__) for reason in reasons):
            return name
    return step


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
    held_s: float = 0.0


@dataclass
class Prepared:
    """Version ``version`` staged on every receiver, with the sender's checksums."""

    version: int
    manifest: Manifest
    checksums: dict[int, int]
    prepare_s: float
    node_checks: NodeChecks | None = None  # object_store_shared: what each node hashed


@dataclass(eq=False)
class WeightSync:
    """Versioned weight updates from rank ``sender_rank`` of ``sender`` to every receiver rank.

    Versions are integers owned by the trainer side and must increase. ``cross_group`` is the name
    of a cross-component process group (``rendezvous.bring_up_cross``) for the broadcast transport,
    with the sender at cross rank 0.

    ``checksums=False`` skips every hash (sender and receivers): verify then checks versions only,
    and a corrupted bucket is served. It exists to measure what the checksums cost and for links
    so fast that hashing is the bottleneck; the default verifies every byte. It may be switched
    between updates: each version is hashed and verified as it was sent, and no checksum of one
    version is held against another.
    """

    sender: WorkerGroup
    receivers: WorkerGroup
    _: KW_ONLY
    transport: str = "object_store"
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    sender_rank: int = 0
    cross_group: str | None = None
    step_timeout_s: float = 120.0
    drain_timeout_s: float = 30.0
    lease_s: float = 60.0
    initial_version: int = 0
    checksums: bool = True

    def __post_init__(self) -> None:
        if self.transport not in BY_NAME:
            raise ValueError(f"unknown transport {self.transport!r}; expected one of {TRANSPORTS}")
        self.version = self.initial_version
        self.staged: Prepared | None = None  # prepared, neither committed nor abandoned yet
        self._committed = Expected(self.version, {})  # what the serving version must hash to
        self._link = Link(self.sender, self.sender_rank, self.receivers, self.step_timeout_s)
        self.alive = self._link.alive  # the receiver ranks still taking part (the dead leave it)
        self._transport = BY_NAME[self.transport](self._link, self.cross_group)
        self._transport.check(self.checksums)
        self._keep_lone_copy()

    # ------------------------------------------------------------------------------- protocol
    def update(self, version: int) -> UpdateReport:
        """``prepare`` then ``commit``: the whole protocol for one new version."""
        started = time.perf_counter()
        report = self.commit(self.prepare(version))
        report.total_s = time.perf_counter() - started
        return report

    def staged_or_prepare(self, version: int) -> Prepared:
        """``version`` staged on every receiver: what is staged already, if it is that version
        (a retry after a replacement finds it re-staged), else ``prepare(version)``."""
        staged = self.staged
        return staged if staged is not None and staged.version == version else self.prepare(version)

    def commit_version(self, version: int) -> UpdateReport:
        """Commit ``version``, preparing it first if nothing of it is staged (a replacement dropped it)."""
        return self.commit(self.staged_or_prepare(version))

    def prepare(self, version: int) -> Prepared:
        """Stage ``version`` into every receiver's shadow buffer while generation continues."""
        if version <= self.version:
            raise ValueError(f"versions must increase: {version} after {self.version}")
        started = time.perf_counter()
        link, transport = self._link, self._transport
        try:
            manifest = link.on_sender(WeightSender.weights_open, version, self.bucket_bytes, self.checksums)
            transport.admit(manifest)
            link.on_receivers(WeightReceiver.weights_begin, manifest, transport.shadow)
            checksums, node_checks = transport.transfer(manifest)
            link.on_receivers(WeightReceiver.weights_stage_done, version)
            if not manifest.hashed:
                checksums, node_checks = {}, None  # verify then checks versions only
        except BaseException as error:
            raise self._roll_back("prepare", version, error, owner=None) from error
        finally:
            with contextlib.suppress(Exception):  # the sender's own failure is already being reported
                link.on_sender(WeightSender.weights_close, version)
        self.staged = Prepared(version, manifest, checksums, time.perf_counter() - started, node_checks)
        return self.staged

    def commit(self, prepared: Prepared, while_paused: Callable[[], None] | None = None) -> UpdateReport:
        """Pause → swap → verify → resume (always). On any failure: roll back, resume, raise.

        ``while_paused`` runs with generation held, before the swap (e.g. the trainer flushing a
        cache); if it raises, the update is rolled back like any other failure.
        """
        version = prepared.version
        owner = f"weight-sync:{uuid.uuid4().hex[:8]}:v{version}"
        link, step = self._link, "pause"
        paused_at = time.perf_counter()
        pausing = (owner, self.lease_s, self.drain_timeout_s)
        expected = Expected(version, prepared.checksums, prepared.node_checks)
        try:
            if while_paused is None:
                link.on_receivers(WeightReceiver.weights_pause_swap_verify, *pausing, expected)
            else:
                link.on_receivers(WeightReceiver.weights_pause, *pausing)
                step = "while paused"
                while_paused()
                step = "swap"
                link.on_receivers(WeightReceiver.weights_swap_verify, owner, expected)
        except BaseException as error:
            if step != "while paused":
                step = _failed_step(step, error)
            self.staged = None
            raise self._roll_back(step, version, error, owner) from error
        try:
            resumed = link.on_receivers(WeightReceiver.weights_resume, owner)
        except Exception as error:  # Ctrl-C passes through: the caller is stopping
            raise self._error("resume", version, error) from error
        pause_s = time.perf_counter() - paused_at
        self.version, self.staged = version, None
        self._committed = Expected(version, prepared.checksums)
        self._transport.committed(version)
        self._keep_lone_copy()
        nbytes, count = prepared.manifest.nbytes, len(prepared.manifest.buckets)
        prepare_s, held_s = prepared.prepare_s, max((held for _, held in resumed), default=0.0)
        return UpdateReport(version, nbytes, count, prepare_s, pause_s, prepare_s + pause_s, held_s)

    def replace_sender(self, sender: WorkerGroup) -> None:
        """Send later versions from ``sender`` (a trainer group brought back up after a restart);
        the receivers, their version and the transport stay. Refused for ``broadcast``, whose
        cross-component process group included the old trainer and must be brought up again."""
        if self.cross_group is not None:
            raise ValueError(
                f"the broadcast transport's process group {self.cross_group!r} included the old sender; "
                "bring a new cross group up and make a new WeightSync"
            )
        self.abandon()
        self.sender = self._link.sender = sender

    def abandon(self) -> int | None:
        """Drop the staged version, if any, from every surviving receiver (they keep serving the
        committed one); returns its number. Supervision does this before admitting a worker, then
        prepares the trainer's version again, so that the newcomer is staged with the rest."""
        staged, self.staged = self.staged, None
        if staged is None:
            return None
        self._on_survivors(WeightReceiver.weights_rollback, staged.version)
        return staged.version

    def leave(self, ranks: Sequence[int]) -> None:
        """Receiver ``ranks`` take no further part (removed from the group: elastic scale-down)."""
        self.alive[:] = [rank for rank in self.alive if rank not in set(ranks)]

    def admit(self, ranks: Sequence[int]) -> int:
        """Give receiver ``ranks`` (replaced or added workers, serving nothing yet) the committed
        version, copied from a live peer (a group of one: from the copy kept at commit) and
        checked against that version's checksums
        (``rlinfra.services.weights.admission``); they then take part in every later update.
        Returns the version. Refused while a version is staged (``abandon`` it first).

        Raises ``WeightSyncError`` (step ``admit``) when no peer can give the version or a
        newcomer's copy does not verify; the newcomers then serve nothing."""
        newcomers = sorted(set(ranks))
        if self.staged is not None:
            raise RuntimeError(
                f"version {self.staged.version} is staged; commit or abandon it before admitting {newcomers}"
            )
        receivers = self.receivers
        failure: BaseException | None = None
        for peer in [rank for rank in self.alive if rank not in newcomers] + [None]:
            snapshot = self._kept if peer is None else self._snapshot(peer)
            if snapshot is None:
                break
            source = "the copy kept when it was committed" if peer is None else f"rank {peer}"
            try:
                taking = receivers.call(
                    WeightReceiver.weights_admit,
                    newcomers,
                    args=([snapshot.refs[0]], self._committed),
                    timeout=self.step_timeout_s,
                    action=f"admission at version {self.version} (copied from {source})",
                )
                snapshot.wait()  # a dead peer: try the next one
                taking.wait()
            except WorkerGroupError as error:
                failure = error
                if peer is not None and error.group == receivers.name and error.failed_ranks == [peer]:
                    continue
                break
            self.alive[:] = sorted(set(self.alive) | set(newcomers))
            return self.version
        cause = failure or RuntimeError(f"no live receiver holds version {self.version} to copy from")
        raise WeightSyncError("admit", self.version, self.version, cause)

    def _keep_lone_copy(self) -> None:
        """A group of one receiver has no peer to admit its replacement from, so its serving
        version is kept as a snapshot in Ray's object store after every commit (owned by this
        driver, it outlives the worker): one more host copy of the model, taken beside generation."""
        self._kept = self._snapshot(0) if self.receivers.world_size == 1 else None

    def _snapshot(self, rank: int) -> GroupCall:
        """Receiver ``rank``'s serving version, packed (``weights_snapshot``), on its way."""
        return self.receivers.call(WeightReceiver.weights_snapshot, [rank], timeout=self.step_timeout_s)

    # ------------------------------------------------------------------------------- recovery
    def _roll_back(self, step: str, version: int, error: BaseException, owner: str | None) -> WeightSyncError:
        """Roll every surviving receiver back from ``version`` (dropping staged weights), then
        reopen the gate if it was closed (best effort on each survivor, bounded in time); returns
        the error to raise. Ctrl-C (``KeyboardInterrupt``) and ``SystemExit`` pass through
        unchanged: the caller is stopping, not facing a failed update."""
        self._on_survivors(WeightReceiver.weights_rollback, version)
        if owner is not None:
            self._on_survivors(WeightReceiver.weights_resume, owner)
        if not isinstance(error, Exception):
            raise error
        return self._error(step, version, error)

    def _on_survivors(self, method: Callable[..., Any], *args: Any) -> None:
        refs = self._link.receivers_call(method, *args).refs  # ray.wait([]) returns at once
        ray.wait(refs, num_returns=len(refs), timeout=self.step_timeout_s)

    def _error(self, step: str, version: int, error: BaseException) -> WeightSyncError:
        if isinstance(error, WeightSyncError):
            return error
        return WeightSyncError(step, version, self.version, error, self._transport.failure_note(error))
