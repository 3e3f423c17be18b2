"""Time-sharing of shared devices with real Ray: one simulated node with 4 logical GPUs.

``actor`` and ``rollout`` share GPUs 0-1 (two ranks each) and take turns; ``reward`` owns GPU 2
and is never touched; GPU 3 holds the components the refusal and failure tests launch for
themselves (a schedule sees only the groups it is given). The toy workers allocate real memory in
``wake`` and free it in ``sleep``, and note each hook's start and end (with the machine's
monotonic clock, the same in every process) in a file of their own, so that the order is checked
by the workers' clocks, not only the driver's.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import ray

from rlinfra import Worker, fuse
from rlinfra.runtime.layout import Layout
from rlinfra.runtime.served_asleep import served_asleep
from rlinfra.runtime.timesharing import (
    ComponentAsleepError,
    SwitchError,
    TimeShared,
    TimeSharing,
    TimeSharingError,
)

MIB = 2**20
ACTOR_MIB, ROLLOUT_MIB = 200, 150  # per rank; the pair's sum (350) is 1.75x the larger
CFG = {
    "cluster": {
        "num_nodes": 1,
        "simulate": "1x4",
        "component_placement": {
            "actor,rollout": "0-1",
            "reward": "2",
            "flaky,partner,probe,bare,half,fused,mate,again,peer": "3",
        },
    }
}
pytestmark = [pytest.mark.timeout(120), pytest.mark.cluster(CFG)]
COMPONENTS = [
    *("actor", "rollout", "reward", "flaky", "partner", "probe", "bare", "half", "fused", "mate"),
    *("again", "peer"),
]


class Toy(TimeShared):
    """Holds ``mib`` MiB while awake (its constructor allocates them too, like an engine loading
    its weights); ``set_mode`` makes the next sleeps raise or hang."""

    def __init__(self, mib: int, log_dir: str) -> None:
        self.mib = mib
        self.log = Path(log_dir) / f"{self._group_name}-{self._rank}.log"
        self.mode = "ok"
        self.held = self._allocate()

    def _allocate(self) -> list[np.ndarray]:
        return [np.ones(8 * MIB, dtype=np.uint8) for _ in range(self.mib // 8)]  # pages touched

    def _note(self, event: str) -> None:
        with self.log.open("a") as log:
            log.write(f"{event} {time.monotonic()!r}\n")

    def sleep(self) -> None:
        self._note("sleep-start")
        if self.mode == "raise":
            raise RuntimeError("cannot release the KV cache")
        if self.mode == "hang":
            threading.Event().wait()
        self.held = []
        self._note("sleep-end")

    def wake(self) -> None:
        self._note("wake-start")
        self.held = self._allocate()
        self._note("wake-end")

    def generate(self) -> int:
        return sum(block.nbytes for block in self.held)

    def set_mode(self, mode: str) -> None:
        self.mode = mode


class Learner(Worker):
    def step(self) -> str:
        return "stepped"


class FusedToy(TimeShared, fuse(learner=Learner)):  # type: ignore[misc]
    """A fused worker (one role) that time-shares; ``weights_stage`` works on host memory, so it
    is declared served while asleep (``weights_unmarked`` is not, whatever its name says)."""

    def sleep(self) -> None:
        pass

    def wake(self) -> None:
        pass

    @served_asleep
    def weights_stage(self) -> str:
        return "staged"

    def weights_unmarked(self) -> str:
        return "ran"


class Bare(Worker):
    def generate(self) -> int:
        return 0


class Half(TimeShared):
    def sleep(self) -> None:
        pass


@pytest.fixture(scope="module")
def layout(cluster, placement):
    with Layout(cluster, placement, COMPONENTS, num_cpus=0.5) as held:
        yield held


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("timesharing")


@pytest.fixture(scope="module")
def launch(cluster, placement, layout, log_dir):
    groups = []

    def start(cls, name: str, *args):
        strategy = placement.get_strategy(name)
        group = cls.create_group(*args).launch(cluster, strategy, name=name, layout=layout, num_cpus=0.5)
        groups.append(group)
        return group

    yield start
    for group in groups:
        group.shutdown()


@pytest.fixture(scope="module")
def job(launch, log_dir):
    """The colocated pair and the third component under one schedule (all asleep at first), and
    each rank's resident set size asleep: the baseline of its footprint."""
    groups = {
        "actor": launch(Toy, "actor", ACTOR_MIB, str(log_dir)),
        "rollout": launch(Toy, "rollout", ROLLOUT_MIB, str(log_dir)),
        "reward": launch(Toy, "reward", 8, str(log_dir)),
    }
    with TimeSharing(groups.values(), timeout=60) as schedule:
        asleep = {name: schedule.resident_bytes(name) for name in ("actor", "rollout")}
        yield schedule, groups, asleep


def notes(log_dir: Path, component: str, rank: int, event: str) -> list[float]:
    lines = (log_dir / f"{component}-{rank}.log").read_text().splitlines()
    return [float(line.split()[1]) for line in lines if line.split()[0] == event]


def test_a_call_into_a_sleeping_component_is_refused(job):
    schedule, groups, _ = job
    schedule.wake("actor")
    rollout = groups["rollout"]
    with pytest.raises(ComponentAsleepError) as refused:
        rollout.generate()
    message = str(refused.value)
    assert "component 'rollout' is asleep on rank(s) 0, 1 (node 0)" in message
    assert "call rollout.generate refused; 'actor' is awake on its devices" in message
    assert "schedule.wake('rollout')" in message
    assert refused.value.ranks == (0, 1) and refused.value.awake == ("actor",)
    with pytest.raises(ComponentAsleepError, match=r"rank\(s\) 1 \(node 0\)"):
        rollout.execute_on(1).generate()
    with pytest.raises(ComponentAsleepError, match=r"rollout\.generate"):
        rollout.call(Toy.generate)

    # Bypassing the group (the actor handle itself): the worker refuses too.
    with pytest.raises(ComponentAsleepError) as inside:
        ray.get(rollout.actors[0].generate.remote(), timeout=30)
    assert "component 'rollout' is asleep on rank(s) 0 (node 0): call rollout.generate refused" in str(
        inside.value
    )
    assert "'actor' is awake on its devices" in str(inside.value)

    # Only the schedule calls the hooks; the awake and the unshared components answer.
    with pytest.raises(TimeSharingError, match=r"use schedule.wake\('actor'\)"):
        groups["actor"].sleep()
    assert groups["actor"].generate().wait(timeout=30) == [ACTOR_MIB * MIB] * 2
    assert groups["reward"].generate().wait(timeout=30) == [8 * MIB]


def test_waking_one_puts_its_sharers_to_sleep_first_and_leaves_the_rest_alone(job, log_dir):
    schedule, _, _ = job
    assert schedule.sharers == {
        "actor": frozenset({"rollout"}),
        "rollout": frozenset({"actor"}),
        "reward": frozenset(),
    }
    schedule.wake("actor")
    mark = len(schedule.phases)
    switch = schedule.wake("rollout")
    assert [(phase.component, phase.action) for phase in schedule.phases[mark:]] == [
        ("actor", "sleep"),
        ("rollout", "wake"),
    ]
    assert switch is not None and (switch.slept, switch.woken) == (("actor",), "rollout")
    assert schedule.wake("rollout") is None  # awake already: nothing done, nothing recorded
    assert len(schedule.phases) == mark + 2
    assert (schedule.state("actor"), schedule.state("rollout"), schedule.awake) == (
        "asleep",
        "awake",
        ["rollout"],
    )

    # By the workers' own clocks: every actor rank was done sleeping before any rollout rank woke.
    slept = [notes(log_dir, "actor", rank, "sleep-end")[-1] for rank in (0, 1)]
    woke = [notes(log_dir, "rollout", rank, "wake-start")[-1] for rank in (0, 1)]
    assert max(slept) <= min(woke)

    # The third component shares nothing: never put to sleep, never woken, always awake.
    assert not list(log_dir.glob("reward-*"))
    assert schedule.state("reward") == "awake"
    with pytest.raises(TimeSharingError, match="'reward' shares no device"):
        schedule.wake("reward")


def test_switch_times_are_recorded(job):
    schedule, _, _ = job
    schedule.wake("actor")
    before = len(schedule.switches)
    for name in ("rollout", "actor", "rollout"):
        schedule.wake(name)
    switches = schedule.switches[before:]
    assert [(s.slept, s.woken) for s in switches] == [
        (("actor",), "rollout"),
        (("rollout",), "actor"),
        (("actor",), "rollout"),
    ]
    for switch in switches:
        assert switch.sleep_s > 0 and switch.wake_s > 0
        assert switch.total_s >= switch.sleep_s + switch.wake_s
    summary = schedule.summary()
    assert summary["switches"] == len(schedule.switches) >= 3
    assert 0 < summary["total_p50_s"] <= summary["total_p99_s"] <= summary["total_max_s"]
    assert summary["sleep_p50_s"] > 0 and summary["wake_p50_s"] > 0


def test_the_pair_holds_about_the_larger_footprint_not_the_sum(job):
    schedule, _, asleep = job

    def footprint(name: str) -> int:
        return sum(now - base for now, base in zip(schedule.resident_bytes(name), asleep[name], strict=True))

    turns = []
    for name in ("actor", "rollout", "actor", "rollout"):
        schedule.wake(name)
        turns.append({"actor": footprint("actor"), "rollout": footprint("rollout")})
    actor_awake = max(turn["actor"] for turn in turns)
    rollout_awake = max(turn["rollout"] for turn in turns)
    assert actor_awake > 0.8 * 2 * ACTOR_MIB * MIB  # the memory is really there while awake …
    assert rollout_awake > 0.8 * 2 * ROLLOUT_MIB * MIB
    assert turns[-1]["actor"] < 0.2 * actor_awake  # … and really gone while asleep
    assert turns[-2]["rollout"] < 0.2 * rollout_awake
    larger = max(actor_awake, rollout_awake)
    peak = max(turn["actor"] + turn["rollout"] for turn in turns)
    assert peak < 1.5 * larger  # the sum would be 1.75x


def test_a_component_without_hooks_is_refused_at_construction(launch, log_dir):
    probe = launch(Toy, "probe", 8, str(log_dir))
    bare, half = launch(Bare, "bare"), launch(Half, "half")
    with pytest.raises(TimeSharingError) as refused:
        TimeSharing([probe, bare, half])
    message = str(refused.value)
    assert "component 'bare' (Bare) is not a TimeShared worker" in message
    assert "component 'bare' (Bare) is missing hook(s) sleep(), wake()" in message
    assert "component 'half' (Half) is missing hook(s) wake()" in message
    # Refused before any worker was touched, and no guard left behind.
    assert not list(log_dir.glob("probe-*"))
    assert probe.call_guard is None and probe.generate().wait(timeout=30) == [8 * MIB]
    # A component that shares no device with another of the schedule needs no hooks.
    with TimeSharing([bare]) as alone:
        assert alone.time_shared == [] and alone.state("bare") == "awake"


def test_a_failing_or_hanging_sleep_names_component_and_rank_and_never_hangs(launch, log_dir):
    flaky, partner = launch(Toy, "flaky", 8, str(log_dir)), launch(Toy, "partner", 8, str(log_dir))
    with TimeSharing([flaky, partner], awake="flaky", timeout=30) as schedule:
        flaky.set_mode("raise").wait(timeout=30)
        with pytest.raises(SwitchError) as raised:
            schedule.wake("partner")
        message = str(raised.value)
        assert "worker group 'flaky': time-sharing sleep (for 'partner') failed on rank(s) 0" in message
        assert "rank 0 (node 0): RuntimeError: cannot release the KV cache" in message
        assert "'partner' was not woken" in message
        assert raised.value.phase == "sleep" and raised.value.failed_ranks == [0]
        assert (schedule.state("flaky"), schedule.state("partner")) == ("unknown", "asleep")
        with pytest.raises(ComponentAsleepError, match=r"unknown state"):
            flaky.generate()

        schedule.wake("flaky")  # its wake() runs again: usable again
        flaky.set_mode("hang").wait(timeout=30)
        started = time.monotonic()
        with pytest.raises(SwitchError) as hung:
            schedule.wake("partner", timeout=1.0)
        assert time.monotonic() - started < 10
        message = str(hung.value)
        assert "worker group 'flaky': time-sharing sleep (for 'partner') failed on rank(s) 0" in message
        assert "rank 0 (node 0): no answer within" in message and "(still running)" in message
        assert "the switch's deadline: 1 s" in message
        assert schedule.state("flaky") == "unknown"


def test_a_sleeping_fused_worker_refuses_its_roles_but_serves_weight_updates(launch, log_dir):
    fused = launch(FusedToy, "fused")
    mate = launch(Toy, "mate", 8, str(log_dir))
    with TimeSharing([fused, mate], awake="mate", timeout=60) as schedule:
        with pytest.raises(ComponentAsleepError, match=r"component 'fused' is asleep .* 'mate' is awake"):
            fused.role("learner").step().wait(timeout=30)
        assert fused.weights_stage().wait(timeout=30) == ["staged"]  # staging works on host memory
        with pytest.raises(ComponentAsleepError, match=r"call fused\.weights_unmarked refused"):
            fused.weights_unmarked().wait(timeout=30)
        schedule.wake("fused")
        assert fused.role("learner").step().wait(timeout=30) == ["stepped"]


def test_a_group_launched_again_rejoins_the_schedule_asleep_and_guarded(launch, log_dir):
    """A trainer restarted whole (after a lost rank) is a new group in the same bundles; it takes
    the old one's turns without ever being awake beside the component that holds the devices."""
    again, peer = launch(Toy, "again", 8, str(log_dir)), launch(Toy, "peer", 8, str(log_dir))
    with TimeSharing([again, peer], awake="again", timeout=60) as schedule:
        again.shutdown()
        back = launch(Toy, "again", 8, str(log_dir))  # its constructor holds its 8 MiB again
        assert back.call_guard is None
        schedule.rejoin(back)
        assert schedule.groups["again"] is back and back.call_guard is not None
        assert (schedule.state("again"), schedule.state("peer")) == ("asleep", "asleep")
        with pytest.raises(ComponentAsleepError, match=r"component 'again' is asleep"):
            back.generate().wait(timeout=30)
        assert schedule.phases[-1].component == "again" and schedule.phases[-1].action == "sleep"
        schedule.wake("peer")
        schedule.wake("again")  # the new group's turn: peer sleeps first
        assert back.generate().wait(timeout=30) == [8 * MIB]
