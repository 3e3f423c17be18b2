"""A component's restart budget: how many times its dead workers may be replaced, and in what window.

    component_placement:
      rollout: {placement: 0-3, restart: {max: 3, within_s: 600}}
      actor:   {placement: 4-7, restart: {max: 0}}     # never replace (the job restarts it instead)

``max`` replacements within any ``within_s`` seconds; one more is refused
(``rlinfra.runtime.supervision.RestartBudgetExhausted``), because a worker that keeps dying is a
bug to report, not a fault to ride out. Without the key a component gets ``DEFAULT_RESTART``.
"""

from pydantic import ConfigDict, Field

from rlinfra.config import Section


class RestartPolicy(Section):
    """At most ``max_restarts`` (YAML: ``max``) replacements of the component's workers within
    ``within_s`` seconds; either may be left out (the defaults are 3 and 600 s)."""

    model_config = ConfigDict(validate_by_name=True)
    max_restarts: int = Field(default=3, ge=0, alias="max")
    within_s: float = Field(default=600.0, gt=0, description="the window the restarts are counted in")


DEFAULT_RESTART = RestartPolicy()
