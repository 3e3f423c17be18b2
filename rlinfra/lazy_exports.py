"""Package names loaded on first use (PEP 562's module ``__getattr__``).

``rlinfra``, ``rlinfra.runtime`` and ``rlinfra.services`` export names whose modules pull in Ray;
``rlinfra plan`` and the pure placement layer import those packages without it, so each package
maps its exported names to the modules that define them and imports a module only when one of
its names is first read.
"""

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: ``exports`` maps each name to the module defining it."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
