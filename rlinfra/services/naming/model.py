"""The values and errors the naming service and its clients exchange."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

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
