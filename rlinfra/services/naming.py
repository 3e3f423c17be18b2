"""A named key-value service for service discovery: TTLs, leases and watches, found by name.

Rollout engines publish ``host:port`` under a key; trainers, routers and processes started after a
driver restart find them by looking the service up by name (``ray.get_actor`` with a namespace),
not by being handed an actor handle. Ray is the naming substrate here, not a message bus.

Three rules make the entries trustworthy:

- Nothing outlives its owner by more than a TTL: a key lives forever, for ``ttl_s`` seconds, or
  as long as a lease is kept alive. A reaper inside the service removes expired keys within a few
  milliseconds of their deadline (and tells watchers), so a dead engine disappears even if nobody
  reads its key.
- Every client call has a deadline and fails as ``NamingError`` naming the service and the
  operation; a background ``LeaseKeeper`` never dies silently (``keeper.error``, and a log line).
- A process that lost its lease (paused past the TTL, or the service restarted and forgot it) gets
  a new one and re-registers every key it had put under the old one; ``Lease`` is a handle whose
  server-side id may change, so callers keep using the same object.

Consumers follow changes with ``watch(prefix, since_version)``, which blocks inside the (async)
service until something under the prefix changes, so clients never poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import ray
from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError, RayTaskError

logger = logging.getLogger(__name__)

DEFAULT_NAME = "naming"
DEFAULT_NAMESPACE = "rlinfra"
DEFAULT_TIMEOUT_S = 10.0
# Starting the service's process can take several seconds on a loaded node.
DEFAULT_START_TIMEOUT_S = 60.0
DEFAULT_WATCH_TIMEOUT_S = 30.0
# How many changes the service remembers for watch(); an older since_version gets a snapshot.
HISTORY_LIMIT = 10_000

ChangeKind = Literal["put", "delete", "expire", "snapshot"]


class NamingError(RuntimeError):
    """A naming-service call failed: no reply within its deadline, the service died or is
    missing, or the request was refused. The message names the service and the operation."""


class LeaseExpired(NamingError):
    """The lease is unknown to the service: it expired (its holder paused past the TTL), was
    revoked, or the service restarted and lost it. Its keys are gone."""


@dataclass(frozen=True)
class Change:
    """One change to a key, as ``watch`` reports it.

    ``kind`` is ``put``, ``delete`` (explicit delete or lease revoke), ``expire`` (TTL or lease
    expiry) or ``snapshot`` (the service could not replay history — it restarted or the
    ``since_version`` is too old — so it reports every current key under the prefix instead).
    For deletions ``value`` is the last value the key had, so "which engine left" is answerable.
    """

    key: str
    kind: ChangeKind
    value: Any
    version: int


@dataclass
class _Entry:
    value: Any
    version: int
    expires_at: float | None
    lease_id: str | None


@dataclass
class _LeaseState:
    ttl_s: float
    expires_at: float


@ray.remote(num_cpus=0, max_restarts=-1)
class NamingStore:
    """The service itself: an async actor, so that ``watch`` can wait without blocking others.

    Every method runs on one event loop and mutates state without awaiting, so each operation is
    atomic. It reserves no CPU (it is tiny and must not hold up placement) and is restarted by Ray
    if its process dies; a restarted store is empty, and lease keepers re-register their keys.
    """

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._leases: dict[str, _LeaseState] = {}
        self._lease_keys: dict[str, set[str]] = {}
        # Versions start at the wall clock in microseconds, so that a restarted store continues
        # above its previous incarnation and a watcher's old since_version gets a snapshot instead
        # of silently missing changes.
        self._version = time.time_ns() // 1000
        self._history: deque[Change] = deque(maxlen=HISTORY_LIMIT)
        self._history_floor = self._version  # every change with a larger version is in _history
        self._deadlines: list[tuple[float, int, str, str]] = []  # (expires_at, seq, kind, id)
        self._seq = 0
        # Events bind to the running loop on first use (Python >= 3.10), so creating them here is safe.
        self._changed = asyncio.Event()
        self._wake = asyncio.Event()
        self._reaper: asyncio.Task[None] | None = None

    def _start(self) -> None:
        """Start the reaper on first use (__init__ may run outside the event loop), and apply
        every deadline already due, so that no call ever sees an expired key."""
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap())
        self._expire_due(time.monotonic())

    async def ping(self) -> int:
        self._start()
        return self._version

    async def put(self, key: str, value: Any, ttl_s: float | None, lease_id: str | None) -> int:
        self._start()
        return self._set(key, value, self._expiry(ttl_s, lease_id), lease_id)

    async def get(self, key: str) -> tuple[bool, Any]:
        self._start()
        entry = self._entries.get(key)
        return (True, entry.value) if entry is not None else (False, None)

    async def delete(self, key: str) -> bool:
        self._start()
        return self._remove(key, "delete")

    async def list(self, prefix: str) -> dict[str, Any]:
        self._start()
        return {key: entry.value for key, entry in self._entries.items() if key.startswith(prefix)}

    async def put_if_absent(self, key: str, value: Any, ttl_s: float | None, lease_id: str | None) -> bool:
        self._start()
        expires_at = self._expiry(ttl_s, lease_id)
        if key in self._entries:
            return False
        self._set(key, value, expires_at, lease_id)
        return True

    async def compare_and_set(
        self, key: str, expected: Any, new: Any, ttl_s: float | None, lease_id: str | None
    ) -> bool:
        self._start()
        expires_at = self._expiry(ttl_s, lease_id)
        entry = self._entries.get(key)
        matches = entry is None if expected is None else entry is not None and entry.value == expected
        if not matches:
            return False
        self._set(key, new, expires_at, lease_id)
        return True

    async def grant_lease(self, ttl_s: float) -> str:
        self._start()
        # Random ids, not a counter: a restarted store must never hand out an id an old holder
        # still refreshes, or it would keep someone else's keys alive.
        lease_id = uuid.uuid4().hex
        self._leases[lease_id] = _LeaseState(ttl_s, time.monotonic() + ttl_s)
        self._lease_keys[lease_id] = set()
        self._push_deadline(self._leases[lease_id].expires_at, "lease", lease_id)
        return lease_id

    async def keep_alive(self, lease_id: str) -> float:
        self._start()
        state = self._require_lease(lease_id)
        state.expires_at = time.monotonic() + state.ttl_s
        self._push_deadline(state.expires_at, "lease", lease_id)
        return state.ttl_s

    async def revoke_lease(self, lease_id: str) -> int:
        self._start()
        if lease_id not in self._leases:
            return 0
        return self._end_lease(lease_id, "delete")

    async def watch(
        self, prefix: str, since_version: int | None, timeout_s: float
    ) -> tuple[int, list[Change]]:
        self._start()
        since = self._version if since_version is None else since_version
        deadline = time.monotonic() + timeout_s
        while True:
            if since > self._version or since < self._history_floor:
                return self._version, self._snapshot(prefix)
            changes = self._changes_since(since, prefix)
            remaining = deadline - time.monotonic()
            if changes or remaining <= 0:
                return self._version, changes
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    def _expiry(self, ttl_s: float | None, lease_id: str | None) -> float | None:
        if lease_id is not None:
            self._require_lease(lease_id)
            return None
        return None if ttl_s is None else time.monotonic() + ttl_s

    def _require_lease(self, lease_id: str) -> _LeaseState:
        state = self._leases.get(lease_id)
        if state is None:
            raise LeaseExpired(f"lease {lease_id[:8]}… is not held (expired, revoked or lost in a restart)")
        return state

    def _set(self, key: str, value: Any, expires_at: float | None, lease_id: str | None) -> int:
        old = self._entries.get(key)
        if old is not None and old.lease_id is not None:
            self._lease_keys.get(old.lease_id, set()).discard(key)
        self._version += 1
        self._entries[key] = _Entry(value, self._version, expires_at, lease_id)
        if lease_id is not None:
            self._lease_keys[lease_id].add(key)
        if expires_at is not None:
            self._push_deadline(expires_at, "key", key)
        self._record(Change(key, "put", value, self._version))
        return self._version

    def _remove(self, key: str, kind: ChangeKind) -> bool:
        entry = self._entries.pop(key, None)
        if entry is None:
            return False
        if entry.lease_id is not None:
            self._lease_keys.get(entry.lease_id, set()).discard(key)
        self._version += 1
        self._record(Change(key, kind, entry.value, self._version))
        return True

    def _end_lease(self, lease_id: str, kind: ChangeKind) -> int:
        del self._leases[lease_id]
        keys = sorted(self._lease_keys.pop(lease_id, set()))
        for key in keys:
            self._remove(key, kind)
        return len(keys)

    def _record(self, change: Change) -> None:
        if len(self._history) == self._history.maxlen:
            self._history_floor = self._history[0].version
        self._history.append(change)
        # Wake every watcher: each waits on the event that was current when it started waiting.
        self._changed.set()
        self._changed = asyncio.Event()

    def _changes_since(self, since: int, prefix: str) -> list[Change]:
        newer: list[Change] = []
        for change in reversed(self._history):
            if change.version <= since:
                break
            if change.key.startswith(prefix):
                newer.append(change)
        newer.reverse()
        return newer

    def _snapshot(self, prefix: str) -> list[Change]:
        return [
            Change(key, "snapshot", entry.value, entry.version)
            for key, entry in sorted(self._entries.items())
            if key.startswith(prefix)
        ]

    def _push_deadline(self, expires_at: float, kind: str, ident: str) -> None:
        self._seq += 1
        heapq.heappush(self._deadlines, (expires_at, self._seq, kind, ident))
        if self._deadlines[0][0] == expires_at:
            self._wake.set()

    def _expire_due(self, now: float) -> None:
        """Drop every key and lease whose deadline passed. Heap items are never updated in place
        (a keep-alive pushes a new one), so an item counts only if it matches the current state."""
        while self._deadlines and self._deadlines[0][0] <= now:
            expires_at, _, kind, ident = heapq.heappop(self._deadlines)
            if kind == "key":
                entry = self._entries.get(ident)
                if entry is not None and entry.expires_at == expires_at:
                    self._remove(ident, "expire")
            else:
                lease = self._leases.get(ident)
                if lease is not None and lease.expires_at == expires_at:
                    self._end_lease(ident, "expire")

    async def _reap(self) -> None:
        """Sleep until the earliest deadline (or until an earlier one is added), then expire."""
        while True:
            try:
                self._expire_due(time.monotonic())
                delay = self._deadlines[0][0] - time.monotonic() if self._deadlines else None
                self._wake.clear()
                await asyncio.wait_for(self._wake.wait(), delay)
            except asyncio.TimeoutError:
                continue
            except Exception:  # a reaper that stops would let dead engines linger forever
                logger.exception("naming store: reaper iteration failed; continuing")
                await asyncio.sleep(0.1)


class Lease:
    """A lease held through one ``NamingService`` client.

    Keys put with ``lease=`` vanish when the lease is not kept alive for ``ttl_s``. The object
    also remembers which keys this client put under it, so that a keeper can re-grant the lease
    (``id`` then changes) and put them back after an expiry; use the same object throughout.
    """

    def __init__(self, lease_id: str, ttl_s: float) -> None:
        self._id = lease_id
        self.ttl_s = ttl_s
        self.revoked = False
        # key -> (value, exclusive); exclusive keys are re-claimed with put_if_absent, so a key
        # someone else took over while this lease was lost is not stolen back.
        self._keys: dict[str, tuple[Any, bool]] = {}
        self._pending: set[str] = set()  # keys still to re-register after a re-grant
        self._lock = threading.RLock()

    @property
    def id(self) -> str:
        return self._id

    @property
    def keys(self) -> list[str]:
        """The keys this client holds under the lease (and will re-register after a loss)."""
        return sorted(self._keys)

    def __repr__(self) -> str:
        return f"Lease({self._id[:8]}…, ttl_s={self.ttl_s:g}, keys={len(self._keys)})"


class NamingService:
    """A client of the named KV service ``name`` in Ray namespace ``namespace``.

    Get one with ``connect`` (creates the service if nobody has: race-safe, the first creator's
    options win) or ``lookup`` (finds an existing one). A non-detached service dies with the driver
    that created it; a detached one lives until ``destroy()``. Values are any picklable object
    except ``None``, which means "absent" (``get``'s default, ``compare_and_set``'s expected).
    """

    def __init__(self, handle: Any, name: str, namespace: str, timeout_s: float) -> None:
        self.name = name
        self.namespace = namespace
        self.timeout_s = timeout_s
        self._handle: Any | None = handle
        self._handle_lock = threading.Lock()
        self._destroyed = False
        self._leases: list[Lease] = []
        self._keepers: list[LeaseKeeper] = []

    @classmethod
    def connect(
        cls,
        name: str = DEFAULT_NAME,
        namespace: str = DEFAULT_NAMESPACE,
        detached: bool = False,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
    ) -> NamingService:
        """Find the service, or create it (detached: it outlives this driver), and wait until it
        answers (``start_timeout_s``)."""
        _require_ray(name, "connect")
        handle = NamingStore.options(
            name=name,
            namespace=namespace,
            get_if_exists=True,
            lifetime="detached" if detached else None,
        ).remote()
        client = cls(handle, name, namespace, timeout_s)
        client._call("connect", "ping", timeout_s=start_timeout_s)
        return client

    @classmethod
    def lookup(
        cls,
        name: str = DEFAULT_NAME,
        namespace: str = DEFAULT_NAMESPACE,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> NamingService:
        """Find an existing service; ``NamingError`` if there is none (nothing is created)."""
        _require_ray(name, "lookup")
        client = cls(None, name, namespace, timeout_s)
        client._call("lookup", "ping")
        return client

    # -- keys -------------------------------------------------------------------------------

    def put(self, key: str, value: Any, ttl_s: float | None = None, lease: Lease | None = None) -> int:
        """Set ``key`` (for ``ttl_s`` seconds, or while ``lease`` is alive); returns the new
        version, which a ``watch(since_version=...)`` can start from."""
        _check_write(key, value, ttl_s, lease)
        self._forget(key, keep=lease)
        if lease is None:
            return self._call(f"put({key!r})", "put", key, value, ttl_s, None)
        with lease._lock:
            if lease.revoked:
                raise LeaseExpired(f"{self}: put({key!r}): {lease!r} was revoked")
            # Under the lease's lock, so a keeper cannot re-grant between this put and the record.
            version = self._call(f"put({key!r})", "put", key, value, None, lease.id)
            lease._keys[key] = (value, False)
            return version

    def get(self, key: str, default: Any = None) -> Any:
        found, value = self._call(f"get({key!r})", "get", key)
        return value if found else default

    def delete(self, key: str) -> bool:
        """Delete ``key``; False if it was absent. A leased key is no longer re-registered."""
        self._forget(key)
        return self._call(f"delete({key!r})", "delete", key)

    def list(self, prefix: str = "") -> dict[str, Any]:
        """Every live key starting with ``prefix``, with its value."""
        return self._call(f"list({prefix!r})", "list", prefix)

    def put_if_absent(
        self, key: str, value: Any, ttl_s: float | None = None, lease: Lease | None = None
    ) -> bool:
        """Atomically set ``key`` unless it exists; True if this call set it (a claim)."""
        _check_write(key, value, ttl_s, lease)
        return self._conditional(f"put_if_absent({key!r})", "put_if_absent", key, value, (), ttl_s, lease)

    def compare_and_set(
        self, key: str, expected: Any, new: Any, ttl_s: float | None = None, lease: Lease | None = None
    ) -> bool:
        """Atomically set ``key`` to ``new`` if its value equals ``expected`` (``None``: if it is
        absent); True if it was set."""
        _check_write(key, new, ttl_s, lease)
        return self._conditional(
            f"compare_and_set({key!r})", "compare_and_set", key, new, (expected,), ttl_s, lease
        )

    def watch(
        self, prefix: str = "", since_version: int | None = None, timeout_s: float = DEFAULT_WATCH_TIMEOUT_S
    ) -> tuple[int, list[Change]]:
        """Wait until a key under ``prefix`` changes after ``since_version`` (None: after now),
        at most ``timeout_s``; returns ``(version, changes)``. Pass ``version`` to the next call to
        miss nothing. ``changes`` is empty on timeout; it holds ``snapshot`` entries (every current
        key under the prefix, returned at once) when history cannot be replayed: the service
        restarted, ``since_version`` is very old, or it is 0 (a way to read the state and a version
        to follow it from, in one call)."""
        return self._call(
            f"watch({prefix!r})",
            "watch",
            prefix,
            since_version,
            timeout_s,
            timeout_s=timeout_s + self.timeout_s,
        )

    # -- leases -----------------------------------------------------------------------------

    def grant_lease(self, ttl_s: float) -> Lease:
        """A new lease that expires unless kept alive within every ``ttl_s`` seconds."""
        _check_ttl(ttl_s)
        lease = Lease(self._call("grant_lease", "grant_lease", ttl_s), ttl_s)
        self._leases.append(lease)
        return lease

    def keep_alive(self, lease: Lease) -> None:
        """Refresh ``lease`` for another ``ttl_s``; ``LeaseExpired`` if it is already gone."""
        self._call(f"keep_alive({lease.id[:8]}…)", "keep_alive", lease.id)

    def revoke_lease(self, lease: Lease) -> int:
        """End ``lease`` now (its keys vanish, watchers see ``delete``); returns how many keys."""
        with lease._lock:
            lease.revoked = True
            lease._keys.clear()
            lease._pending.clear()
            removed = self._call(f"revoke_lease({lease.id[:8]}…)", "revoke_lease", lease.id)
        if lease in self._leases:
            self._leases.remove(lease)
        return removed

    def keep_alive_in_background(self, lease: Lease, interval_s: float | None = None) -> LeaseKeeper:
        """Start a thread that refreshes ``lease`` every ``interval_s`` (default ttl/3) and
        re-grants and re-registers it after a loss; stop it with ``keeper.stop()``."""
        keeper = LeaseKeeper(self, lease, interval_s if interval_s is not None else lease.ttl_s / 3)
        self._keepers.append(keeper)
        return keeper.start()

    @contextlib.contextmanager
    def leased(self, ttl_s: float, interval_s: float | None = None) -> Iterator[Lease]:
        """A lease kept alive in the background for the ``with`` block, revoked at its end (so
        the keys put under it are withdrawn at once, not after a TTL)."""
        lease = self.grant_lease(ttl_s)
        keeper = self.keep_alive_in_background(lease, interval_s)
        try:
            yield lease
        finally:
            try:
                keeper.stop()
            finally:
                try:
                    self.revoke_lease(lease)
                except NamingError as err:
                    logger.warning("%s: could not revoke %r; its keys expire with it: %s", self, lease, err)

    def _regrant(self, lease: Lease, failed_id: str) -> bool:
        """Replace the expired ``failed_id`` of ``lease`` with a new server lease and mark every
        key for re-registration; False if the lease was revoked or already re-granted."""
        with lease._lock:
            if lease.revoked or lease.id != failed_id:
                return False
            lease._id = self._call("grant_lease", "grant_lease", lease.ttl_s)
            lease._pending = set(lease._keys)
            return True

    def _reregister(self, lease: Lease) -> None:
        """Put back the keys of ``lease`` still pending; ``NamingError`` lists claims that were
        taken by someone else meanwhile (those are dropped, not stolen back)."""
        lost: list[str] = []
        with lease._lock:
            for key in sorted(lease._pending):
                if key not in lease._keys:
                    lease._pending.discard(key)
                    continue
                value, exclusive = lease._keys[key]
                if exclusive:
                    if not self._call(f"put_if_absent({key!r})", "put_if_absent", key, value, None, lease.id):
                        del lease._keys[key]
                        lost.append(key)
                else:
                    self._call(f"put({key!r})", "put", key, value, None, lease.id)
                lease._pending.discard(key)
        if lost:
            raise NamingError(
                f"{self}: re-registering {lease!r}: {lost} were taken by another holder while the "
                f"lease was lost; they are no longer held"
            )

    # -- lifecycle --------------------------------------------------------------------------

    def destroy(self, timeout_s: float | None = None) -> None:
        """Kill the service (detached or not) and wait until its name is free, so that a
        ``connect`` right after creates a fresh one. Idempotent."""
        if self._destroyed:
            return
        for keeper in self._keepers:
            keeper.stop()
        try:
            handle = self._resolve("destroy")
        except NamingError:
            self._destroyed = True
            return  # already gone
        self._destroyed = True
        ray.kill(handle, no_restart=True)
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self.timeout_s)
        while time.monotonic() < deadline:
            try:
                ray.get(handle.ping.remote(), timeout=max(0.01, deadline - time.monotonic()))
            except RayActorError:
                break  # dead: Ray frees the name when it marks the actor dead
            except GetTimeoutError:
                break
        while time.monotonic() < deadline:
            try:
                current = ray.get_actor(self.name, namespace=self.namespace)
            except ValueError:
                return
            if current != handle:  # handles compare by actor id: someone already made a new one
                return
            time.sleep(0.02)
        raise NamingError(f"{self}: destroy: the service was killed but still exists after the deadline")

    def __repr__(self) -> str:
        return f"naming service {self.name!r} (namespace {self.namespace!r})"

    # -- plumbing ---------------------------------------------------------------------------

    def _conditional(
        self,
        op: str,
        method: str,
        key: str,
        value: Any,
        extra: tuple[Any, ...],
        ttl_s: float | None,
        lease: Lease | None,
    ) -> bool:
        if lease is None:
            won = self._call(op, method, key, *extra, value, ttl_s, None)
            if won:
                self._forget(key)
            return won
        self._forget(key, keep=lease)
        with lease._lock:
            if lease.revoked:
                raise LeaseExpired(f"{self}: {op}: {lease!r} was revoked")
            won = self._call(op, method, key, *extra, value, None, lease.id)
            if won:
                lease._keys[key] = (value, True)
            return won

    def _forget(self, key: str, keep: Lease | None = None) -> None:
        """Stop re-registering ``key`` under any lease but ``keep``: it was overwritten or
        deleted. One lease lock at a time, so two threads can never deadlock on two leases."""
        for lease in list(self._leases):
            if lease is not keep and key in lease._keys:
                with lease._lock:
                    lease._keys.pop(key, None)

    def _resolve(self, op: str) -> Any:
        with self._handle_lock:
            if self._handle is None:
                try:
                    self._handle = ray.get_actor(self.name, namespace=self.namespace)
                except ValueError:
                    raise NamingError(
                        f"{self}: {op}: no such service (never created, destroyed, or its creating "
                        f"driver exited); NamingService.connect creates one"
                    ) from None
            return self._handle

    def _call(self, op: str, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        """Call the store with a deadline, turning every failure into a ``NamingError``."""
        if self._destroyed:
            raise NamingError(f"{self}: {op}: the service was destroyed")
        timeout = self.timeout_s if timeout_s is None else timeout_s
        ref = getattr(self._resolve(op), method).remote(*args)
        try:
            return ray.get(ref, timeout=timeout)
        except GetTimeoutError:
            with contextlib.suppress(Exception):
                ray.cancel(ref)
            raise NamingError(f"{self}: {op}: no reply within {timeout:g} s") from None
        except RayActorError as err:
            if isinstance(err, ActorDiedError):
                with self._handle_lock:
                    self._handle = None  # for good: look the name up again, someone may re-create it
            raise NamingError(f"{self}: {op}: the service died or is unreachable ({err})") from err
        except RayTaskError as err:
            cause = err.cause
            if isinstance(cause, NamingError):
                raise type(cause)(f"{self}: {op}: {cause}") from None
            raise NamingError(f"{self}: {op}: failed inside the service: {cause!r}") from err


class LeaseKeeper:
    """A daemon thread that keeps one lease alive and repairs it after a loss.

    Every ``interval_s`` it refreshes the lease; if the service says the lease is gone (this
    process was paused past the TTL, or the service restarted), it grants a new one and re-puts
    the keys. Failures never end the thread: the last one is in ``error`` and is logged (once per
    distinct message, plus a line when it recovers). ``regrants`` counts the repairs.
    """

    def __init__(self, client: NamingService, lease: Lease, interval_s: float) -> None:
        if not 0 < interval_s < lease.ttl_s:
            raise ValueError(f"keep-alive interval must be in (0, ttl_s={lease.ttl_s:g}) s, got {interval_s}")
        self.client = client
        self.lease = lease
        self.interval_s = interval_s
        self.error: BaseException | None = None
        self.regrants = 0
        self._failing = False
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"rlinfra-lease-keeper-{lease.id[:8]}", daemon=True
        )

    def start(self) -> LeaseKeeper:
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop refreshing and join the thread; ``NamingError`` if it does not end in time (a
        call stuck past its own deadline). The lease itself is left to expire (or revoke it)."""
        self._stop.set()
        if not self._thread.is_alive():
            return
        timeout = timeout_s if timeout_s is not None else self.client.timeout_s + 2.0
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise NamingError(
                f"{self.client}: lease keeper for {self.lease!r} did not stop within {timeout:g} s"
            )

    def _run(self) -> None:
        try:
            while not self._stop.is_set() and not self.lease.revoked:
                self._tick()
                self._stop.wait(self.interval_s)
        except BaseException as err:  # the thread is ending abnormally: say so, loudly
            self.error = err
            logger.critical("%s: lease keeper for %r died: %r", self.client, self.lease, err)
            raise

    def _tick(self) -> None:
        lease_id = self.lease.id
        try:
            try:
                self.client.keep_alive(self.lease)
            except LeaseExpired as err:
                self.error = err
                if self.client._regrant(self.lease, lease_id):
                    self.regrants += 1
                    logger.warning(
                        "lease keeper: %s; granted %r and re-registering its keys", err, self.lease
                    )
            if self.lease._pending:
                self.client._reregister(self.lease)
        except Exception as err:
            self._note(err)
            return
        if self._failing:
            self._failing = False
            logger.info("lease keeper for %r of %s recovered", self.lease, self.client)

    def _note(self, err: BaseException) -> None:
        if not self._failing or repr(err) != repr(self.error):
            # A NamingError names the service already; anything else gets it added.
            detail = str(err) if isinstance(err, NamingError) else f"{self.client}: {err!r}"
            logger.warning("lease keeper for %r: %s", self.lease, detail)
        self.error = err
        self._failing = True


def _require_ray(name: str, op: str) -> None:
    if not ray.is_initialized():
        raise NamingError(
            f"naming service {name!r}: {op}: Ray is not initialised; start or attach one first "
            f"(rlinfra.Cluster, or ray.init(address=...))"
        )


def _check_ttl(ttl_s: float | None) -> None:
    if ttl_s is not None and not ttl_s > 0:
        raise ValueError(f"ttl_s must be positive seconds, got {ttl_s!r}")


def _check_write(key: str, value: Any, ttl_s: float | None, lease: Lease | None) -> None:
    if not isinstance(key, str):
        raise TypeError(f"naming keys are strings, got {type(key).__name__}")
    if value is None:
        raise ValueError(f"cannot store None under {key!r}: None means 'absent' (use delete)")
    _check_ttl(ttl_s)
    if ttl_s is not None and lease is not None:
        raise ValueError(f"{key!r}: give ttl_s or lease, not both (a key lives by one clock)")
