"""A worker's death is named by its cause (issue 33): real deaths on a simulated 3-node cluster —
a SIGKILL from outside, ``os._exit(3)``, a segfault through ``ctypes``, a removed node — each
named with the rank's node, its pid, the method it was in and the cause; Ray's own text is kept
on the failure's ``detail``. Ray's memory monitor (OOM) is recognised from the error Ray raises
for it (provoking it here would need a Ray of its own). While a call runs, the worker's process
title names the component, the rank and the method."""

from __future__ import annotations

import ctypes
import os
import signal
import threading
from pathlib import Path

import pytest
from ray.exceptions import OutOfMemoryError

from rlinfra import Worker, WorkerGroupError
from rlinfra.driver.failure_report import failed_ranks
from rlinfra.driver.supervisor import Supervisor
from rlinfra.runtime.calls import DIED, death_cause, rank_failure
from rlinfra.runtime.deadline import Deadline, poll
from rlinfra.runtime.errors import RankFailure

CFG = {"cluster": {"num_nodes": 3, "simulate": "3x2", "component_placement": {"victim": "0-5"}}}
pytestmark = [pytest.mark.timeout(120), pytest.mark.cluster(CFG)]


class Victim(Worker):
    def block(self) -> None:
        threading.Event().wait()

    def exit_3(self) -> None:
        os._exit(3)

    def segfault(self) -> None:
        ctypes.string_at(0)

    def ping(self) -> int:
        return self._rank


@pytest.fixture(scope="module")
def victims(cluster, placement):
    group = Victim.create_group().launch(cluster, placement.get_strategy("victim"), name="victim")
    yield group
    group.shutdown()


def failure_of(call, rank: int) -> RankFailure:
    with pytest.raises(WorkerGroupError) as caught:
        call.wait(timeout=60)
    assert caught.value.failed_ranks == [rank]
    return caught.value.failures[rank]


def title_of(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()


def test_a_sigkill_is_named_and_the_title_names_rank_and_method(victims):
    pid = victims.worker_info[0]["pid"]
    call = victims.execute_on(0).block()
    # Ray titles the process as the call starts: a condition with no event to wait on, polled.
    running = poll(lambda: title_of(pid) == "ray::victim:0.block" or None, Deadline.after(30), TimeoutError)
    assert running
    os.kill(pid, signal.SIGKILL)
    failure = failure_of(call, 0)
    cause = "presumably killed by signal 9 (SIGKILL): no exit code, no crash report"
    assert failure.reason == f"{DIED} (pid {pid}, in block): {cause}"
    assert (failure.node_rank, failure.pid, failure.gone) == (0, pid, True)
    assert "Worker exit type: SYSTEM_ERROR" in failure.detail and "SYSTEM_ERROR" not in str(failure.reason)
    (restart,) = Supervisor([victims]).heal(WorkerGroupError("victim", "block", {0: failure})).restarts
    assert restart.reason == failure.reason  # what the console's "recovered" line says after "replaced after"


def test_an_exit_code_is_named(victims):
    pid = victims.worker_info[1]["pid"]
    failure = failure_of(victims.execute_on(1).exit_3(), 1)
    assert failure.reason == f"{DIED} (pid {pid}, in exit_3): exited with code 3"
    assert failure.node_rank == 0


def test_a_segfault_is_named_with_its_crash_report(victims):
    pid = victims.worker_info[2]["pid"]
    call = victims.execute_on(2).segfault()
    with pytest.raises(WorkerGroupError) as caught:
        call.wait(timeout=60)
    failure = caught.value.failures[2]
    assert failure.reason == f"{DIED} (pid {pid}, in segfault): killed by signal 11 (SIGSEGV)"
    assert failure.node_rank == 1
    assert "Fatal Python error: Segmentation fault" in failure.traceback  # the worker's last words
    shown = str(caught.value)
    assert f"  rank 2 (node 1): {failure.reason}" in shown and "Worker exit detail" not in shown
    (reported,) = failed_ranks(caught.value)
    assert reported.reason == failure.reason and "Worker exit type" in reported.detail


def test_a_lost_node_is_named_with_the_method(cluster, victims):
    assert victims.execute_on(4, 5).ping().wait(timeout=30) == [4, 5]
    call = victims.execute_on(4, 5).block()
    cluster.kill_node(2)
    with pytest.raises(WorkerGroupError) as caught:
        call.wait(timeout=60)
    assert {rank: f.reason for rank, f in caught.value.failures.items()} == {
        4: "its node 2 was lost during block",
        5: "its node 2 was lost during block",
    }


def test_rays_memory_monitor_is_recognised_by_its_error():
    """Ray raises OutOfMemoryError for the call its memory monitor cut short (text as Ray 2.60
    words it), and an ActorDiedError of exit type NODE_OUT_OF_MEMORY for calls sent after."""
    said = (
        "1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: "
        "10.0.0.2, ID: 5d4f) was 22.1GB used / 23.5GB limit (0.94)\nSelected to kill: (Actor(8e99): "
        "job ID=01000000, task name=Victim.block, pid=7467, actual memory used=20.1GB)"
    )
    failure = rank_failure(3, 1, OutOfMemoryError(said))
    assert (failure.reason, failure.pid, failure.gone, failure.detail) == (DIED, 7467, True, said)
    assert death_cause(said, "") == ("killed by Ray's memory monitor (OOM)", "")
    died_later = "The actor is dead because its worker process has died. Worker exit type: NODE_OUT_OF_MEMORY"
    assert death_cause(died_later, "")[0] == "killed by Ray's memory monitor (OOM)"
