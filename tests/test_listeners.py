"""The ``/proc`` scan that the loopback tests rely on: it must not lose a process's children
while that process starts and ends threads (as Ray's driver does all the time)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from tests.listeners import descendants

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_a_child_is_found_while_threads_come_and_go():
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            threads = [threading.Thread(target=lambda: None) for _ in range(20)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()

    churners = [threading.Thread(target=churn) for _ in range(4)]
    for churner in churners:
        churner.start()
    try:
        missed = sum(child.pid not in descendants(os.getpid()) for _ in range(300))
    finally:
        stop.set()
        for churner in churners:
            churner.join()
        child.communicate(timeout=30)
    assert missed == 0, f"the child was missed in {missed} of 300 scans"
