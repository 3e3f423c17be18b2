"""Shared helpers for runtime tests."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import ray


def _settled_gpus(expected: float, timeout: float = 10.0) -> float:
    """Ray's available-resource view converges asynchronously after a release: poll it, with a
    deadline, until it shows ``expected`` (returns the last value seen either way)."""
    deadline = time.monotonic() + timeout
    value = ray.available_resources().get("GPU", 0.0)
    while abs(value - expected) > 1e-6 and time.monotonic() < deadline:
        time.sleep(0.05)
        value = ray.available_resources().get("GPU", 0.0)
    return value


@pytest.fixture
def available_gpus() -> Callable[[float], float]:
    return _settled_gpus
