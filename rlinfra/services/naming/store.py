"""The naming service itself: an async Ray actor holding keys, versions, TTLs and leases; and the
values and errors it and its clients exchange."""

from __future__ import annotations

import asyncio
import builtins  # the classes here define a method named list
import contextlib
import heapq
import itertools
import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

import ray

from rlinfra.runtime.deadline import Deadline

logger = logging.getLogger("rlinfra.services.naming")

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


# How many changes the service remembers for watch(); an older since_version gets a snapshot.
HISTORY_LIMIT = 10_000


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
        # Versions start at the wall clock in microseconds, so that a restarted store continues
        # above its previous incarnation and a watcher's old since_version gets a snapshot instead
        # of silently missing changes.
        self._version = time.time_ns() // 1000
        self._history: deque[Change] = deque(maxlen=HISTORY_LIMIT)
        self._history_floor = self._version  # every change with a larger version is in _history
        self._deadlines: list[tuple[float, str, str]] = []  # a heap of (expires_at, kind, id)
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

    async def get(self, key: str) -> Any:
        """The value, or None if absent (None is never stored)."""
        self._start()
        entry = self._entries.get(key)
        return None if entry is None else entry.value

    async def delete(self, key: str) -> bool:
        self._start()
        return self._remove(key, "delete")

    async def list(self, prefix: str) -> dict[str, Any]:
        self._start()
        return {key: entry.value for key, entry in self._entries.items() if key.startswith(prefix)}

    async def put_if_absent(self, key: str, value: Any, ttl_s: float | None, lease_id: str | None) -> bool:
        return await self.compare_and_set(key, None, value, ttl_s, lease_id)

    async def compare_and_set(
        self, key: str, expected: Any, new: Any, ttl_s: float | None, lease_id: str | None
    ) -> bool:
        self._start()
        expires_at = self._expiry(ttl_s, lease_id)
        entry = self._entries.get(key)
        matches = entry is None if expected is None else entry is not None and entry.value == expected
        if matches:
            self._set(key, new, expires_at, lease_id)
        return matches

    async def grant_lease(self, ttl_s: float) -> str:
        self._start()
        # Random ids, not a counter: a restarted store must never hand out an id an old holder
        # still refreshes, or it would keep someone else's keys alive.
        lease_id = uuid.uuid4().hex
        state = self._leases[lease_id] = _LeaseState(ttl_s, time.monotonic() + ttl_s)
        self._push_deadline(state.expires_at, "lease", lease_id)
        return lease_id

    async def keep_alive(self, lease_id: str) -> None:
        self._start()
        state = self._require_lease(lease_id)
        state.expires_at = time.monotonic() + state.ttl_s
        self._push_deadline(state.expires_at, "lease", lease_id)

    async def revoke_lease(self, lease_id: str) -> int:
        self._start()
        return self._end_lease(lease_id, "delete") if lease_id in self._leases else 0

    async def watch(
        self, prefix: str, since_version: int | None, timeout_s: float
    ) -> tuple[int, builtins.list[Change]]:
        self._start()
        since = self._version if since_version is None else since_version
        deadline = Deadline.after(timeout_s)
        while True:
            if since > self._version or since < self._history_floor:
                return self._version, self._snapshot(prefix)
            changes = self._changes_since(since, prefix)
            if changes or deadline.expired:
                return self._version, changes
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), deadline.left())

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
        self._version += 1
        self._entries[key] = _Entry(value, self._version, expires_at, lease_id)
        if expires_at is not None:
            self._push_deadline(expires_at, "key", key)
        self._record(Change(key, "put", value, self._version))
        return self._version

    def _remove(self, key: str, kind: ChangeKind) -> bool:
        entry = self._entries.pop(key, None)
        if entry is None:
            return False
        self._version += 1
        self._record(Change(key, kind, entry.value, self._version))
        return True

    def _end_lease(self, lease_id: str, kind: ChangeKind) -> int:
        """End the lease and remove the keys that live by it (a scan: leases end seldom, and the
        entries say which lease each key lives by, so nothing else has to be kept in step)."""
        del self._leases[lease_id]
        keys = sorted(key for key, entry in self._entries.items() if entry.lease_id == lease_id)
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

    def _changes_since(self, since: int, prefix: str) -> builtins.list[Change]:
        newer = itertools.takewhile(lambda change: change.version > since, reversed(self._history))
        return [change for change in reversed(list(newer)) if change.key.startswith(prefix)]

    def _snapshot(self, prefix: str) -> builtins.list[Change]:
        return [
            Change(key, "snapshot", entry.value, entry.version)
            for key, entry in sorted(self._entries.items())
            if key.startswith(prefix)
        ]

    def _push_deadline(self, expires_at: float, kind: str, ident: str) -> None:
        heapq.heappush(self._deadlines, (expires_at, kind, ident))
        if self._deadlines[0][0] == expires_at:
            self._wake.set()

    def _expire_due(self, now: float) -> None:
        """Drop every key and lease whose deadline passed. Heap items are never updated in place
        (a keep-alive pushes a new one), so an item counts only if it matches the current state."""
        while self._deadlines and self._deadlines[0][0] <= now:
            expires_at, kind, ident = heapq.heappop(self._deadlines)
            table, end = (self._entries, self._remove) if kind == "key" else (self._leases, self._end_lease)
            current = table.get(ident)
            if current is not None and current.expires_at == expires_at:
                end(ident, "expire")

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
