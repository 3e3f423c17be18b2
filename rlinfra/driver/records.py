"""The two records a job's workers hand the driver: a ``Batch`` (what a generating worker made) and
an ``Update`` (what the trainer did with batches). They replace dicts agreed by convention, so a
worker that breaks the contract is named at the call that returned the wrong thing.

Both travel through Ray (plain frozen dataclasses: no torch, no Ray in here).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any


class ContractError(TypeError):
    """A job's class or a worker's result lacks what the driver relies on; says what is missing."""


@dataclass(frozen=True)
class Batch:
    """One batch: the id the driver issued for it, the weight version that made all of it (the
    one ``serving()`` gave), and the job's own ``payload``. ``rank``: the worker that made it
    (set by the driver when it gathers)."""

    id: str
    version: int
    payload: Any
    rank: int = -1


@dataclass(frozen=True)
class Update:
    """What the trainer reports after an update: its own version count after it, the ids of the
    batches it trained on, its metrics. ``lost``: ids of batches it could not read (their maker
    died after making them); then it trained on nothing and the driver calls it again without
    them."""

    version: int
    batch_ids: Sequence[str]
    metrics: Mapping[str, float] = field(default_factory=dict)
    lost: Sequence[str] = ()


def expect(record: type, value: Any, what: str) -> Any:
    """``value`` when it is a ``record``; else a ``ContractError`` naming ``what`` returned it."""
    if not isinstance(value, record):
        expected = f"rlinfra.driver.{record.__name__}({', '.join(f.name for f in fields(record))})"
        raise ContractError(f"{what} returned {type(value).__name__}; expected {expected}")
    return value
