"""The runtime layer: Ray connection, worker groups, failure surfacing."""

from rlinfra.runtime.calls import GroupCall
from rlinfra.runtime.cluster import Cluster
from rlinfra.runtime.errors import ClusterError, RankFailure, WorkerGroupError
from rlinfra.runtime.group import GroupMethod, WorkerGroup
from rlinfra.runtime.worker import Worker

__all__ = [
    "Cluster",
    "ClusterError",
    "GroupCall",
    "GroupMethod",
    "RankFailure",
    "Worker",
    "WorkerGroup",
    "WorkerGroupError",
]
