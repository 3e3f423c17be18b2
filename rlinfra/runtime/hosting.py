"""Hosting: how a user's ``Worker`` class runs inside a Ray actor.

``hosted_class(Rollout)`` is a subclass whose constructor first binds the process to its
``WorkerContext`` — rank attributes, environment (``RANK``, ``LOCAL_RANK``, visibility …, composed
by ``rlinfra.runtime.env``), secrets — and only then runs the user's ``__init__``, so
``self._rank`` and ``self.secret(...)`` work there even if the user forgets ``super().__init__()``.
``HostMethods`` are what the driver calls on every hosted worker (readiness, progress probes, and
``rlinfra_run`` for the worker-side functions of ``rlinfra.runtime.process_groups``: the rendezvous
port, process groups), through ``WorkerGroup.call``. Kept apart from ``rlinfra.runtime.worker``: the
group imports this module, and the ``Worker`` class users subclass imports the group.
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import ray

from rlinfra.placement.env_vars import PATH_SEPARATOR, merge_paths
from rlinfra.placement.record import VISIBILITY_ENV, Placement
from rlinfra.runtime import process_groups, progress
from rlinfra.runtime.progress import WATCH_GROUP
from rlinfra.runtime.secrets import receive_secrets

SECRETS_TIMEOUT_S = 60.0
EXIT_NOTE = "rlinfra: os._exit with code "  # read back by rlinfra.runtime.calls.death_cause
T = TypeVar("T")

if TYPE_CHECKING:  # annotations only: a worker never loads the config parser
    from rlinfra.placement.node_groups import HardwareUnit


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
    merge_env: tuple[str, ...] = ()
    secrets: Any = None
    hardware: tuple[HardwareUnit, ...] = ()
    incarnation: int = 0  # how many times the rank was replaced before this process


def _set_env(context: WorkerContext) -> None:
    """Set in-process, as Ray itself does for CUDA_VISIBLE_DEVICES: per-actor runtime_envs would
    cost a fresh worker process each and record every value in Ray's metadata."""
    if not context.placement.is_isolated:  # it sees every device: no visibility variable holds
        for name in VISIBILITY_ENV.values():
            os.environ.pop(name, None)
    for name, value in context.env.items():
        os.environ[name] = merge_paths(value, os.environ.get(name)) if name in context.merge_env else value
    if "PYTHONPATH" in context.env:
        # The interpreter read PYTHONPATH at start-up; new entries reach imports only via sys.path.
        entries = context.env["PYTHONPATH"].split(PATH_SEPARATOR)
        sys.path[1:1] = [entry for entry in entries if entry and entry not in sys.path]


def bind_identity(
    worker: Any, group_name: str, placement: Placement, hardware: tuple[HardwareUnit, ...], incarnation: int
) -> None:
    """The attributes ``Worker`` documents (RLinf's names) of the process at ``placement``: a
    hosted worker's, or a fused role's (its host's, under the role's own ``group_name``, e.g.
    ``policy/actor``, so that its logs and errors name the role)."""
    worker._group_name, worker._placement, worker._hardware = group_name, placement, hardware
    worker._rank, worker._world_size = placement.rank, placement.world_size
    worker._local_rank, worker._local_world_size = placement.local_rank, placement.local_world_size
    worker._node_rank = worker._cluster_node_rank = placement.cluster_node_rank
    worker._local_accelerator_rank = placement.local_accelerator_rank
    worker._worker_name = f"{group_name}:{placement.rank}"
    worker._incarnation = incarnation


class HostMethods:
    """Methods rlinfra calls on every hosted worker (``WorkerGroup.call(HostMethods.…)``); the
    ``rlinfra_`` prefix keeps them clear of user methods."""

    def _rlinfra_bind_context(self, context: WorkerContext) -> None:
        """The attributes ``Worker`` documents (RLinf's names), the environment and the secrets."""
        bind_identity(self, context.group_name, context.placement, context.hardware, context.incarnation)
        _set_env(context)
        process_groups.listen_on(ray.util.get_node_ip_address())
        _note_exit_codes()
        if context.secrets is not None:
            receive_secrets(context.secrets, SECRETS_TIMEOUT_S)

    def rlinfra_ready(self) -> dict[str, Any]:
        context = ray.get_runtime_context()
        return {
            "node_id": context.get_node_id(),
            "pid": os.getpid(),
            "ray_accelerator_ids": {k: list(v) for k, v in context.get_accelerator_ids().items() if v},
        }

    @ray.method(concurrency_group=WATCH_GROUP)
    def rlinfra_heartbeat_age(self) -> float | None:
        """Seconds since this process last beat (answered in the watch thread, so a busy
        worker answers too)."""
        return progress.seconds_since_heartbeat()

    @ray.method(concurrency_group=WATCH_GROUP)
    def rlinfra_thread_stacks(self) -> str:
        return progress.thread_stacks()

    def rlinfra_run(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` in this worker's process: how the driver reaches rlinfra's
        worker-side functions (``rlinfra.runtime.process_groups``) through ``WorkerGroup.call``,
        e.g. ``group.call(HostMethods.rlinfra_run, args=(init_process_group, backend, timeout_s))``;
        one door instead of a forwarding method per function. ``function`` travels by reference
        (a module-level function), so it must be importable in the worker."""
        return function(*args)


def _note_exit_codes() -> None:
    """Make ``os._exit(n)`` say ``n`` in the worker's stderr log first: Ray's raylets ignore
    SIGCHLD, so nobody else learns a worker's exit code. (A fatal signal is reported there by
    Ray's own handler: ``*** SIGSEGV received``; SIGKILL leaves no word at all.)"""
    real_exit = os._exit

    def noted_exit(status: int) -> NoReturn:
        os.write(2, f"{EXIT_NOTE}{status}\n".encode())
        real_exit(status)

    os._exit = noted_exit


def memory_peak() -> dict[str, int]:
    """This process's peak memory in bytes: ``rss``, the OS's high-water mark of its resident
    memory, and ``device``, torch's peak on the CUDA device where the process used one."""
    peak = {"rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}  # Linux: KiB
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        peak["device"] = int(torch.cuda.max_memory_allocated())
    return peak


def hosted_class(worker_cls: type) -> type:
    """A subclass of ``worker_cls`` whose constructor binds the ``WorkerContext`` first."""

    def __init__(self: Any, context: WorkerContext, *args: Any, **kwargs: Any) -> None:
        self._rlinfra_bind_context(context)
        worker_cls.__init__(self, *args, **kwargs)  # type: ignore[misc]  # the user's own constructor

    namespace = {"__init__": __init__, "__module__": worker_cls.__module__}
    hosted = type(worker_cls.__name__, (HostMethods, worker_cls), namespace)
    hosted.__qualname__ = worker_cls.__qualname__
    return hosted
