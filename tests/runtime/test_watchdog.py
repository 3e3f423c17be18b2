"""Stuck is an error too: a rank alive but silent is reported with its stack, in time.

Real workers blocked three ways — on a lock, in ``time.sleep``, and in a C call that holds the
GIL (``ctypes.PyDLL``: nothing in the process can run, so only py-spy sees it) — each become a
``WorkerGroupError`` of kind ``stuck`` within ``stuck_after`` + 2 s, naming group, rank, node and
method, with the stack of the very frame they block in. A slow method that beats is left alone.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlinfra import Cluster, ComponentPlacement, Worker, WorkerGroupError

STUCK_AFTER = 2.0
CFG: dict[str, Any] = {
    "cluster": {
        "num_nodes": 2,
        "simulate": "2x4",  # the Ray of the weight-sync and rendezvous tests (see conftest)
        "component_placement": {"probe": {"node_group": "node", "placement": "1"}},
    }
}
pytestmark = [pytest.mark.timeout(180), pytest.mark.cluster(CFG)]


class Blocker(Worker):
    def __init__(self) -> None:
        self.held = threading.Lock()
        self.held.acquire()

    def wait_on_lock(self) -> None:
        self.held.acquire()  # never released

    def sleep_for_long(self) -> None:
        time.sleep(60)

    def hold_the_interpreter(self) -> None:
        ctypes.PyDLL(None).sleep(60)  # a C call that keeps the GIL

    def slow_but_beating(self, seconds: float) -> str:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.3)
            self.heartbeat()
        return "done"


@pytest.fixture
def blocker(cluster: Cluster, placement: ComponentPlacement) -> Iterator[Any]:
    group = Blocker.create_group().launch(
        cluster, placement.get_strategy("probe"), name="probe", stuck_after=STUCK_AFTER
    )
    yield group
    group.shutdown()


@pytest.mark.parametrize(
    ("method", "frame"),
    [
        ("wait_on_lock", "self.held.acquire()  # never released"),
        ("sleep_for_long", "time.sleep(60)"),
        ("hold_the_interpreter", "ctypes.PyDLL(None).sleep(60)"),
    ],
)
def test_a_silent_rank_is_stuck_with_its_stack(blocker: Any, method: str, frame: str) -> None:
    started = time.monotonic()
    with pytest.raises(WorkerGroupError) as caught:
        getattr(blocker, method)().wait(timeout=60)
    elapsed = time.monotonic() - started
    error = caught.value
    assert error.kind == "stuck" and error.failed_ranks == [0]
    assert STUCK_AFTER <= elapsed < STUCK_AFTER + 2, elapsed
    failure = error.failures[0]
    assert (failure.kind, failure.node_rank) == ("stuck", 1)
    assert failure.reason.startswith(f"stuck in {method}: no progress for ")
    assert "no heartbeat since it began" in failure.reason
    text = str(error)
    assert text.startswith(f"worker group 'probe': {method} is stuck on rank(s) 0")
    assert "rank 0 (node 1)" in text
    assert f"{method} (test_watchdog.py:" in failure.traceback  # py-spy names the frame and line
    line = next(number for number, source in enumerate(SOURCE, start=1) if frame in source)
    assert f"{method} (test_watchdog.py:{line})" in failure.traceback


def test_a_slow_method_that_beats_is_not_stuck(blocker: Any) -> None:
    assert blocker.slow_but_beating(3 * STUCK_AFTER).wait(timeout=60) == ["done"]


def test_the_watch_can_be_turned_off_per_call(blocker: Any) -> None:
    with pytest.raises(WorkerGroupError) as caught:
        blocker.sleep_for_long().wait(timeout=STUCK_AFTER + 1.5, stuck_after=None)
    assert caught.value.kind == "failed"
    assert "no answer within 3.5 s" in str(caught.value)


SOURCE = Path(__file__).read_text(encoding="utf-8").splitlines()


def test_the_in_process_fallback_shows_a_blocked_threads_frame() -> None:
    """Where py-spy may not attach, the worker reports its other threads' stacks itself."""
    from rlinfra.runtime.progress import thread_stacks

    release = threading.Event()
    helper = threading.Thread(target=release.wait, name="waiting-helper", daemon=True)
    helper.start()
    try:
        stacks = thread_stacks()
    finally:
        release.set()
    section = stacks[stacks.index("(waiting-helper)") :]
    assert "in wait" in section.split("Thread ", 1)[0]


def test_py_spy_dumps_keep_the_user_threads_only() -> None:
    from rlinfra.runtime.stacks import user_threads

    dump = (
        "Process 7: ray::Blocker\nPython v3.11.7\n\n"
        'Thread 7 (active): "MainThread"\n    Worker.main_loop (ray/_private/worker.py:1069)\n'
        'Thread 8 (idle): "PythonGCThread"\n    Condition.wait (threading.py:327)\n'
        "Thread 9 (idle)\n"
        'Thread 10 (idle): "Dummy-1"\n    Blocker.step (train.py:40)\n'
        "    actor_method_executor (ray/_private/function_manager.py:740)\n"
    )
    kept = user_threads(dump)
    assert "Blocker.step (train.py:40)" in kept and "Process 7: ray::Blocker" in kept
    assert "MainThread" not in kept and "PythonGCThread" not in kept and "Thread 9" not in kept
    assert user_threads("Process 7\nThread 1 (idle)\n") == "Process 7\nThread 1 (idle)"
