"""The runtime layer: Ray connection, worker groups, layouts, failure surfacing.

Names are loaded on first use: ``rlinfra.runtime.bundles`` (the pure layout table) must stay
importable without pulling in Ray, for ``rlinfra plan``.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "Cluster": "rlinfra.runtime.cluster",
    "ClusterError": "rlinfra.runtime.errors",
    "GroupCall": "rlinfra.runtime.calls",
    "GroupMethod": "rlinfra.runtime.group",
    "Layout": "rlinfra.runtime.layout",
    "RankFailure": "rlinfra.runtime.errors",
    "ReservationError": "rlinfra.runtime.layout",
    "Worker": "rlinfra.runtime.worker",
    "WorkerAddress": "rlinfra.runtime.address",
    "WorkerGroup": "rlinfra.runtime.group",
    "WorkerGroupError": "rlinfra.runtime.errors",
    "fuse": "rlinfra.runtime.fused",
    "compose_env": "rlinfra.runtime.env",
    "looks_like_secret": "rlinfra.runtime.env",
    "SecretError": "rlinfra.runtime.secrets",
    "TopologyError": "rlinfra.runtime.topology",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'rlinfra.runtime' has no attribute {name!r}")
