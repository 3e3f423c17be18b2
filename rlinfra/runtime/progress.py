"""Proof of progress inside a worker process: the heartbeat that tells "slow" from "stuck".

``is_alive()`` cannot see a worker that is alive but stuck — an async collector whose loop died,
an engine that stopped answering, a collective waiting for a peer that will never come. A group
call therefore counts a rank as making progress while it returns, or while the method it runs
calls ``Worker.heartbeat()`` (this module's ``heartbeat``); a rank that does neither for the
call's ``stuck_after`` is reported stuck, with its stack (``rlinfra.runtime.calls``).

One worker per process, so the state is the process's: any thread of the worker (a helper loop,
a fused role) may beat. The driver reads it through a method that runs in its own thread of the
actor (``WATCH_GROUP``), so it answers while the worker's own method is busy.
"""

import sys
import threading
import time
import traceback

WATCH_GROUP = "rlinfra_watch"  # the actor concurrency group of the progress and stack probes
_last_beat: float | None = None


def heartbeat() -> None:
    """Note that this process is making progress (cheap: one clock read and one store)."""
    global _last_beat
    _last_beat = time.monotonic()


def seconds_since_heartbeat() -> float | None:
    """How long ago this process last beat, by its own clock; None if it never did."""
    beat = _last_beat
    return None if beat is None else time.monotonic() - beat


def thread_stacks() -> str:
    """The Python stack of every other thread of this process, innermost frame last — the
    fallback when py-spy cannot attach (it needs ptrace; this needs the GIL)."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    current = threading.get_ident()
    parts = []
    for ident, frame in sys._current_frames().items():
        if ident != current:
            stack = "".join(traceback.format_stack(frame))
            parts.append(f"Thread {ident} ({names.get(ident, '?')}):\n{stack}")
    return "\n".join(parts)
