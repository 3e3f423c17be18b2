"""The client: connect or look up a naming service by name and call it with deadlines."""

from __future__ import annotations

import builtins  # the classes here define a method named list
import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

import ray
from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError, RayTaskError

from rlinfra.runtime.deadline import Deadline, poll
from rlinfra.services.naming.lease import Lease, LeaseKeeper
from rlinfra.services.naming.store import Change, NamingError, NamingStore

logger = logging.getLogger("rlinfra.services.naming")

DEFAULT_NAME = "naming"
DEFAULT_NAMESPACE = "rlinfra"
DEFAULT_TIMEOUT_S = 10.0
# Starting the service's process can take several seconds on a loaded node.
DEFAULT_START_TIMEOUT_S = 60.0
DEFAULT_WATCH_TIMEOUT_S = 30.0


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
    ) -> NamingService:
        """Find the service, or create it (detached: it outlives this driver), and wait until it
        answers (``DEFAULT_START_TIMEOUT_S``)."""
        _require_ray(name, "connect")
        handle = NamingStore.options(  # type: ignore[attr-defined]  # a Ray actor class
            name=name, namespace=namespace, get_if_exists=True, lifetime="detached" if detached else None
        ).remote()
        client = cls(handle, name, namespace, timeout_s)
        client._call("connect", "ping", timeout_s=DEFAULT_START_TIMEOUT_S)
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
        return self._write("put", key, value, ttl_s, lease)

    def get(self, key: str, default: Any = None) -> Any:
        value = self._call(f"get({key!r})", "get", key)
        return default if value is None else value

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
        return self._write("put_if_absent", key, value, ttl_s, lease)

    def compare_and_set(
        self, key: str, expected: Any, new: Any, ttl_s: float | None = None, lease: Lease | None = None
    ) -> bool:
        """Atomically set ``key`` to ``new`` if its value equals ``expected`` (``None``: if it is
        absent); True if it was set."""
        return self._write("compare_and_set", key, new, ttl_s, lease, expected)

    def watch(
        self, prefix: str = "", since_version: int | None = None, timeout_s: float = DEFAULT_WATCH_TIMEOUT_S
    ) -> tuple[int, builtins.list[Change]]:
        """Wait until a key under ``prefix`` changes after ``since_version`` (None: after now),
        at most ``timeout_s``; returns ``(version, changes)``. Pass ``version`` to the next call to
        miss nothing. ``changes`` is empty on timeout; it holds ``snapshot`` entries (every current
        key under the prefix, returned at once) when history cannot be replayed: the service
        restarted, ``since_version`` is very old, or it is 0 (a way to read the state and a version
        to follow it from, in one call)."""
        op = f"watch({prefix!r})"  # the store answers at its own deadline; the call waits past it
        return self._call(op, "watch", prefix, since_version, timeout_s, timeout_s=timeout_s + self.timeout_s)

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
        lease.mark_revoked()
        removed = self._call(f"revoke_lease({lease.id[:8]}…)", "revoke_lease", lease.id)
        if lease in self._leases:
            self._leases.remove(lease)
        return removed

    def keep_alive_in_background(self, lease: Lease, interval_s: float | None = None) -> LeaseKeeper:
        """Start a thread that refreshes ``lease`` every ``interval_s`` (default ttl/3) and
        re-grants and re-registers it after a loss; stop it with ``keeper.stop()``."""
        keeper = LeaseKeeper(self, lease, interval_s if interval_s is not None else lease.ttl_s / 3)
        self._keepers.append(keeper)
        return keeper

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

    def regrant_lease(self, lease: Lease, failed_id: str) -> bool:
        """Replace the expired ``failed_id`` of ``lease`` with a new server lease and mark every
        key for re-registration; False if the lease was revoked or already re-granted."""
        return lease.replace_id(failed_id, lambda: self._call("grant_lease", "grant_lease", lease.ttl_s))

    def repair_lease(self, lease: Lease) -> None:
        """Put back the keys of ``lease`` still pending after a re-grant (nothing to do
        otherwise); ``NamingError`` lists claims that were taken by someone else meanwhile (those
        are dropped, not stolen back)."""

        def put(key: str, value: Any, exclusive: bool) -> bool:
            method = "put_if_absent" if exclusive else "put"
            return self._call(f"{method}({key!r})", method, key, value, None, lease.id) is not False

        lost = lease.reregister(put)
        if lost:
            raise NamingError(
                f"{self}: re-registering {lease!r}: {lost} were taken by another holder while the "
                f"lease was lost; they are no longer held"
            )

    # -- lifecycle --------------------------------------------------------------------------

    def destroy(self) -> None:
        """Kill the service (detached or not) and wait until its name is free, so that a
        ``connect`` right after creates a fresh one. Idempotent."""
        if self._destroyed:
            return
        for keeper in self._keepers:
            keeper.stop()
        self._destroyed = True
        try:
            handle = self._resolve("destroy")
        except NamingError:
            return  # already gone
        ray.kill(handle, no_restart=True)

        def gone() -> bool | None:  # Ray frees the name once the actor is dead
            try:
                current = ray.get_actor(self.name, namespace=self.namespace)
            except ValueError:
                return True
            return True if current != handle else None  # another actor of that name: made anew

        message = f"{self}: destroy: the service was killed but still exists after the deadline"
        poll(gone, Deadline.after(self.timeout_s), lambda: NamingError(message), every_s=0.02)

    def __repr__(self) -> str:
        return f"naming service {self.name!r} (namespace {self.namespace!r})"

    # -- plumbing ---------------------------------------------------------------------------

    def _write(
        self, method: str, key: str, value: Any, ttl_s: float | None, lease: Lease | None, *expected: Any
    ) -> Any:
        """``put`` (returns the version) or a conditional write (``expected``: compare_and_set's),
        which returns whether it won and, when it loses, changes nothing here either. A claim (a
        conditional write under a lease) is re-registered after a loss only if nobody took it."""
        if not isinstance(key, str):
            raise TypeError(f"naming keys are strings, got {type(key).__name__}")
        if value is None:
            raise ValueError(f"cannot store None under {key!r}: None means 'absent' (use delete)")
        _check_ttl(ttl_s)
        if ttl_s is not None and lease is not None:
            raise ValueError(f"{key!r}: give ttl_s or lease, not both (a key lives by one clock)")
        op = f"{method}({key!r})"
        if lease is None:
            result = self._call(op, method, key, *expected, value, ttl_s, None)
            if result is not False:
                self._forget(key)
            return result
        self._forget(key, keep=lease)
        with lease.held(f"{self}: {op}"):
            result = self._call(op, method, key, *expected, value, None, lease.id)
            if result is not False:
                lease.record(key, value, exclusive=method != "put")
            return result

    def _forget(self, key: str, keep: Lease | None = None) -> None:
        """Stop re-registering ``key`` under any lease but ``keep``: it was overwritten or
        deleted. One lease lock at a time, so two threads can never deadlock on two leases."""
        for lease in list(self._leases):
            if lease is not keep:
                lease.forget(key)

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
            if isinstance(err.cause, NamingError):
                raise type(err.cause)(f"{self}: {op}: {err.cause}") from None
            raise NamingError(f"{self}: {op}: failed inside the service: {err.cause!r}") from err


def _require_ray(name: str, op: str) -> None:
    if not ray.is_initialized():
        raise NamingError(
            f"naming service {name!r}: {op}: Ray is not initialised; start or attach one first "
            f"(rlinfra.Cluster, or ray.init(address=...))"
        )


def _check_ttl(ttl_s: float | None) -> None:
    if ttl_s is not None and not ttl_s > 0:
        raise ValueError(f"ttl_s must be positive seconds, got {ttl_s!r}")
