"""A component's restart budget: how many times its dead workers may be replaced, and in what window.

    component_placement:
      rollout: {placement: 0-3, restart: {max: 3, within_s: 600}}
      actor:   {placement: 4-7, restart: {max: 0}}     # never replace (the job restarts it instead)

``max`` replacements within any ``within_s`` seconds; one more is refused
(``rlinfra.runtime.supervision.RestartBudgetExhausted``), because a worker that keeps dying is a
bug to report, not a fault to ride out. Without the key a component gets ``DEFAULT_RESTART``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlinfra.placement.config_access import reject_unknown_keys, require_int
from rlinfra.placement.errors import PlacementError

RESTART_FIELDS = ("max", "within_s")


@dataclass(frozen=True)
class RestartPolicy:
    """At most ``max_restarts`` replacements of the component's workers within ``within_s`` seconds."""

    max_restarts: int = 3
    within_s: float = 600.0


DEFAULT_RESTART = RestartPolicy()


def parse_restart(value: Any, where: str) -> RestartPolicy | None:
    """``{max: N, within_s: S}`` (either may be left out: the defaults are 3 and 600 s)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise PlacementError(
            f"expected a mapping, got {value!r}",
            where=where,
            expected="restart: {max: 3, within_s: 600}",
        )
    reject_unknown_keys(value, RESTART_FIELDS, where)
    max_restarts = require_int(value.get("max", DEFAULT_RESTART.max_restarts), f"{where}.max")
    within_s = value.get("within_s", DEFAULT_RESTART.within_s)
    number = isinstance(within_s, (int, float)) and not isinstance(within_s, bool)
    if not number or not math.isfinite(within_s) or within_s <= 0:
        raise PlacementError(
            f"expected a number of seconds, got {within_s!r}",
            where=f"{where}.within_s",
            expected="seconds > 0 (the window the restarts are counted in)",
        )
    return RestartPolicy(max_restarts, float(within_s))
