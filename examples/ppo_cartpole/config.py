"""The job's own config sections, parsed once into typed records before Ray starts.

``algo`` and ``run`` are declared sections (``PPOConfig``, ``RunSettings``), parsed when the job is
made (``rlinfra.driver.Job``: one ``JobConfigError`` per mistake, named by key). ``cluster``
is rlinfra's: ``Cluster`` and ``ComponentPlacement`` parse it. Every other top-level key but
``name`` is refused, with the nearest section named: nothing a user writes is ignored.
"""

from __future__ import annotations

from pydantic import Field

from examples.ppo_cartpole.ppo.config import PPOConfig
from examples.ppo_cartpole.ppo.envs import discrete_spaces
from rlinfra import driver
from rlinfra.driver import JobConfigError


class RunSettings(driver.RunSettings):
    """The ``run`` section: rlinfra's settings and how long an env worker waits for actions."""

    output_dir: str = "outputs/ppo_cartpole"
    request_timeout_s: float = Field(60.0, gt=0)  # for one batch of actions


class JobConfig(driver.JobConfig):
    """Every section the job reads, typed."""

    algo: PPOConfig
    run: RunSettings


def env_spaces(env_id: str) -> tuple[int, int]:
    """Observation size and number of actions; a ``JobConfigError`` naming ``algo.env_id``."""
    try:
        return discrete_spaces(env_id)
    except ValueError as error:
        raise JobConfigError(f"algo.env_id: {error}") from None
