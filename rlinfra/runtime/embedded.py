"""Starting a private Ray for this driver: one local node, or N simulated nodes.

``ray.init()`` with no address can attach to (or hang on) a stray local cluster, and ``ray stop``
kills everybody's Ray; so the embedded Ray is always started fresh (``address="local"`` or
``ray.cluster_utils.Cluster``) and shut down by the object that started it. Health checks are
tightened so that a lost node is noticed in about 2 s instead of 15 s.

Closed by default: every process of the embedded Ray (GCS, raylets, workers, agents) listens on
loopback only, and a client needs this run's token, made fresh per run (``LocalOnly``).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from typing import Any

import ray
from ray._private import ray_constants
from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]

from rlinfra.placement.config import DEFAULT_SIMULATED_CPUS, ClusterConfig
from rlinfra.runtime.discovery import NODE_RANK_LABEL
from rlinfra.runtime.errors import ClusterError

# A dead raylet is declared dead after period x threshold (~1.5 s) instead of Ray's 3 s x 5.
HEALTH_CHECK_CONFIG = {"health_check_period_ms": 500, "health_check_failure_threshold": 3}
# What the head node starts with, local or simulated.
HEAD_ARGS: dict[str, Any] = {"include_dashboard": False, "_system_config": HEALTH_CHECK_CONFIG}

LOOPBACK = "127.0.0.1"
# Ray binds its gRPC servers to loopback only when a node's address is exactly 127.0.0.1, and
# resolves 127.0.0.1 to the host's address unless clusters are off for the process (its own
# switch for macOS and Windows, ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``).
_CLUSTERS_SWITCH = ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR
_AUTH_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", _CLUSTERS_SWITCH)


class LocalOnly:
    """What keeps the embedded Ray to this machine, for as long as it runs.

    The driver's environment, inherited by every process Ray starts, carries token mode with a
    token made for this run (never written to a file, a runtime_env or a log), and Ray's switch
    that keeps node addresses on loopback. ``close`` restores what was there before, so a later
    Ray in this process (another ``Cluster``, a test) starts from the user's own settings.
    """

    def __init__(self) -> None:
        if os.environ.get("RAY_AUTH_MODE", "").strip().lower() == "disabled":
            raise ClusterError(
                "RAY_AUTH_MODE=disabled: the embedded Ray always requires a token of its own (made "
                "fresh for this run); unset RAY_AUTH_MODE, or set cluster.address to a Ray you started"
            )
        self._saved_env = {name: os.environ.get(name) for name in _AUTH_VARIABLES}
        self._saved_switch = ray_constants.ENABLE_RAY_CLUSTER
        self._closed = False
        os.environ.update(
            {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32), _CLUSTERS_SWITCH: "0"}
        )
        ray_constants.ENABLE_RAY_CLUSTER = False  # read at import; this process imported Ray already
        _reload_auth()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        ray_constants.ENABLE_RAY_CLUSTER = self._saved_switch
        _reload_auth()


def _reload_auth() -> None:
    """Ray caches the auth mode and the token per process: the mode first, then the token (a
    draining gRPC thread may reload the token meanwhile, and must find the mode it goes with)."""
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


@dataclass
class EmbeddedRay:
    """A Ray instance this process started, and knows how to stop."""

    _local_only: LocalOnly
    simulated: Any = None  # the ``ray.cluster_utils.Cluster`` of a simulated Ray (None: one local node)
    _node_args: list[dict[str, Any]] = field(default_factory=list)  # per node rank: its raylet's arguments
    _nodes: dict[int, Any] = field(default_factory=dict)  # node rank -> its ``ray._private.node.Node``

    @classmethod
    def start_local(cls) -> EmbeddedRay:
        local_only = LocalOnly()
        try:
            ray.init(address="local", _node_ip_address=LOOPBACK, **HEAD_ARGS, **_quiet())
        except BaseException:
            local_only.close()
            raise
        return cls(local_only)

    @classmethod
    def start_simulated(cls, config: ClusterConfig) -> EmbeddedRay:
        """One real raylet per node of ``config.simulate``, each labelled with its node rank so
        that ranks are stable across restarts (simulated nodes share one IP), with the config's
        CPUs, custom resources and labels per node and object store size (else Ray's
        test-cluster default)."""
        from ray.cluster_utils import Cluster as RayTestCluster

        resources, labels = config.simulate_resources, config.simulate_labels
        store_mib = config.simulate_object_store_mib
        node_args: list[dict[str, Any]] = [
            {
                "num_cpus": config.simulate_cpus or DEFAULT_SIMULATED_CPUS,
                "num_gpus": count,
                "resources": dict(resources[rank]) if resources else {},
                "labels": {**(labels[rank] if labels else {}), NODE_RANK_LABEL: str(rank)},
                "node_ip_address": LOOPBACK,
                **({"object_store_memory": store_mib * 2**20} if store_mib else {}),
            }
            for rank, count in enumerate(config.simulate or ())
        ]
        local_only = LocalOnly()
        simulated = None
        try:
            simulated = RayTestCluster(initialize_head=True, head_node_args={**node_args[0], **HEAD_ARGS})
            nodes = [simulated.head_node, *(simulated.add_node(**args) for args in node_args[1:])]
            ray.init(address=simulated.address, **_quiet())
        except BaseException:
            if simulated is not None:
                simulated.shutdown()
            local_only.close()
            raise
        return cls(local_only, simulated, node_args, dict(enumerate(nodes)))

    def kill_node(self, rank: int) -> None:
        """Kill simulated node ``rank``'s raylet and everything on it without a graceful shutdown,
        as a crash would (to rehearse node loss)."""
        if rank not in self._nodes:
            raise ClusterError(f"simulated node {rank} is not running (nodes: {sorted(self._nodes)})")
        self.simulated.remove_node(self._nodes.pop(rank), allow_graceful=False)

    def restart_node(self, rank: int) -> None:
        """Start a lost simulated node again: a new raylet with the same devices, CPUs, resources
        and labels, the node-rank label included, so it takes its old rank (a new node id). The
        head (rank 0) holds Ray's control store: losing it ends the cluster, so it is refused."""
        if not 0 <= rank < len(self._node_args):
            raise ClusterError(f"this Ray has no simulated node {rank}")
        if rank == 0:
            raise ClusterError("node 0 is the head: it cannot be restarted (the cluster ends with it)")
        if rank in self._nodes:
            raise ClusterError(f"node {rank} is running: only a killed node can be restarted")
        self._nodes[rank] = self.simulated.add_node(**self._node_args[rank])

    def shutdown(self) -> None:
        ray.shutdown()
        if self.simulated is not None:
            self.simulated.shutdown()
            self.simulated = None
        self._local_only.close()


def _quiet() -> dict[str, Any]:
    """Keep Ray's start-up banner out of the user's terminal unless they ask for it."""
    if os.environ.get("RLINFRA_RAY_VERBOSE"):
        return {}
    return {"logging_level": "warning", "log_to_driver": True}
