"""Processes a test started: whether they are still there (signal 0 checks existence, sends
nothing), stopping them by process group, and waiting for what they listen on."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable


def _exists(send: Callable[[int, int], None], target: int) -> bool:
    try:
        send(target, 0)
    except ProcessLookupError:
        return False
    return True


def process_alive(pid: int) -> bool:
    return _exists(os.kill, pid)


def process_group_alive(pgid: int) -> bool:
    """Any process of group ``pgid`` still running (a detached session leaves none behind)."""
    return _exists(os.killpg, pgid)


def stop_process_group(process: subprocess.Popen, grace_s: float = 3.0) -> None:
    """SIGTERM the process group of ``process`` (started with ``start_new_session``), then
    SIGKILL what is left after ``grace_s``."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and process_group_alive(process.pid):
            process.poll()
            time.sleep(0.2)
    process.poll()


def wait_for_port(host: str, port: int, timeout_s: float, process: subprocess.Popen | None = None) -> None:
    """Return once ``host:port`` accepts a connection; AssertionError after ``timeout_s``, or
    as soon as ``process`` (the one that should listen) has exited."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert process is None or process.poll() is None, f"the process exited with {process.returncode}"
        with socket.socket() as probe:
            if probe.connect_ex((host, port)) == 0:
                return
        assert time.monotonic() < deadline, f"nothing listens on {host}:{port} after {timeout_s:g} s"
        time.sleep(0.2)
