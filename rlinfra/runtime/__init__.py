"""The runtime layer: Ray connection, worker groups, layouts, failure surfacing, time-sharing.

Names are loaded on first use: ``rlinfra.runtime.bundles`` (the pure layout table) must stay
importable without pulling in Ray, for ``rlinfra plan``.
"""

from rlinfra.lazy_exports import lazy_exports

_EXPORTS = {
    "Cluster": "rlinfra.runtime.cluster",
    "ClusterError": "rlinfra.runtime.errors",
    "ComponentAsleepError": "rlinfra.runtime.timesharing",
    "GroupCall": "rlinfra.runtime.calls",
    "GroupMethod": "rlinfra.runtime.group_views",
    "Layout": "rlinfra.runtime.layout",
    "RankFailure": "rlinfra.runtime.errors",
    "ReservationError": "rlinfra.runtime.layout",
    "SwitchError": "rlinfra.runtime.timesharing",
    "Worker": "rlinfra.runtime.worker",
    "WorkerAddress": "rlinfra.runtime.address",
    "WorkerGroup": "rlinfra.runtime.group",
    "WorkerGroupError": "rlinfra.runtime.errors",
    "fuse": "rlinfra.runtime.fused",
    "compose_env": "rlinfra.runtime.env",
    "SecretError": "rlinfra.runtime.secrets",
    "TopologyError": "rlinfra.runtime.topology",
    "TimeShared": "rlinfra.runtime.timeshared",
    "TimeSharing": "rlinfra.runtime.timesharing",
    "TimeSharingError": "rlinfra.runtime.timesharing",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
