"""The Python stack of a worker process at this moment, for the report on a stuck rank.

``py-spy dump`` (shipped with ``ray[default]``) reads a process's Python frames from outside, so
it works even when the worker holds the GIL in a C call — where nothing inside the process can
run. It must run on the worker's node: a task pinned there (no CPU reserved, so a full node still
runs it) dumps the process by pid. Where py-spy is missing or may not attach (ptrace is not
allowed), the caller falls back to the worker's own view of its threads
(``rlinfra.runtime.progress.thread_stacks``).
"""

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

PY_SPY_TIMEOUT_S = 10.0
# Files whose frames are machinery, not the work: Ray's, and the stdlib's threads and loops.
_SYSTEM_FILES = ("ray/", "threading.py", "queue.py", "selectors.py", "asyncio/", "concurrent/", "socket.py")


def run_on_node(node_id: str, function: Callable[..., Any], *args: Any) -> ray.ObjectRef:
    """``function(*args)`` as a task pinned to Ray node ``node_id``, reserving no CPU (so a full
    node still runs it) and never retried: how the driver looks at a node's processes and files."""
    task = ray.remote(num_cpus=0, max_retries=0)(function)
    return task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(*args)


def session_logs_dir() -> str:
    """Where Ray writes this session's logs on the node this runs on, each worker's output among
    them (``worker-*-<pid>.out`` and ``.err``)."""
    context = ray.get_runtime_context()
    return os.path.join(context.get_temp_dir(), context.get_session_name(), "logs")


def dump_on_node(pid: int) -> str | None:
    """``py-spy dump`` of ``pid``, run where it lives (py-spy next to this interpreter, a
    virtualenv's, else on PATH); None when py-spy is missing or cannot attach."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    program = beside if os.access(beside, os.X_OK) else shutil.which("py-spy")
    if program is None:
        return None
    try:
        done = subprocess.run(
            [program, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=PY_SPY_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def python_stack(node_id: str, pid: int, timeout_s: float = PY_SPY_TIMEOUT_S + 5.0) -> str | None:
    """The stack of process ``pid`` on Ray node ``node_id`` as py-spy sees it (idle Ray threads
    left out), or None when py-spy could not give one."""
    ref = run_on_node(node_id, dump_on_node, pid)
    try:
        text = ray.get(ref, timeout=timeout_s)
    except ray.exceptions.RayError:  # no dump in time (GetTimeoutError), or the task failed
        ray.cancel(ref, force=True)
        return None
    return None if text is None else user_threads(text)


def user_threads(dump: str) -> str:
    """The threads of a py-spy dump that run user code; Ray's own threads (its main loop, its GC
    and event loops, idle executor threads) are dropped. The whole dump if that leaves nothing."""
    header, *threads = dump.split("\nThread ")
    kept = [
        "Thread " + thread
        for thread in threads
        if any(_is_user_frame(line) for line in thread.splitlines()[1:])
    ]
    return "\n".join([header.strip(), *kept]) if kept else dump.strip()


def _is_user_frame(line: str) -> bool:
    """``    Blocker.wait (train.py:40)`` — a frame in a file that is neither Ray's nor the stdlib's
    thread and event-loop machinery."""
    location = line.rsplit("(", 1)[-1].rstrip(")").strip()
    return bool(location) and not location.startswith(_SYSTEM_FILES)
