"""``Worker``: the base class of every component process, as in the seed's example program.

A user writes ``class Rollout(Worker)`` with ordinary methods. rlinfra hosts it in a Ray actor
(``rlinfra.runtime.hosting``) whose constructor binds the attributes documented here before the
user's ``__init__`` runs.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from rlinfra.placement.record import Placement
from rlinfra.runtime import progress
from rlinfra.runtime.address import WorkerAddress
from rlinfra.runtime.secrets import received_secret

if TYPE_CHECKING:  # annotations only: a worker never loads the config parser
    from rlinfra.placement.node_groups import HardwareUnit
    from rlinfra.runtime.group import WorkerGroup

# Ray's accelerator resource names -> torch's device type (``torch.device(type)``, ``torch.<type>``).
TORCH_DEVICE_TYPES = {"GPU": "cuda", "NPU": "npu", "XPU": "xpu", "HPU": "hpu"}


class Worker:
    """Base class for component workers. Attributes set before ``__init__`` runs, under RLinf's
    names where RLinf has one:

    ``_rank``, ``_world_size``, ``_local_rank``, ``_local_world_size``, ``_node_rank`` (also
    ``_cluster_node_rank``), ``_local_accelerator_rank``, ``_group_name``, ``_worker_name``
    (``group:rank``), ``_placement``; and ``worker_address``, ``accelerator_type`` (the Ray
    resource name, ``"GPU"``, or None), ``torch_device_type`` (``"cuda"`` …, or None),
    ``torch_platform`` (``torch.cuda`` …, or None), ``has_accelerator``, ``hardware_type`` and
    ``hardware_infos`` (the config entries of the hardware units the worker drives).

    ``env_defaults`` is the lowest layer of the worker's environment (every other layer — the
    driver's allow-listed variables, node group, component, rlinfra's — overrides it); it is the
    class-level default that ``@ray.remote(runtime_env=...)`` would be in plain Ray, set in the
    process instead of recorded by Ray.
    """

    env_defaults: ClassVar[Mapping[str, str]] = MappingProxyType({})

    _rank: int = 0
    _world_size: int = 1
    _local_rank: int = 0
    _local_world_size: int = 1
    _node_rank: int = 0
    _cluster_node_rank: int = 0
    _local_accelerator_rank: int = -1
    _group_name: str = ""
    _worker_name: str = ""
    _placement: Placement | None = None
    _hardware: tuple[HardwareUnit, ...] = ()
    _incarnation: int = 0

    def __init__(self) -> None:
        """Nothing to do: the hosting actor bound the context already. Kept so that the seed's
        ``super().__init__()`` works unchanged."""

    @classmethod
    def create_group(cls, *args: Any, **kwargs: Any) -> WorkerGroup:
        """A group of ``cls`` workers, each constructed with ``*args, **kwargs`` once launched."""
        from rlinfra.runtime.group import WorkerGroup  # the driver's side: not imported in workers

        return WorkerGroup(cls, args, kwargs)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def incarnation(self) -> int:
        """0 for the rank's first process, n after its n-th replacement (``WorkerGroup.replace``):
        e.g. a rollout worker that was replaced waits for ``WeightSync.admit`` instead of loading
        initial weights, and an env worker reseeds."""
        return self._incarnation

    @property
    def worker_address(self) -> WorkerAddress:
        """``group:rank`` as RLinf's ``WorkerAddress``."""
        return WorkerAddress(self._group_name, self._rank)

    @property
    def accelerator_type(self) -> str | None:
        """The Ray resource name of this node's accelerators (``"GPU"``), None without any."""
        return self._placement.accelerator_type if self._placement is not None else None

    @property
    def has_accelerator(self) -> bool:
        """Whether the worker's own resources are accelerators."""
        placement = self._placement
        return placement is not None and placement.hardware_type == placement.accelerator_type

    @property
    def torch_device_type(self) -> str | None:
        """torch's name for the node's accelerators (``"cuda"``, ``"npu"`` …), or None."""
        return TORCH_DEVICE_TYPES.get(self.accelerator_type or "")

    @property
    def torch_platform(self) -> Any:
        """torch's module for the node's accelerators (``torch.cuda`` …), or None (imports torch)."""
        device_type = self.torch_device_type
        if device_type is None:
            return None
        import torch

        return getattr(torch, device_type, None)

    @property
    def hardware_type(self) -> str | None:
        """The kind of the worker's resources: an accelerator type, a hardware type, or ``node``."""
        return self._placement.hardware_type if self._placement is not None else None

    @property
    def hardware_infos(self) -> list[Mapping[str, Any]]:
        """The config entries (``node_rank`` included) of the hardware units this worker drives,
        e.g. its robot's IP; empty for accelerators and whole nodes."""
        return [{"type": unit.type, "node_rank": unit.node_rank, **unit.fields} for unit in self._hardware]

    def secret(self, name: str) -> str:
        """The value of secret ``name`` from ``cluster.secrets`` (delivered outside Ray's records)."""
        return received_secret(name)

    def heartbeat(self) -> None:
        """Prove progress from a long method: a rank that neither returns nor beats for its
        call's ``stuck_after`` is reported stuck, with its stack. Cheap; call it every step."""
        progress.heartbeat()

    def log_info(self, message: str) -> None:
        self._logger().info(message)

    def log_warning(self, message: str) -> None:
        self._logger().warning(message)

    def log_error(self, message: str) -> None:
        self._logger().error(message)

    def _logger(self) -> logging.Logger:
        logger = logging.getLogger(f"rlinfra.worker.{self._group_name}.{self._rank}")
        if not logger.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter(f"[{self._worker_name}] %(levelname)s %(message)s"))
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
            logger.propagate = False
        return logger

    def __repr__(self) -> str:
        # Ray prefixes forwarded log lines with the actor's repr: show the role, not a class.
        return self._worker_name or type(self).__name__
