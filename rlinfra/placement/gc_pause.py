"""Pausing Python's cyclic garbage collector while a big plan is built.

Resolving a 4,000-node plan allocates tens of thousands of small acyclic tuples; each time the
collector runs it scans the whole growing heap, which turns a linear algorithm into a superlinear
one (measured: 5.1x the time for 4x the nodes with the collector on, 3.9x with it paused).
"""

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Disable the cyclic collector inside the block; restore its previous state afterwards."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
