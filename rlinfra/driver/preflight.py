"""What a job's config must agree with before any cluster starts, checked the same way by
``rlinfra run`` (``Run``) and ``rlinfra plan``: no Ray here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlinfra.config import JobConfigError, did_you_mean
from rlinfra.placement import PlacementError
from rlinfra.placement.config import ClusterConfig

if TYPE_CHECKING:
    from .job import Job


def preflight(job: Job, config: ClusterConfig | None) -> None:
    """The job's components against its config, before any cluster (``rlinfra run`` and
    ``rlinfra plan`` alike): ``run.trainer`` is one of them, and the placed ones are exactly
    them (a misspelt one named, with the nearest of the job's)."""
    trainer, wanted = job.settings.trainer, list(job.components)
    if wanted and trainer not in wanted:
        hint = did_you_mean(trainer, wanted)
        problem = f"{trainer!r} is not a component of the {job.title} job" + (f"; {hint}" if hint else "")
        raise JobConfigError(problem, where="run.trainer", expected="one of " + ", ".join(map(repr, wanted)))
    if config is None:
        return
    placed = [name for entry in config.components for name in entry.names]
    wanted = wanted or placed
    unknown = [name for name in placed if name not in wanted]
    strays = [*unknown, *(name for name in wanted if name not in placed)]
    if strays:
        kind, hint = ("unknown", did_you_mean(strays[0], wanted)) if unknown else ("missing", "")
        problem = f"{kind} component {strays[0]!r}" + (f"; {hint}" if hint else "")
        expected = f"the {job.title} job's components: " + ", ".join(wanted)
        raise PlacementError(problem, where="cluster.component_placement", expected=expected)
