"""Starting a private Ray for this driver: one local node, or N simulated nodes.

``ray.init()`` with no address can attach to (or hang on) a stray local cluster, and ``ray stop``
kills everybody's Ray; so the embedded Ray is always started fresh (``address="local"`` or
``ray.cluster_utils.Cluster``) and shut down by the object that started it. Health checks are
tightened so that a lost node is noticed in about 2 s instead of 15 s.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import ray

from rlinfra.placement.config import DEFAULT_SIMULATED_CPUS
from rlinfra.runtime.discovery import NODE_RANK_LABEL

# A dead raylet is declared dead after period x threshold (~1.5 s) instead of Ray's 3 s x 5.
HEALTH_CHECK_CONFIG = {"health_check_period_ms": 500, "health_check_failure_threshold": 3}


class EmbeddedRay:
    """A Ray instance this process started, and knows how to stop."""

    def __init__(self, simulated: Any | None) -> None:
        self._simulated = simulated

    @classmethod
    def start_local(cls, num_cpus: int | None = None, num_gpus: int | None = None) -> EmbeddedRay:
        ray.init(
            address="local",
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            include_dashboard=False,
            _system_config=HEALTH_CHECK_CONFIG,
            **_quiet(),
        )
        return cls(None)

    @classmethod
    def start_simulated(
        cls,
        accelerators_per_node: Sequence[int],
        cpus_per_node: int = DEFAULT_SIMULATED_CPUS,
        resources_per_node: Sequence[dict[str, float]] | None = None,
        labels_per_node: Sequence[dict[str, str]] | None = None,
        object_store_bytes: int | None = None,
    ) -> EmbeddedRay:
        """One real raylet per simulated node, each labelled with its node rank so that ranks
        are stable across restarts (simulated nodes share one IP); ``resources_per_node`` and
        ``labels_per_node`` add custom resources and labels per node; ``object_store_bytes`` sizes
        every node's object store (else Ray's test-cluster default)."""
        from ray.cluster_utils import Cluster as RayTestCluster

        extra = list(resources_per_node or [{} for _ in accelerators_per_node])
        labels = [
            {**{str(k): str(v) for k, v in node.items()}, NODE_RANK_LABEL: str(rank)}
            for rank, node in enumerate(labels_per_node or [{} for _ in accelerators_per_node])
        ]
        store = {"object_store_memory": object_store_bytes} if object_store_bytes else {}
        simulated = RayTestCluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": cpus_per_node,
                "num_gpus": accelerators_per_node[0],
                "resources": extra[0],
                "labels": labels[0],
                "include_dashboard": False,
                "_system_config": HEALTH_CHECK_CONFIG,
                **store,
            },
        )
        try:
            for rank, count in enumerate(accelerators_per_node[1:], start=1):
                simulated.add_node(
                    num_cpus=cpus_per_node,
                    num_gpus=count,
                    resources=extra[rank],
                    labels=labels[rank],
                    **store,  # type: ignore[arg-type]  # Ray types its **node_args too narrowly
                )
            ray.init(address=simulated.address, **_quiet())
        except BaseException:
            simulated.shutdown()
            raise
        return cls(simulated)

    @property
    def simulated_nodes(self) -> list[Any]:
        """The ``ray._private.node.Node`` handles of a simulated cluster, head first (tests kill
        them to rehearse node loss)."""
        if self._simulated is None:
            return []
        return self._simulated.list_all_nodes()

    def kill_node(self, node: Any) -> None:
        """Kill a simulated node's processes without a graceful shutdown (as a crash would)."""
        if self._simulated is None:
            raise RuntimeError("this Ray is not a simulated cluster: it has no nodes to kill")
        self._simulated.remove_node(node, allow_graceful=False)

    def shutdown(self) -> None:
        ray.shutdown()
        if self._simulated is not None:
            self._simulated.shutdown()
            self._simulated = None


def _quiet() -> dict[str, Any]:
    """Keep Ray's start-up banner out of the user's terminal unless they ask for it."""
    if os.environ.get("RLINFRA_RAY_VERBOSE"):
        return {}
    return {"logging_level": "warning", "log_to_driver": True}
