"""Which worker methods a sleeping time-shared worker still serves, declared where they are defined.

A component asleep on a shared device refuses calls (``rlinfra.runtime.timesharing``), except the
methods that work on host memory: a weight update staging a version (and loading it into
parameters offloaded to the host), a trainer exporting its offloaded weights. Those are marked
``@served_asleep`` on the class that defines them; an override in a subclass keeps the mark, so a
job's own ``engine_state`` or ``weights_state`` is served like the one it replaces. A leaf module:
the weight-update mixins mark their methods without importing the time-sharing machinery.
"""

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
_MARK = "_rlinfra_served_asleep"


def served_asleep(method: F) -> F:
    """Declare ``method`` served while its worker sleeps (see the module docstring)."""
    setattr(method, _MARK, True)
    return method


def is_served_asleep(cls: type, name: str) -> bool:
    """Whether ``cls`` or any class it inherits from defines ``name`` marked ``@served_asleep``."""
    return any(getattr(vars(klass).get(name), _MARK, False) for klass in cls.__mro__)
