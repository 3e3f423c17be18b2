"""The runtime layer: Ray connection, worker groups, layouts, failure surfacing, time-sharing.

Names are loaded on first use: ``rlinfra.runtime.bundles`` (the pure layout table) must stay
importable without pulling in Ray, for ``rlinfra plan``. These are the names ``rlinfra`` exports;
everything else is imported from its module (``rlinfra.runtime.timesharing.SwitchError``).
"""

from rlinfra.lazy_exports import lazy_exports

_EXPORTS = {
    "Cluster": "rlinfra.runtime.cluster",
    "ClusterError": "rlinfra.runtime.errors",
    "GroupCall": "rlinfra.runtime.calls",
    "Layout": "rlinfra.runtime.layout",
    "RankFailure": "rlinfra.runtime.errors",
    "ReservationError": "rlinfra.runtime.layout",
    "Worker": "rlinfra.runtime.worker",
    "WorkerAddress": "rlinfra.runtime.address",
    "WorkerGroup": "rlinfra.runtime.group",
    "WorkerGroupError": "rlinfra.runtime.errors",
    "fuse": "rlinfra.runtime.fused",
    "TimeShared": "rlinfra.runtime.timeshared",
    "TimeSharing": "rlinfra.runtime.timesharing",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
