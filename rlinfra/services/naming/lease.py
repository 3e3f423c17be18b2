"""Leases: a handle that survives re-grants, and the keeper thread that keeps one alive."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from rlinfra.services.naming.store import LeaseExpired, NamingError

if TYPE_CHECKING:
    from rlinfra.services.naming.client import NamingService

logger = logging.getLogger("rlinfra.services.naming")


class Lease:
    """A lease held through one ``NamingService`` client.

    Keys put with ``lease=`` vanish when the lease is not kept alive for ``ttl_s``. The object
    also remembers which keys this client put under it, so that a keeper can re-grant the lease
    (``id`` then changes) and put them back after an expiry; use the same object throughout. The
    bookkeeping is the lease's own: the client records writes under ``held`` (one lock, so a
    keeper cannot re-grant between a put and its record) and asks it what to put back.
    """

    def __init__(self, lease_id: str, ttl_s: float) -> None:
        self.id = lease_id  # the server's: replaced (under the lock) when a keeper re-grants it
        self.ttl_s = ttl_s
        self.revoked = False
        # key -> (value, exclusive); exclusive keys are re-claimed with put_if_absent, so a key
        # someone else took over while this lease was lost is not stolen back.
        self._keys: dict[str, tuple[Any, bool]] = {}
        self._pending: set[str] = set()  # keys still to re-register after a re-grant
        self._lock = threading.RLock()

    @property
    def keys(self) -> list[str]:
        """The keys this client holds under the lease (and will re-register after a loss)."""
        return sorted(self._keys)

    @contextlib.contextmanager
    def held(self, what: str) -> Iterator[None]:
        """The lease, locked for one write; ``LeaseExpired`` (naming ``what``) once revoked."""
        with self._lock:
            if self.revoked:
                raise LeaseExpired(f"{what}: {self!r} was revoked")
            yield

    def record(self, key: str, value: Any, exclusive: bool) -> None:
        """``key`` was written under this lease (call inside ``held``)."""
        self._keys[key] = (value, exclusive)

    def forget(self, key: str) -> None:
        """Stop re-registering ``key``: it was overwritten or deleted outside this lease."""
        if key in self._keys:  # the lock only where there is something to drop
            with self._lock:
                self._keys.pop(key, None)

    def mark_revoked(self) -> None:
        with self._lock:
            self.revoked = True
            self._keys.clear()

    def replace_id(self, failed_id: str, grant: Callable[[], str]) -> bool:
        """Take the id ``grant()`` returns in place of the expired ``failed_id`` and mark every
        key for re-registration; False (and no grant) if the lease was revoked or re-granted."""
        with self._lock:
            if self.revoked or self.id != failed_id:
                return False
            self.id = grant()
            self._pending = set(self._keys)
            return True

    def reregister(self, put: Callable[[str, Any, bool], bool]) -> list[str]:
        """Put back the pending keys with ``put(key, value, exclusive) -> won``; returns the claims
        someone else took meanwhile (dropped, not stolen back)."""
        lost: list[str] = []
        with self._lock:
            for key in sorted(self._pending):
                entry = self._keys.get(key)
                if entry is not None and not put(key, *entry):
                    del self._keys[key]
                    lost.append(key)
                self._pending.discard(key)
        return lost

    def __repr__(self) -> str:
        return f"Lease({self.id[:8]}…, ttl_s={self.ttl_s:g}, keys={len(self._keys)})"


class LeaseKeeper:
    """A daemon thread (started at construction) that keeps one lease alive and repairs it after a loss.

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
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """Stop refreshing and join the thread; ``NamingError`` if it does not end in time (a
        call stuck past its own deadline). The lease itself is left to expire (or revoke it)."""
        self._stop.set()
        timeout = self.client.timeout_s + 2.0  # a call in flight ends by its own deadline
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
                if self.client.regrant_lease(self.lease, lease_id):
                    self.regrants += 1
                    logger.warning(
                        "lease keeper: %s; granted %r and re-registering its keys", err, self.lease
                    )
            self.client.repair_lease(self.lease)
        except Exception as err:
            if not self._failing or repr(err) != repr(self.error):  # each distinct failure once
                # A NamingError names the service already; anything else gets it added.
                detail = str(err) if isinstance(err, NamingError) else f"{self.client}: {err!r}"
                logger.warning("lease keeper for %r: %s", self.lease, detail)
            self.error = err
            self._failing = True
            return
        if self._failing:
            self._failing = False
            logger.info("lease keeper for %r of %s recovered", self.lease, self.client)
