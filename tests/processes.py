"""Whether processes a test started are still there (signal 0 checks existence, sends nothing)."""

from __future__ import annotations

import os
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
