"""The ways a version's buckets travel, one module each, by the name ``WeightSync`` takes.

Each module holds a transport's driver side (a ``Transport``), sender side and receiver side.
``BY_NAME`` is all the barrier knows of them; ``WeightSender`` and ``WeightReceiver`` list the
worker sides as their bases. Adding a transport: a module here, a line below, and its sides in
those two lists — no branch to edit anywhere.
"""

from rlinfra.services.weights.transports.base import Transport
from rlinfra.services.weights.transports.broadcast import BroadcastTransport
from rlinfra.services.weights.transports.object_store import ObjectStoreTransport
from rlinfra.services.weights.transports.shared import SharedTransport

BY_NAME: dict[str, type[Transport]] = {
    "object_store": ObjectStoreTransport,
    "object_store_shared": SharedTransport,
    "broadcast": BroadcastTransport,
}
