"""Time-sharing of shared devices: one component awake per device, switched by the driver.

Colocated components (a trainer and a generation engine on the same GPUs) cannot both hold their
memory at once, so they take turns: each one's worker class derives from ``TimeShared`` and
implements ``sleep()`` and ``wake()``, and one ``TimeSharing`` schedule per job calls them and
guards every call into a sleeping component (``ComponentAsleepError``).

Who shares what is read from the groups' ``Placement`` records, never from names: two components
share a device when a rank of each holds the same node-local device. ``wake(c)`` puts every
component sharing a device with ``c`` to sleep, all ranks at once, then wakes ``c``; components
sharing nothing are never put to sleep. See docs/time-sharing.md.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from rlinfra.runtime.bundles import Device, devices_of
from rlinfra.runtime.calls import GroupCall
from rlinfra.runtime.deadline import Deadline
from rlinfra.runtime.errors import WorkerGroupError
from rlinfra.runtime.group import CallGuard, WorkerGroup
from rlinfra.runtime.timeshared import (
    ASLEEP,
    AWAKE,
    NOTE_AWAKE,
    READ_RESIDENT,
    SLEEP,
    UNKNOWN,
    WAKE,
    ComponentAsleepError,
    TimeShared,
    TimeSharingError,
    refused_while_asleep,
)

DEFAULT_SWITCH_TIMEOUT_S = 300.0  # an engine reloading a large model's weights takes minutes
_HOOKS = {SLEEP: TimeShared.sleep, WAKE: TimeShared.wake}  # each hook's placeholder, not implementing it


class SwitchError(WorkerGroupError):
    """A ``sleep()`` or ``wake()`` raised, died or missed the switch's deadline on some ranks.

    ``group`` is the component whose hook failed, ``phase`` the hook, ``target`` the component
    the switch was for (None for an explicit ``sleep``); ``failures`` names each rank and node.
    """

    def __init__(self, cause: WorkerGroupError, phase: str, target: str | None, timeout_s: float) -> None:
        self.phase, self.target, self.timeout_s = phase, target, timeout_s
        super().__init__(cause.group, cause.action, cause.failures, cause.results, cause.pending)

    def _render(self) -> str:
        target = self.target
        if self.phase == WAKE or target is None:
            then = f"schedule.{self.phase}({self.group!r}) calls its {self.phase}() again"
        else:
            then = f"{target!r} was not woken; schedule.wake({target!r}) calls {self.group}'s sleep() again"
        return (
            f"{super()._render()}\n  time-sharing (the switch's deadline: {self.timeout_s:g} s): "
            f"{self.group!r} is now in an unknown state (calls to it are refused); {then}"
        )


@dataclass(frozen=True)
class Phase:
    """One hook call, in ``TimeSharing.phases`` order: the component, ``sleep`` or ``wake``, and
    the longest time a rank's hook took by the worker's own clock."""

    component: str
    action: str
    seconds: float


@dataclass(frozen=True)
class Switch:
    """One ``wake``: the components put to sleep for it (in schedule order, possibly none), the
    component woken, the seconds each stage took as the driver saw it, and when it began (Unix
    time). ``total_s`` includes the driver's own bookkeeping between the stages."""

    slept: tuple[str, ...]
    woken: str
    sleep_s: float
    wake_s: float
    total_s: float
    at: float


class TimeSharing:
    """The turns of a job's colocated components: at most one awake on each shared device."""

    def __init__(
        self,
        groups: Iterable[WorkerGroup],
        *,
        awake: str | None = None,
        timeout: float = DEFAULT_SWITCH_TIMEOUT_S,
    ) -> None:
        """Work out who shares which devices, check every time-sharing component has both hooks,
        guard their calls, put them all to sleep, and wake ``awake`` if given; within ``timeout``
        (also every switch's default deadline). Raises ``TimeSharingError`` before touching any
        worker when a component cannot time-share, ``SwitchError`` when a first ``sleep()`` fails.
        """
        self.groups: dict[str, WorkerGroup] = _by_name(groups)
        self.timeout = timeout
        self.phases: list[Phase] = []
        self.switches: list[Switch] = []
        self._guards: dict[str, CallGuard] = {}
        self._rank_devices = {
            (name, placement.rank): frozenset(devices_of(placement))
            for name, group in self.groups.items()
            for placement in _launched(group).placements
        }
        self._rank_sharers = _sharers(self._rank_devices)
        self.sharers: dict[str, frozenset[str]] = {name: frozenset() for name in self.groups}
        for (name, _), others in self._rank_sharers.items():
            self.sharers[name] = self.sharers[name] | others
        self.time_shared: list[str] = [name for name in self.groups if self.sharers[name]]
        _check_hooks([self.groups[name] for name in self.time_shared])
        self._state: dict[str, str] = dict.fromkeys(self.time_shared, UNKNOWN)
        if awake is not None:
            self._time_shared(awake)
        self._install_guards(self.time_shared)
        try:
            deadline = Deadline.after(timeout)
            self._sleep_all(self.time_shared, None, deadline)
            if awake is not None:
                self.wake(awake, timeout=deadline.left())
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------------------------------- the turns
    def wake(self, component: str, *, timeout: float | None = None) -> Switch | None:
        """Give ``component`` its turn: put every component sharing a device with it to sleep (all
        their ranks, at once), then wake its ranks; returns the timed ``Switch``, or None (and
        records nothing) when it is awake already. ``timeout`` (default: the schedule's) bounds
        the whole switch; a failed hook raises ``SwitchError``."""
        self._time_shared(component)
        if self._state[component] == AWAKE:
            return None
        at, started = time.time(), time.monotonic()
        deadline = Deadline.after(self.timeout if timeout is None else timeout)
        sharers = self.sharers[component]
        slept = [name for name in self.time_shared if name in sharers and self._state[name] != ASLEEP]
        self._sleep_all(slept, component, deadline)
        sleep_done = time.monotonic()
        self._wake_one(component, deadline, told=slept)
        done = time.monotonic()
        switch = Switch(tuple(slept), component, sleep_done - started, done - sleep_done, done - started, at)
        self.switches.append(switch)
        return switch

    def sleep(self, component: str, *, timeout: float | None = None) -> None:
        """Put ``component`` to sleep without waking another (before a checkpoint, at the end).
        Its ranks' ``sleep()`` runs even if it is asleep already: after ``group.replace(rank)``
        the new process holds what its constructor allocated, and this releases it."""
        self._time_shared(component)
        self._sleep_all([component], None, Deadline.after(self.timeout if timeout is None else timeout))

    def rejoin(self, group: WorkerGroup, *, timeout: float | None = None) -> None:
        """``group`` takes the place of the component of its name: the same component launched
        again as a new group (a trainer restarted whole after a lost rank), into the same devices.
        Its calls are guarded from now on and its ranks put to sleep (releasing what their
        constructors allocated), so the component awake on those devices stays the only one;
        the next ``wake`` gives it its turn. Refused when its devices are not its predecessor's."""
        name = group.name
        self.state(name)  # raises for a name the schedule does not have
        before = {rank: devices for (owner, rank), devices in self._rank_devices.items() if owner == name}
        after = {p.rank: frozenset(devices_of(p)) for p in _launched(group).placements}
        if before != after:
            raise TimeSharingError(
                f"time-sharing: {name!r} came back on other devices; build a new TimeSharing"
            )
        self._remove_guard(name)
        self.groups[name] = group
        if name in self._state:  # else it shares no device: never guarded, never put to sleep
            self._install_guards([name])
            self._state[name] = UNKNOWN
            self.sleep(name, timeout=timeout)

    def state(self, component: str) -> str:
        """``awake``, ``asleep`` or ``unknown`` (its last hook failed); a component that shares no
        device is always ``awake``."""
        if component not in self.groups:
            raise ValueError(f"time-sharing: no component {component!r} (it has {', '.join(self.groups)})")
        return self._state.get(component, AWAKE)

    @property
    def awake(self) -> list[str]:
        """The time-shared components awake now, in schedule order."""
        return [name for name in self.time_shared if self._state[name] == AWAKE]

    def close(self) -> None:
        """Stop guarding the groups' calls (the workers stay as they are: a sleeping worker
        still refuses its methods). Safe to call twice."""
        for name in list(self._guards):
            self._remove_guard(name)

    def __enter__(self) -> TimeSharing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------ figures
    def summary(self) -> dict[str, float]:
        """Over ``switches``: their count, and p50/p99/max of the total, sleep and wake seconds."""
        figures: dict[str, float] = {"switches": float(len(self.switches))}
        for stem in ("total", "sleep", "wake"):
            values = [getattr(switch, f"{stem}_s") for switch in self.switches] or [0.0]
            figures[f"{stem}_p50_s"] = statistics.median(values)
            figures[f"{stem}_p99_s"] = float(np.percentile(values, 99))
            figures[f"{stem}_max_s"] = max(values)
        return figures

    def resident_bytes(self, component: str, timeout: float = 30.0) -> list[int]:
        """Each running rank's resident set size now (bytes, rank order): on the CPU, its device
        memory. Answered also by a busy or sleeping worker."""
        group = self.groups.get(component)
        if group is None or not issubclass(group.worker_cls, TimeShared):
            raise TimeSharingError(f"time-sharing: {component!r} is not a TimeShared component here")
        call = group.call(READ_RESIDENT, action="reading its resident set size")
        return list(call.wait(timeout, stuck_after=None))

    # ---------------------------------------------------------------------------- internals
    def _time_shared(self, component: str) -> None:
        if component not in self._state:
            self.state(component)  # raises for an unknown name
            raise TimeSharingError(
                f"time-sharing: component {component!r} shares no device with another component of "
                f"this schedule ({', '.join(self.groups)}); it is always awake and never put to sleep"
            )
        if not self.groups[component].actors:
            raise TimeSharingError(f"time-sharing: component {component!r} is shut down")

    def _sleep_all(self, components: Sequence[str], target: str | None, deadline: Deadline) -> None:
        """``sleep()`` on every rank of ``components`` at once; each is asleep once all its ranks
        are, and unknown if any failed (the first failure, in schedule order, raises)."""
        calls: list[tuple[str, GroupCall]] = []
        for name in components:
            self._state[name] = UNKNOWN
            action = f"time-sharing sleep ({f'for {target!r}' if target else 'no one woken'})"
            call = self.groups[name].call(TimeShared.rlinfra_timeshare_sleep, args=(target,), action=action)
            calls.append((name, call))
        failure: SwitchError | None = None
        for name, call in calls:
            try:  # after a failure the others are only collected if done: the error is not held back
                due = deadline if failure is None else Deadline(0.0, deadline.limit_s)
                seconds = self._finish(call, SLEEP, target, due)
            except SwitchError as error:
                failure = failure or error
                continue
            self._state[name] = ASLEEP
            self.phases.append(Phase(name, SLEEP, seconds))
        if failure is not None:
            raise failure

    def _wake_one(self, component: str, deadline: Deadline, told: Sequence[str]) -> None:
        """``wake()`` on every rank of ``component``; meanwhile its sharers that were asleep
        already (those not in ``told``) learn who is awake now, for their own refusals."""
        self._state[component] = UNKNOWN
        noting = f"time-sharing: noting that {component!r} is awake"
        notes = [
            self.groups[name].call(NOTE_AWAKE, args=(component,), action=noting)
            for name in sorted(self.sharers[component] - set(told))
            if self._state[name] == ASLEEP
        ]
        call = self.groups[component].call(TimeShared.rlinfra_timeshare_wake, action="time-sharing wake")
        seconds = self._finish(call, WAKE, component, deadline)
        self._state[component] = AWAKE
        self.phases.append(Phase(component, WAKE, seconds))
        for note in notes:
            note.wait(deadline.left())

    @staticmethod
    def _finish(call: GroupCall, phase: str, target: str | None, deadline: Deadline) -> float:
        try:
            return max(call.wait(timeout=deadline.left()), default=0.0)
        except WorkerGroupError as error:
            raise SwitchError(error, phase, target, deadline.limit_s) from error

    def _install_guards(self, components: Sequence[str]) -> None:
        taken = [name for name in components if self.groups[name].call_guard is not None]
        if taken:
            guarded = ", ".join(map(repr, taken))
            raise TimeSharingError(
                f"time-sharing: {guarded} guarded by another TimeSharing; close that first"
            )
        for name in components:
            self.groups[name].call_guard = self._guards[name] = functools.partial(self._guard, name)

    def _remove_guard(self, component: str) -> None:
        """Stop guarding ``component``'s group, unless another guard has replaced this one."""
        guard = self._guards.pop(component, None)
        if self.groups[component].call_guard is guard:
            self.groups[component].call_guard = None

    def _guard(self, component: str, method: str, ranks: Sequence[int]) -> None:
        """The group's ``call_guard``: refuse user calls into a component that is not awake, and
        the hooks themselves (only the schedule calls them)."""
        if not refused_while_asleep(self.groups[component].worker_cls, method):
            return
        if method in (SLEEP, WAKE):
            raise TimeSharingError(
                f"time-sharing: {component}.{method}() is the schedule's to call, so that it knows who is "
                f"awake; use schedule.wake({component!r}) (or schedule.sleep({component!r}))"
            )
        state = self._state[component]
        if state == AWAKE:
            return
        holders = set().union(*(self._rank_sharers[(component, rank)] for rank in ranks))
        awake = [name for name in self.time_shared if name in holders and self._state[name] == AWAKE]
        nodes = [self.groups[component].node_rank_of(rank) for rank in ranks]
        raise ComponentAsleepError(component, ranks, method, awake, nodes, state)


def _by_name(groups: Iterable[WorkerGroup]) -> dict[str, WorkerGroup]:
    """The groups by component name, each given once."""
    named: dict[str, WorkerGroup] = {}
    for group in groups:
        if group.name in named:
            raise ValueError(f"time-sharing: component {group.name!r} is given twice")
        named[group.name] = group
    if not named:
        raise ValueError("time-sharing needs the job's worker groups, e.g. TimeSharing([actor, rollout])")
    return named


def _launched(group: WorkerGroup) -> WorkerGroup:
    if not group.actors:
        raise TimeSharingError(
            f"time-sharing: worker group {group.name!r} is not launched (call .launch first)"
        )
    return group


def _sharers(
    rank_devices: Mapping[tuple[str, int], frozenset[Device]],
) -> dict[tuple[str, int], frozenset[str]]:
    """(component, rank) → the other components with a rank on one of its devices (linear time)."""
    holders: dict[Device, set[str]] = {}
    for (name, _), devices in rank_devices.items():
        for device in devices:
            holders.setdefault(device, set()).add(name)
    return {
        (name, rank): frozenset(other for device in devices for other in holders[device] if other != name)
        for (name, rank), devices in rank_devices.items()
    }


def _check_hooks(groups: Iterable[WorkerGroup]) -> None:
    """Every time-sharing component's class is ``TimeShared`` and implements both hooks."""
    problems = []
    for group in groups:
        cls, component = group.worker_cls, f"component {group.name!r} ({group.worker_cls.__name__})"
        missing = ", ".join(f"{hook}()" for hook, base in _HOOKS.items() if getattr(cls, hook, base) is base)
        if not issubclass(cls, TimeShared):
            problems.append(f"{component} is not a TimeShared worker")
        if missing:
            problems.append(f"{component} is missing hook(s) {missing}")
    if problems:
        raise TimeSharingError(
            f"time-sharing: components that share devices must take turns, but {'; '.join(problems)}. "
            "Derive their worker classes from rlinfra.runtime.timesharing.TimeShared and implement "
            "sleep() (release device memory) and wake() (take it back)"
        )
