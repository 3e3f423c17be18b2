"""Ctrl-C in the driver: it stops the run, even when swallowed, and never cuts the cleanup short.

SIGTERM is handled the same way (Slurm's ``scancel``, a pod's deletion, ``kill``): without this,
Ray's own driver handler turns it into ``sys.exit(15)`` in the middle of whatever runs, which
prints a traceback, skips the job's cleanup and can abort the interpreter at exit.
"""

import contextlib
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

STOPPING = (signal.SIGINT, signal.SIGTERM)


@dataclass
class CtrlC:
    """Ctrl-C (or SIGTERM) raises ``KeyboardInterrupt`` and is also remembered, so that code which
    swallows the exception cannot make the job ignore it: the loop then stops at the end of the
    iteration. (Seen once in a full test run: a SIGINT during an iteration was lost somewhere below
    the driver's code and training went on to the end.)"""

    pressed: bool = False

    def _handler(self, signum: int, frame: Any) -> None:
        self.pressed = True
        raise KeyboardInterrupt

    def watching(self) -> contextlib.AbstractContextManager[None]:
        return _sigint_handled_by(self._handler)


def sigint_ignored() -> contextlib.AbstractContextManager[None]:
    """Hold off Ctrl-C and SIGTERM while releasing workers and placement groups (bounded: seconds)."""
    return _sigint_handled_by(signal.SIG_IGN)


@contextlib.contextmanager
def _sigint_handled_by(handler: Any) -> Iterator[None]:
    """Inside the block SIGINT and SIGTERM go to ``handler`` (a function or ``signal.SIG_IGN``);
    the previous handlers are back afterwards."""
    try:
        previous = {signum: signal.signal(signum, handler) for signum in STOPPING}
    except ValueError:  # not the main thread: signals are not ours to manage
        yield
        return
    try:
        yield
    finally:
        for signum, handler_before in previous.items():
            signal.signal(signum, handler_before)
