"""``Worker``: the base class of every component process, as in the seed's example program.

A user writes ``class Rollout(Worker)`` with ordinary methods. rlinfra hosts it in a Ray actor
whose constructor first binds the process to its ``Placement`` — rank attributes, environment
(``RANK``, ``LOCAL_RANK``, visibility …, composed by ``rlinfra.runtime.env``), secrets — and
only then runs the user's ``__init__``, so ``self._rank`` and ``self.secret(...)`` work there
even if the user forgets ``super().__init__()``.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

import ray

from rlinfra.placement.env_vars import PATH_SEPARATOR, merge_paths
from rlinfra.placement.node_groups import HardwareUnit
from rlinfra.placement.record import Placement
from rlinfra.runtime import rendezvous
from rlinfra.runtime.address import WorkerAddress

if TYPE_CHECKING:
    from rlinfra.runtime.group import WorkerGroup


@dataclass(frozen=True)
class WorkerContext:
    """Everything a worker process must know about itself before user code runs.

    ``merge_env`` names path-like variables whose value is prepended to the process's inherited
    one; ``secrets`` is a ``rlinfra.runtime.secrets.SecretsChannel`` (a reference, not values);
    ``hardware`` the custom hardware units the process drives.
    """

    group_name: str
    placement: Placement
    env: dict[str, str] = field(default_factory=dict)
    unset_env: tuple[str, ...] = ()
    merge_env: tuple[str, ...] = ()
    secrets: Any = None
    hardware: tuple[HardwareUnit, ...] = ()


SECRETS_TIMEOUT_S = 60.0
# Ray's accelerator resource names -> torch's device type (``torch.device(type)``, ``torch.<type>``).
TORCH_DEVICE_TYPES = {"GPU": "cuda", "NPU": "npu", "XPU": "xpu", "HPU": "hpu"}
# The secrets of this worker process, kept off the instance so that they are not in its
# ``__dict__`` (pickled, printed by debuggers) and reach fused roles too; one worker per process.
_secrets: dict[str, str] = {}


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

    def __init__(self) -> None:
        """Nothing to do: the hosting actor bound the context already. Kept so that the seed's
        ``super().__init__()`` works unchanged."""

    @classmethod
    def create_group(cls, *args: Any, **kwargs: Any) -> WorkerGroup:
        """A group of ``cls`` workers, each constructed with ``*args, **kwargs`` once launched."""
        from rlinfra.runtime.group import WorkerGroup

        return WorkerGroup(cls, args, kwargs)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

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
        try:
            return _secrets[name]
        except KeyError:
            known = ", ".join(sorted(_secrets)) or "none (cluster.secrets is empty)"
            raise KeyError(f"no secret {name!r} in this worker; secrets: {known}") from None

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
            handler.setFormatter(
                logging.Formatter(f"[{self._group_name}:{self._rank}] %(levelname)s %(message)s")
            )
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
            logger.propagate = False
        return logger

    def __repr__(self) -> str:
        # Ray prefixes forwarded log lines with the actor's repr: show the role, not a class.
        return f"{self._group_name}:{self._rank}" if self._group_name else type(self).__name__


def _bind_context(worker: Worker, context: WorkerContext) -> None:
    placement = context.placement
    worker._group_name = context.group_name
    worker._placement = placement
    worker._rank = placement.rank
    worker._world_size = placement.world_size
    worker._local_rank = placement.local_rank
    worker._local_world_size = placement.local_world_size
    worker._node_rank = worker._cluster_node_rank = placement.cluster_node_rank
    worker._local_accelerator_rank = placement.local_accelerator_rank
    worker._worker_name = f"{context.group_name}:{placement.rank}"
    worker._hardware = context.hardware
    # Set in-process, as Ray itself does for CUDA_VISIBLE_DEVICES: per-actor runtime_envs would
    # cost a fresh worker process each and record every value in Ray's metadata.
    for name in context.unset_env:
        os.environ.pop(name, None)
    for name, value in context.env.items():
        os.environ[name] = merge_paths(value, os.environ.get(name)) if name in context.merge_env else value
    if "PYTHONPATH" in context.env:
        # The interpreter read PYTHONPATH at start-up; new entries reach imports only via sys.path.
        new = [entry for entry in context.env["PYTHONPATH"].split(PATH_SEPARATOR) if entry not in sys.path]
        sys.path[1:1] = [entry for entry in new if entry]
    if context.secrets is not None:
        _secrets.clear()
        _secrets.update(ray.get(context.secrets.ref, timeout=SECRETS_TIMEOUT_S))
        for name in context.secrets.expose_as_env:
            os.environ[name] = _secrets[name]


class _HostMixin:
    """Methods rlinfra calls on every hosted worker; their names cannot clash with user methods."""

    _rlinfra_master_port: int | None = None

    def _rlinfra_ready(self) -> dict[str, Any]:
        context = ray.get_runtime_context()
        return {
            "node_id": context.get_node_id(),
            "pid": os.getpid(),
            "ip": ray.util.get_node_ip_address(),
            "ray_accelerator_ids": {k: list(v) for k, v in context.get_accelerator_ids().items() if v},
        }

    def _rlinfra_reserve_port(self) -> tuple[str, int]:
        """Bind a free port on this node and hold it (no probe-then-bind race) until the process
        group's store takes the very socket over."""
        if not rendezvous.holds_port(self._rlinfra_master_port):
            self._rlinfra_master_port = rendezvous.hold_port()
        return ray.util.get_node_ip_address(), self._rlinfra_master_port

    def _rlinfra_init_distributed(self, backend: str | None, timeout_s: float) -> str:
        return rendezvous.init_process_group(backend, timeout_s)

    def _rlinfra_destroy_distributed(self) -> None:
        rendezvous.destroy_process_group()

    def _rlinfra_reserve_cross_port(self, name: str) -> tuple[str, int]:
        return ray.util.get_node_ip_address(), rendezvous.reserve_cross_port(name)

    def _rlinfra_join_cross_group(
        self,
        name: str,
        address: str,
        port: int,
        rank: int,
        world_size: int,
        backend: str | None,
        timeout_s: float,
    ) -> str:
        joined = rendezvous.join_cross_group(name, address, port, rank, world_size, backend, timeout_s)
        return joined.backend

    def _rlinfra_leave_cross_group(self, name: str) -> None:
        rendezvous.leave_cross_group(name)

    def _rlinfra_set_env(self, env: dict[str, str]) -> None:
        os.environ.update(env)


def hosted_class(worker_cls: type) -> type:
    """A subclass of ``worker_cls`` whose constructor binds the ``WorkerContext`` first."""

    def __init__(self: Any, context: WorkerContext, *args: Any, **kwargs: Any) -> None:
        _bind_context(self, context)
        worker_cls.__init__(self, *args, **kwargs)

    namespace = {"__init__": __init__, "__module__": worker_cls.__module__}
    hosted = type(worker_cls.__name__, (_HostMixin, worker_cls), namespace)
    hosted.__qualname__ = worker_cls.__qualname__
    return hosted
