"""A named key-value service for service discovery: found by name, keys with TTLs, watches.

Rollout engines publish ``host:port`` under a key; trainers, routers and processes started after a
driver restart find them by looking the service up by name (``ray.get_actor`` with a namespace),
not by being handed an actor handle. Ray is the naming substrate here, not a message bus.

- Nothing outlives its owner by more than a TTL: the service drops an expired key within
  ``REAP_EVERY_S`` (and tells watchers), so a dead engine disappears even if nobody reads its key.
  ``registered`` keeps a key alive from a background thread, puts it back after the service
  restarted empty, and withdraws it at the end of its block.
- Consumers follow changes with ``watch(prefix, since_version)``, which blocks inside the (async)
  service until something under the prefix changes, so clients never poll.
- Every client call has a deadline and fails as ``NamingError`` naming the service and the
  operation.
"""

from __future__ import annotations

import asyncio
import builtins  # the classes here define a method named list
import contextlib
import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import ray
from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError, RayTaskError

from rlinfra.runtime.deadline import Deadline, poll

logger = logging.getLogger("rlinfra.services.naming")

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_START_TIMEOUT_S = 60.0  # starting the service's process can take seconds on a loaded node
REAP_EVERY_S = 0.05
HISTORY_LIMIT = 10_000  # changes remembered for watch(); an older since_version gets a snapshot


class NamingError(RuntimeError):
    """A naming-service call failed: no reply within its deadline, the service died or is
    missing, a value was refused, or a registered key is held by someone else."""


@dataclass(frozen=True)
class Change:
    """One change to a key, as ``watch`` reports it: ``put``, ``delete``, ``expire`` (its TTL
    ran out), or ``snapshot`` (history could not be replayed: the service restarted or
    ``since_version`` is too old or 0, so every current key under the prefix is reported). A
    deletion carries the key's last value, so "which engine left" is answerable."""

    key: str
    kind: Literal["put", "delete", "expire", "snapshot"]
    value: Any
    version: int


@ray.remote(num_cpus=0, max_restarts=-1)
class NamingStore:
    """The service: an async actor, so that ``watch`` waits without blocking the others. Every
    method mutates state without awaiting, so each is atomic. It reserves no CPU, and Ray restarts
    it if its process dies; a restarted store is empty, and ``registered`` keys come back."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[Any, int, float | None]] = {}  # value, version, expires at
        self._expiries: list[tuple[float, str]] = []  # a heap; an entry whose key moved on is skipped
        # Versions start at the wall clock (µs): a restarted store continues above its previous
        # incarnation, so a watcher's old since_version gets a snapshot, never a silent gap.
        self._version = time.time_ns() // 1000
        self._history: deque[Change] = deque(maxlen=HISTORY_LIMIT)
        self._floor = self._version  # every change above it is in _history
        self._changed = asyncio.Event()
        self._reaper: asyncio.Task[None] | None = None

    def _due(self) -> None:
        """Start the reaper on first use and expire what is due, so no call sees an expired key."""
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap())
        now = time.monotonic()
        while self._expiries and self._expiries[0][0] <= now:
            end, key = heapq.heappop(self._expiries)
            if self._entries.get(key, (None, None, None))[2] == end:
                self._remove(key, "expire")

    def _set(self, key: str, value: Any, version: int, ttl_s: float | None) -> None:
        end = None if ttl_s is None else time.monotonic() + ttl_s
        self._entries[key] = (value, version, end)
        if end is not None:
            heapq.heappush(self._expiries, (end, key))

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(REAP_EVERY_S)
            self._due()

    async def ping(self) -> int:
        self._due()
        return self._version

    async def get(self, key: str) -> Any:
        self._due()
        return self._entries.get(key, (None,))[0]

    async def list(self, prefix: str) -> dict[str, Any]:
        self._due()
        return {key: entry[0] for key, entry in self._entries.items() if key.startswith(prefix)}

    async def put(self, key: str, value: Any, ttl_s: float | None) -> int:
        self._due()
        self._version += 1
        self._set(key, value, self._version, ttl_s)
        self._record(Change(key, "put", value, self._version))
        return self._version

    async def delete(self, key: str) -> bool:
        self._due()
        return self._remove(key, "delete")

    async def compare_and_set(self, key: str, expected: Any, new: Any, ttl_s: float | None) -> bool:
        """Set ``key`` if its value equals ``expected`` (None: if absent)."""
        self._due()
        current = self._entries.get(key, (None,))[0]
        if current != expected or (expected is None and key in self._entries):
            return False
        if new is None:  # the client's conditional delete (``registered`` withdrawing its key)
            return self._remove(key, "delete")
        await self.put(key, new, ttl_s)
        return True

    async def hold(self, key: str, value: Any, ttl_s: float) -> str:
        """``registered``'s refresh: "kept" (the key held ``value``; only its deadline moves, and
        watchers see nothing), "put" (it was absent: put back) or "taken" (someone else's)."""
        self._due()
        entry = self._entries.get(key)
        if entry is None:
            await self.put(key, value, ttl_s)
            return "put"
        if entry[0] != value:
            return "taken"
        self._set(key, value, entry[1], ttl_s)
        return "kept"

    async def watch(
        self, prefix: str, since: int | None, timeout_s: float
    ) -> tuple[int, builtins.list[Change]]:
        self._due()
        since = self._version if since is None else since
        deadline = Deadline.after(timeout_s)
        while True:
            if since > self._version or since < self._floor:
                snapshot = sorted(self._entries.items())
                changes = [Change(k, "snapshot", e[0], e[1]) for k, e in snapshot if k.startswith(prefix)]
                return self._version, changes
            newer = itertools.takewhile(lambda change: change.version > since, reversed(self._history))
            changes = [change for change in reversed(list(newer)) if change.key.startswith(prefix)]
            if changes or deadline.expired:
                return self._version, changes
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), deadline.left())

    def _remove(self, key: str, kind: Literal["delete", "expire"]) -> bool:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._version += 1
            self._record(Change(key, kind, entry[0], self._version))
        return entry is not None

    def _record(self, change: Change) -> None:
        if len(self._history) == self._history.maxlen:
            self._floor = self._history[0].version
        self._history.append(change)
        self._changed.set()  # wake every watcher; each waits on the event current when it began
        self._changed = asyncio.Event()


@dataclass
class Registration:
    """A key held by ``NamingService.registered``; ``error`` is the keeper's last failure (None
    while it holds), ``restored`` counts the times it put the key back."""

    key: str
    value: Any
    error: NamingError | None = None
    restored: int = 0
    stop: threading.Event = field(default_factory=threading.Event)


class NamingService:
    """A client of the named KV service ``name`` in Ray namespace ``namespace``: ``connect``
    (creates it if nobody has; the first creator's options win) or ``lookup`` (finds it). A
    non-detached service dies with the driver that created it; a detached one lives until
    ``destroy()``. Values are any picklable object except None, which means "absent"."""

    def __init__(self, handle: Any, name: str, namespace: str, timeout_s: float) -> None:
        self.name, self.namespace, self.timeout_s = name, namespace, timeout_s
        self._handle = handle
        self._destroyed = False

    @classmethod
    def connect(
        cls, name: str = "naming", namespace: str = "rlinfra", detached: bool = False, timeout_s: float = 10.0
    ) -> NamingService:
        """Find the service or create it (race-safe), and wait until it answers."""
        _require_ray(name, "connect")
        handle = NamingStore.options(  # type: ignore[attr-defined]  # a Ray actor class
            name=name, namespace=namespace, get_if_exists=True, lifetime="detached" if detached else None
        ).remote()
        client = cls(handle, name, namespace, timeout_s)
        client._call("connect", "ping", timeout_s=DEFAULT_START_TIMEOUT_S)
        return client

    @classmethod
    def lookup(
        cls, name: str = "naming", namespace: str = "rlinfra", timeout_s: float = 10.0
    ) -> NamingService:
        """Find an existing service; ``NamingError`` if there is none (nothing is created)."""
        _require_ray(name, "lookup")
        client = cls(None, name, namespace, timeout_s)
        client._call("lookup", "ping")
        return client

    def put(self, key: str, value: Any, ttl_s: float | None = None) -> int:
        """Set ``key`` (for ``ttl_s`` seconds); returns the version a ``watch`` can start from."""
        return self._call(f"put({key!r})", "put", key, _value(key, value), _ttl(ttl_s))

    def get(self, key: str, default: Any = None) -> Any:
        value = self._call(f"get({key!r})", "get", key)
        return default if value is None else value

    def delete(self, key: str) -> bool:
        """Delete ``key``; False if it was absent."""
        return self._call(f"delete({key!r})", "delete", key)

    def list(self, prefix: str = "") -> dict[str, Any]:
        """Every live key starting with ``prefix``, with its value."""
        return self._call(f"list({prefix!r})", "list", prefix)

    def put_if_absent(self, key: str, value: Any, ttl_s: float | None = None) -> bool:
        """Atomically set ``key`` unless it exists; True if this call set it (a claim)."""
        return self.compare_and_set(key, None, value, ttl_s)

    def compare_and_set(self, key: str, expected: Any, new: Any, ttl_s: float | None = None) -> bool:
        """Atomically set ``key`` to ``new`` if its value equals ``expected`` (None: if absent)."""
        op = f"compare_and_set({key!r})"
        return self._call(op, "compare_and_set", key, expected, _value(key, new), _ttl(ttl_s))

    def watch(
        self, prefix: str = "", since_version: int | None = None, timeout_s: float = 30.0
    ) -> tuple[int, builtins.list[Change]]:
        """Wait until a key under ``prefix`` changes after ``since_version`` (None: after now), at
        most ``timeout_s``; returns ``(version, changes)``; pass ``version`` to the next call to
        miss nothing. ``changes`` is empty on timeout, and ``snapshot`` entries when history cannot
        be replayed (``since_version=0`` reads the state and a version to follow it from)."""
        op = f"watch({prefix!r})"  # the store answers at its own deadline; the call waits past it
        return self._call(op, "watch", prefix, since_version, timeout_s, timeout_s=timeout_s + self.timeout_s)

    @contextlib.contextmanager
    def registered(self, key: str, value: Any, ttl_s: float) -> Iterator[Registration]:
        """Hold ``key = value`` for the block: a claim (``NamingError`` if someone else holds the
        key), refreshed every ``ttl_s / 3`` from a thread, so it expires within ``ttl_s`` of this
        process stopping; put back if the service restarted empty, never taken back from another
        holder (that is the registration's ``error``); deleted at the end of the block."""
        if self._call(f"register({key!r})", "hold", key, _value(key, value), _ttl(ttl_s)) == "taken":
            raise NamingError(f"{self}: register({key!r}): held by another: {self.get(key)!r}")
        held = Registration(key, value)
        keeper = threading.Thread(target=self._keep, args=(held, ttl_s), name=f"naming-{key}", daemon=True)
        keeper.start()
        try:
            yield held
        finally:
            held.stop.set()
            keeper.join(self.timeout_s + 2.0)  # a call in flight ends by its own deadline
            with contextlib.suppress(NamingError):  # withdraw the key only if it is still ours
                self._call(f"withdraw({key!r})", "compare_and_set", key, value, None, None)

    def _keep(self, held: Registration, ttl_s: float) -> None:
        while not held.stop.wait(ttl_s / 3):
            try:
                outcome = self._call(f"register({held.key!r})", "hold", held.key, held.value, ttl_s)
                if outcome == "taken":
                    raise NamingError(f"{self}: {held.key!r} was taken by another holder; not taken back")
                held.restored += outcome == "put"
                held.error = None
            except NamingError as err:  # keep trying: the service may come back
                if str(err) != str(held.error):
                    logger.warning("%s", err)
                held.error = err

    def destroy(self) -> None:
        """Kill the service and wait until its name is free, so that a ``connect`` right after
        creates a fresh one. Idempotent."""
        if self._destroyed:
            return
        self._destroyed = True
        try:
            handle = self._resolve("destroy")
        except NamingError:
            return  # already gone
        ray.kill(handle, no_restart=True)

        def gone() -> bool | None:  # Ray frees the name once the actor is dead
            try:
                return True if ray.get_actor(self.name, namespace=self.namespace) != handle else None
            except ValueError:
                return True

        message = f"{self}: destroy: the service was killed but still exists after the deadline"
        poll(gone, Deadline.after(self.timeout_s), lambda: NamingError(message), every_s=0.02)

    def __repr__(self) -> str:
        return f"naming service {self.name!r} (namespace {self.namespace!r})"

    def _resolve(self, op: str) -> Any:
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
            ray.cancel(ref)
            raise NamingError(f"{self}: {op}: no reply within {timeout:g} s") from None
        except RayActorError as err:
            if isinstance(err, ActorDiedError):
                self._handle = None  # for good: look the name up again, someone may re-create it
            raise NamingError(f"{self}: {op}: the service died or is unreachable ({err})") from err
        except RayTaskError as err:
            raise NamingError(f"{self}: {op}: failed inside the service: {err.cause!r}") from err


def _require_ray(name: str, op: str) -> None:
    if not ray.is_initialized():
        raise NamingError(
            f"naming service {name!r}: {op}: Ray is not initialised; start or attach one first "
            f"(rlinfra.Cluster, or ray.init(address=...))"
        )


def _value(key: str, value: Any) -> Any:
    if not isinstance(key, str):
        raise TypeError(f"naming keys are strings, got {type(key).__name__}")
    if value is None:
        raise ValueError(f"cannot store None under {key!r}: None means 'absent' (use delete)")
    return value


def _ttl(ttl_s: float | None) -> float | None:
    if ttl_s is not None and not ttl_s > 0:
        raise ValueError(f"ttl_s must be positive seconds, got {ttl_s!r}")
    return ttl_s
