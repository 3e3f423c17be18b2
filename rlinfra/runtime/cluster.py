"""``Cluster``: the connection to Ray, the ranked nodes, and the same ``ClusterSpec`` dry runs use.

``Cluster(cluster_cfg=cfg.cluster)`` connects to ``cluster.address`` (or ``RAY_ADDRESS``) when one
is given, else starts a private embedded Ray: one local node, or ``cluster.simulate: "NxG"``
simulated nodes with G logical GPUs each. A ``simulate`` config run where ``RAY_ADDRESS`` is set
(inside a Slurm allocation rlinfra's script started) uses that cluster, whose nodes must have the
simulated shape, instead of simulating it. It then waits (with a deadline) for ``num_nodes`` nodes,
ranks them stably, and builds a ``ClusterSpec`` from what Ray reports, so that
``ComponentPlacement(cfg, cluster)`` gives exactly what ``rlinfra plan`` showed.
"""

from __future__ import annotations

import copy
import logging
import os
import sys
import time
from typing import Any

import ray

from rlinfra.placement.cluster_spec import ClusterSpec
from rlinfra.placement.config import ClusterConfig, parse_cluster_config
from rlinfra.placement.config_access import as_mapping
from rlinfra.placement.node_groups import NodeSpec
from rlinfra.runtime.deadline import Deadline
from rlinfra.runtime.discovery import RayNode, rank_nodes
from rlinfra.runtime.embedded import EmbeddedRay
from rlinfra.runtime.errors import ClusterError
from rlinfra.runtime.ledger import resource_diff
from rlinfra.runtime.stacks import session_logs_dir

# Settings that shape a simulated cluster only.
SIMULATED_ONLY = ("simulate_cpus", "simulate_object_store_mib", "simulate_resources", "simulate_labels")


class Cluster:
    """A Ray cluster described by ``cluster_cfg``; use as a context manager or call ``shutdown``.

    Keyword arguments override the config: ``address``, ``simulate`` (``"NxG"`` or per-node
    counts), ``num_nodes``, ``node_timeout`` (seconds to wait for the nodes),
    ``simulate_cpus`` (logical CPUs per simulated node), ``simulate_object_store_mib`` (each simulated
    node's object store; Ray's test clusters give 150 MiB), ``simulate_resources`` and
    ``simulate_labels`` (one mapping per simulated node: Ray custom resources and node labels,
    to rehearse topology constraints). ``config`` is the parsed section, ``section`` the plain
    mapping it was parsed from (overrides applied), so that ``ComponentPlacement`` can reuse
    ``config`` instead of parsing the same section again.
    """

    def __init__(self, cluster_cfg: Any = None, **overrides: Any) -> None:
        section = as_mapping(cluster_cfg if cluster_cfg is not None else {"num_nodes": 1})
        section.update({key: value for key, value in overrides.items() if value is not None})
        self.config = config = parse_cluster_config(section)
        self.section: dict[str, Any] = copy.deepcopy(section)
        self.num_nodes = config.num_nodes
        self._embedded: EmbeddedRay | None = None
        self._connected_here = False
        address = config.address or os.environ.get("RAY_ADDRESS")
        if ray.is_initialized():
            pass  # the caller's Ray: use it, never stop it
        elif config.simulate is not None and not address:
            self._embedded = EmbeddedRay.start_simulated(config)
        elif address:
            if config.simulate is not None:
                _refuse_simulated_only(config)
                print(f"rlinfra: RAY_ADDRESS={address}: using that cluster (cluster.simulate is its shape)")
            ray.init(address=address, logging_level=logging.WARNING)
            self._connected_here = True
        else:
            self._embedded = EmbeddedRay.start_local()
        try:
            self.nodes: list[RayNode] = self._wait_for_nodes(config.node_timeout)
            self.spec = ClusterSpec.build(
                [NodeSpec(node.rank, node.accelerator[1], node.accelerator[0]) for node in self.nodes], config
            )
            self.spec.check_accelerators_per_node(config.num_gpus_per_node)
            if config.simulate is not None and self._embedded is None:
                check_simulated_shape(self.nodes, config.simulate)
        except BaseException:
            self.shutdown()
            raise

    def _wait_for_nodes(self, timeout: float) -> list[RayNode]:
        """Poll Ray's node table until ``num_nodes`` nodes are alive; a progress line meanwhile."""
        deadline, waited = Deadline.after(timeout), False
        while len(seen := rank_nodes(ray.nodes())) < self.num_nodes:
            if deadline.expired:
                raise ClusterError(
                    f"only {len(seen)} of {self.num_nodes} Ray nodes joined within {timeout:.0f} s (cluster."
                    "num_nodes); check that every node ran `ray start` against this head, or lower num_nodes"
                )
            print(f"\rwaiting for Ray nodes: {len(seen)}/{self.num_nodes}", end="", file=sys.stderr)
            waited = True
            time.sleep(min(0.5, deadline.left()))
        if waited:  # end the progress line
            print(f"\r{len(seen)}/{self.num_nodes} Ray nodes alive.        ", file=sys.stderr)
        if len(seen) > self.num_nodes:
            print(
                f"rlinfra: using the first {self.num_nodes} of {len(seen)} Ray nodes by rank", file=sys.stderr
            )
        return seen[: self.num_nodes]

    @property
    def embedded(self) -> EmbeddedRay | None:
        """The Ray this object started, if any (None when attached to an existing cluster)."""
        return self._embedded

    def node(self, rank: int) -> RayNode:
        return self.nodes[rank]

    def kill_node(self, rank: int) -> None:
        """Rehearse a crash: kill simulated node ``rank`` and everything on it at once. Only a
        cluster that started its own simulated Ray has nodes to kill."""
        self._embedded_or_refuse("kill").kill_node(rank)

    def restart_node(self, rank: int) -> None:
        """Bring a killed simulated node back under its rank (a new node id; the same devices,
        CPUs, resources and labels) and wait until Ray reports it alive; ``nodes`` then lists it."""
        self._embedded_or_refuse("restart").restart_node(rank)
        self.nodes = self._wait_for_nodes(self.config.node_timeout)

    def _embedded_or_refuse(self, action: str) -> EmbeddedRay:
        if self._embedded is None or self._embedded.simulated is None:
            raise ClusterError(
                f"cannot {action} node: this Cluster is attached to a Ray it did not start, or started one "
                "local node; only one it simulated (cluster.simulate) has nodes to kill"
            )
        return self._embedded

    def dead_node_ranks(self) -> set[int]:
        """Ranks of this cluster's nodes that Ray no longer reports alive."""
        alive = {node["NodeID"] for node in ray.nodes() if node.get("Alive")}
        return {node.rank for node in self.nodes if node.node_id not in alive}

    @property
    def logs_dir(self) -> str:
        """Where Ray writes this session's logs on the head node, each worker's output among them
        (``worker-*-<pid>.out`` and ``.err``)."""
        return session_logs_dir()

    def require(self, **expected: float) -> None:
        """Raise ``ClusterError`` unless Ray's ledger matches ``expected`` (e.g. ``GPU=16``).

        A mismatch here is what later shows up as wrong rank maps or stuck placement groups, so
        check it before launching anything.
        """
        diff = resource_diff(expected, ray.cluster_resources())
        if diff:
            raise ClusterError("Ray's resources differ from what this job requires:\n" + diff)

    def shutdown(self) -> None:
        """Stop what this object started (an embedded Ray, or its own connection); nothing else."""
        if self._embedded is not None:
            self._embedded.shutdown()
            self._embedded = None
        elif self._connected_here:
            ray.shutdown()
            self._connected_here = False

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"Cluster({'embedded' if self._embedded else 'attached'}: {self.spec.describe()})"

    @property
    def num_accelerators(self) -> int:
        """Accelerators on this cluster's nodes, all types together (RLinf's name)."""
        return self.spec.num_accelerators


def _refuse_simulated_only(config: ClusterConfig) -> None:
    """Settings that only shape a simulated cluster cannot shape one that exists: refused."""
    written = [name for name in SIMULATED_ONLY if getattr(config, name) is not None]
    if written:
        raise ClusterError(
            f"cluster.{written[0]} shapes a simulated cluster, but RAY_ADDRESS names an existing one; "
            "remove it, or unset RAY_ADDRESS to simulate"
        )


def check_simulated_shape(nodes: list[RayNode], simulate: tuple[int, ...]) -> None:
    """An existing cluster standing in for ``cluster.simulate`` must have its accelerators per node."""
    have = tuple(node.accelerator[1] for node in nodes)
    if have != tuple(simulate):
        raise ClusterError(
            f"cluster.simulate is {list(simulate)} accelerators per node, but the cluster at RAY_ADDRESS "
            f"has {list(have)}; give the nodes those accelerators (e.g. --gpus-per-node), or fix simulate"
        )
