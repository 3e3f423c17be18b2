"""A component's restart budget: how many times its dead workers may be replaced, and in what window.

    component_placement:
      rollout: {placement: 0-3, restart: {max: 3, within_s: 600}}
      actor:   {placement: 4-7, restart: {max: 0}}     # never replace (the job restarts it instead)

``max`` replacements within any ``within_s`` seconds; one more is refused
(``rlinfra.runtime.supervision.RestartBudgetExhausted``), because a worker that keeps dying is a
bug to report, not a fault to ride out. Without the key a component gets ``DEFAULT_RESTART``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlinfra.placement.config_access import as_section, require_int, require_number

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
    section = as_section(value, RESTART_FIELDS, where, expected="restart: {max: 3, within_s: 600}")
    max_restarts = require_int(section.get("max", DEFAULT_RESTART.max_restarts), f"{where}.max")
    within_s = require_number(
        section.get("within_s", DEFAULT_RESTART.within_s),
        f"{where}.within_s",
        "a number of seconds",
        "seconds > 0 (the window the restarts are counted in)",
        positive=True,
    )
    return RestartPolicy(max_restarts, within_s)
