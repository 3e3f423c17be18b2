"""The ``/proc`` scan that the loopback tests rely on: it must not lose a process's children
while that process starts and ends threads (as Ray's driver does all the time)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.listeners import descendants

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# A parent with one child, four threads starting and ending threads, until its stdin closes.
CHURNING_PARENT = """
import subprocess, sys, threading
child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
def churn():
    while True:
        threads = [threading.Thread(target=lambda: None) for _ in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
for _ in range(4):
    threading.Thread(target=churn, daemon=True).start()
print(child.pid, flush=True)
sys.stdin.read()
child.communicate()
"""


def test_a_child_is_found_while_its_parents_threads_come_and_go():
    parent = subprocess.Popen(
        [sys.executable, "-c", CHURNING_PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        missed = sum(child not in descendants(parent.pid) for _ in range(300))
    finally:
        parent.communicate(timeout=30)
    assert missed == 0, f"the child was missed in {missed} of 300 scans"
