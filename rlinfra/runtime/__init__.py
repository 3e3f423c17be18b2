"""The runtime layer: Ray connection, worker groups, layouts, failure surfacing, time-sharing.

Names are loaded on first use: ``rlinfra.runtime.bundles`` (the pure layout table) must stay
importable without pulling in Ray, for ``rlinfra plan``. These are the names ``rlinfra`` exports;
everything else is imported from its module (``rlinfra.runtime.timesharing.SwitchError``).
"""

from rlinfra.lazy_exports import lazy_exports

_NAMES_BY_MODULE = {
    "cluster": ("Cluster",), "errors": ("ClusterError", "RankFailure", "WorkerGroupError"),
    "calls": ("GroupCall",), "layout": ("Layout", "ReservationError"), "worker": ("Worker",),
    "address": ("WorkerAddress",), "group": ("WorkerGroup",), "fused": ("fuse",),
    "timeshared": ("TimeShared",), "timesharing": ("TimeSharing",),
}  # fmt: skip
_EXPORTS = {name: f"{__name__}.{module}" for module, names in _NAMES_BY_MODULE.items() for name in names}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
