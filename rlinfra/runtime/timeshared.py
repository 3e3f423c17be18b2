"""The worker side of time-sharing (``rlinfra.runtime.timesharing`` is the driver's schedule):
``TimeShared``, the base of a worker class whose ``sleep()``/``wake()`` give its devices up and
take them back; its public methods refuse calls while it sleeps (``ComponentAsleepError``), for
callers that bypass the group's guard; and what makes freed memory show as freed on the CPU.
"""

import ctypes
import functools
import gc
import inspect
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import ray

from rlinfra.runtime.group_views import ROLE_CALL
from rlinfra.runtime.progress import WATCH_GROUP
from rlinfra.runtime.served_asleep import is_served_asleep
from rlinfra.runtime.worker import Worker

SLEEP, WAKE = "sleep", "wake"  # the hooks, and the actions in ``phases``
AWAKE, ASLEEP, UNKNOWN = "awake", "asleep", "unknown"  # UNKNOWN: its last sleep or wake failed
INTERNAL_PREFIX = "rlinfra_"  # rlinfra's own worker methods: never refused (but a fused role's are)
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def refused_while_asleep(cls: type, method: str) -> bool:
    """Whether a sleeping worker of class ``cls`` refuses ``method``: every method but rlinfra's
    own and those marked ``@served_asleep`` (the weight-update ones: a colocated job stages, even
    commits, the next version while the other component has its turn) — and a fused worker's
    role calls are refused like the roles' methods."""
    return method == ROLE_CALL or not (method.startswith(INTERNAL_PREFIX) or is_served_asleep(cls, method))


class TimeSharingError(RuntimeError):
    """The schedule refuses something: a component without hooks, a hook called behind its
    back, a component it does not time-share."""


@dataclass(eq=False, repr=False)
class ComponentAsleepError(TimeSharingError):
    """A call reached a component that is asleep (or in an unknown state) on those ranks."""

    component: str
    ranks: Sequence[int]
    method: str
    awake: Sequence[str]
    node_ranks: Sequence[int | None] = ()
    state: str = ASLEEP

    def __post_init__(self) -> None:
        self.ranks, self.awake, self.node_ranks = tuple(self.ranks), tuple(self.awake), tuple(self.node_ranks)
        super().__init__(self._render())

    def __reduce__(self) -> tuple[Any, ...]:
        # Raised inside a worker too: Ray pickles it, and the default would call __init__(message).
        return type(self), (self.component, self.ranks, self.method, self.awake, self.node_ranks, self.state)

    def _render(self) -> str:
        nodes = sorted({node for node in self.node_ranks if node is not None})
        where = f" (node {', '.join(map(str, nodes))})" if nodes else ""
        state = "asleep" if self.state == ASLEEP else "in an unknown state (its last sleep or wake failed)"
        holders = ", ".join(map(repr, self.awake)) or "no component"
        ranks, verb = ", ".join(map(str, self.ranks)), "are" if len(self.awake) > 1 else "is"
        return (
            f"component {self.component!r} is {state} on rank(s) {ranks}{where}: call {self.component}."
            f"{self.method} refused; {holders} {verb} awake on its devices. Wake it first: "
            f"schedule.wake({self.component!r})"
        )


class TimeShared(Worker):
    """Base class of a worker whose component takes turns on its devices (``TimeSharing``).

    Implement ``sleep()`` (release the device memory: drop or offload weights, caches, optimizer
    state; after it returns rlinfra collects garbage and trims the C heap) and ``wake()`` (take
    them back). Only the schedule calls them. While asleep, the worker's public methods raise
    ``ComponentAsleepError``: every public method of a subclass is wrapped, once, when the class
    is defined (coroutines and generators by wrappers of their own kind).
    """

    # After sleep(), collect reference cycles too: off for a worker whose sleep() frees its tensors
    # by reference count (tensors are freed the moment their last reference goes).
    collect_cycles_on_sleep: ClassVar[bool] = True
    _rlinfra_asleep: bool = False  # a constructed worker is awake until the schedule says otherwise
    _rlinfra_yielded_to: str | None = None  # the component it was put to sleep for

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in dir(cls):
            if name.startswith("_") or name in _EXEMPT or not refused_while_asleep(cls, name):
                continue
            member = inspect.getattr_static(cls, name)
            if inspect.isfunction(member) and not getattr(member, "_rlinfra_guarded", False):
                setattr(cls, name, _refused_while_asleep(member))

    def sleep(self) -> None:
        """Release this worker's device memory (the component's turn is over)."""
        raise NotImplementedError(f"{type(self).__name__} must implement sleep() to time-share")

    def wake(self) -> None:
        """Take back what ``sleep`` released (the component's turn begins)."""
        raise NotImplementedError(f"{type(self).__name__} must implement wake() to time-share")

    def rlinfra_timeshare_sleep(self, yielded_to: str | None) -> float:
        """Run ``sleep()``, then refuse calls and give the freed memory back to the OS; returns
        the seconds it took by the worker's clock."""
        started = time.perf_counter()
        try:
            self.sleep()  # may still call the worker's own methods: refused only once it is done
        finally:
            self._rlinfra_asleep, self._rlinfra_yielded_to = True, yielded_to
        release_freed_memory(self.collect_cycles_on_sleep)
        return time.perf_counter() - started

    def rlinfra_timeshare_wake(self) -> float:
        """Run ``wake()`` (calls are accepted from its start, so it may use the worker's own
        methods); a ``wake()`` that raises leaves the worker refusing calls."""
        started = time.perf_counter()
        self._rlinfra_asleep = False
        try:
            self.wake()
        except BaseException:
            self._rlinfra_asleep, self._rlinfra_yielded_to = True, None
            raise
        return time.perf_counter() - started

    @ray.method(concurrency_group=WATCH_GROUP)
    def rlinfra_timeshare_yielded(self, awake: str) -> None:
        """Note that ``awake`` now holds this sleeping worker's devices (named when it refuses)."""
        self._rlinfra_yielded_to = awake

    @ray.method(concurrency_group=WATCH_GROUP)
    def rlinfra_resident_bytes(self) -> int:
        """This process's resident set size now (answered in the watch thread, also while busy)."""
        return resident_set_bytes()

    def _rlinfra_refuse(self, method: str) -> None:
        awake = [self._rlinfra_yielded_to] if self._rlinfra_yielded_to else []
        raise ComponentAsleepError(self._group_name, [self._rank], method, awake, [self._cluster_node_rank])


# Worker's and TimeShared's own names (hooks, log_info …), and a fused worker's way to its roles.
_EXEMPT = frozenset(dir(TimeShared)) | {"role_instance"}
# Ray's stubs type @ray.method functions as remote methods; to WorkerGroup.call they are methods.
NOTE_AWAKE = cast(Callable[[TimeShared, str], None], TimeShared.rlinfra_timeshare_yielded)
READ_RESIDENT = cast(Callable[[TimeShared], int], TimeShared.rlinfra_resident_bytes)


def _refused_while_asleep(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method``, refusing calls while the worker is asleep: one attribute checked per call. The
    wrapper is of the method's kind (Ray tells async actors and streaming methods by it)."""
    name = method.__name__

    def refuse_if_asleep(self: TimeShared) -> None:
        if self._rlinfra_asleep:
            self._rlinfra_refuse(name)

    async def async_generator(self: TimeShared, *args: Any, **kwargs: Any) -> Any:
        refuse_if_asleep(self)
        async for item in method(self, *args, **kwargs):
            yield item

    async def coroutine(self: TimeShared, *args: Any, **kwargs: Any) -> Any:
        refuse_if_asleep(self)
        return await method(self, *args, **kwargs)

    def generator(self: TimeShared, *args: Any, **kwargs: Any) -> Any:
        refuse_if_asleep(self)
        return (yield from method(self, *args, **kwargs))

    def plain(self: TimeShared, *args: Any, **kwargs: Any) -> Any:
        refuse_if_asleep(self)
        return method(self, *args, **kwargs)

    guarded: Callable[..., Any] = plain
    if inspect.isasyncgenfunction(method):
        guarded = async_generator
    elif inspect.iscoroutinefunction(method):
        guarded = coroutine
    elif inspect.isgeneratorfunction(method):
        guarded = generator
    guarded = functools.wraps(method)(guarded)  # keeps Ray's @ray.method options and the signature
    guarded._rlinfra_guarded = True  # type: ignore[attr-defined]
    return guarded


def resident_set_bytes() -> int:
    """Resident set size of this process (``/proc/self/statm``; Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE_BYTES


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # the C library this process runs on
    except (OSError, AttributeError):  # not glibc: nothing to trim
        return None


def release_freed_memory(collect_cycles: bool = True) -> None:
    """Return freed memory to the OS, so a sleeping worker's resident set shrinks.

    Freed blocks above glibc's mmap threshold (it grows up to 32 MiB) are unmapped at once; smaller
    ones stay in the C heap until ``malloc_trim`` gives back its free pages. ``gc.collect()`` first
    frees objects kept only by reference cycles (``collect_cycles``; in a process that imported
    transformers one collection takes ~0.2 s, more than a small model's whole switch).
    """
    if collect_cycles:
        gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
