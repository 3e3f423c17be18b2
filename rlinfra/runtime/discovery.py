"""Which Ray node is node rank 0, 1, …: a stable, explicit order.

Order: nodes that carry the ``rlinfra-node-rank`` label by that number (the Slurm script and the
simulated cluster set it); then the head node; then by IP compared as numbers (verl sorts IPs as
strings, so ``10.0.0.66`` lands before ``10.0.0.7``); then by node id, because simulated nodes
share one IP. Ray's own order of ``ray.nodes()`` is not stable and is never used.
"""

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rlinfra.placement.record import VISIBILITY_ENV
from rlinfra.runtime.errors import ClusterError

NODE_RANK_LABEL = "rlinfra-node-rank"
HEAD_RESOURCE = "node:__internal_head__"


@dataclass(frozen=True)
class RayNode:
    """A live Ray node as rlinfra uses it."""

    rank: int
    node_id: str
    resources: Mapping[str, float] = field(compare=False)
    labels: Mapping[str, str] = field(compare=False)

    @property
    def accelerator(self) -> tuple[str, int]:
        """``(Ray resource name, count)`` of the node's accelerators; ``("GPU", 0)`` when none."""
        for name in VISIBILITY_ENV:
            count = int(self.resources.get(name, 0))
            if count:
                return name, count
        return "GPU", 0


def rank_nodes(raw_nodes: Iterable[Mapping[str, Any]]) -> list[RayNode]:
    """Alive nodes from ``ray.nodes()`` in rank order, each with its rank."""
    alive = [node for node in raw_nodes if node.get("Alive")]
    found = sorted(label for node in alive if (label := _rank_label(node)) is not None)
    if found != sorted(map(str, range(len(found)))):
        raise ClusterError(
            f"nodes labelled {NODE_RANK_LABEL} must be numbered 0..{len(found) - 1}, each once; found {found}"
        )
    return [
        RayNode(rank, node["NodeID"], dict(node.get("Resources") or {}), dict(node.get("Labels") or {}))
        for rank, node in enumerate(sorted(alive, key=_order))
    ]


def _rank_label(node: Mapping[str, Any]) -> str | None:
    return (node.get("Labels") or {}).get(NODE_RANK_LABEL)


def _order(node: Mapping[str, Any]) -> tuple[Any, ...]:
    """Labelled nodes by their label; then the head; then by IP as a number; then by node id."""
    label = _rank_label(node)
    if label is not None:
        return (0, int(label))
    is_head = HEAD_RESOURCE in (node.get("Resources") or {})
    address = node.get("NodeManagerAddress", "")
    try:
        ip = ipaddress.ip_address(address)
        ip_key: tuple[int, int | str] = (ip.version, int(ip))
    except ValueError:
        ip_key = (99, address)
    return (1, 0 if is_head else 1, ip_key, node["NodeID"])
