"""Services on top of the runtime: naming (a KV with TTLs and leases), weights (the version
barrier), jobs and Slurm. Names load on first use."""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "Change": "rlinfra.services.naming",
    "Lease": "rlinfra.services.naming",
    "LeaseExpired": "rlinfra.services.naming",
    "LeaseKeeper": "rlinfra.services.naming",
    "NamingError": "rlinfra.services.naming",
    "NamingService": "rlinfra.services.naming",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'rlinfra.services' has no attribute {name!r}")
