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

from rlinfra.services.naming.client import NamingService
from rlinfra.services.naming.lease import Lease, LeaseKeeper
from rlinfra.services.naming.store import Change, LeaseExpired, NamingError

__all__ = ["Change", "Lease", "LeaseExpired", "LeaseKeeper", "NamingError", "NamingService"]
