"""The job's own config sections, parsed once into typed records before Ray starts.

``algo`` and ``run`` are OmegaConf structured configs (``PPOConfig``, ``RunSettings``) parsed by
``rlinfra.driver`` (one ``JobConfigError`` per mistake, named by key); this module
adds the ranges a type cannot say. ``cluster`` is rlinfra's: ``Cluster`` and
``ComponentPlacement`` parse it. Every other top-level key is refused, with the nearest section
named: nothing a user writes is ignored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from examples.ppo_cartpole.ppo.config import PPOConfig
from examples.ppo_cartpole.ppo.envs import discrete_spaces
from rlinfra import driver
from rlinfra.driver import JobConfigError, check_sections, parse_section, require


@dataclass(frozen=True)
class RunSettings(driver.RunSettings):
    """The ``run`` section: rlinfra's settings and how long an env worker waits for actions."""

    entrypoint: str = "examples.ppo_cartpole.job:main"  # read by ``rlinfra run``, not by the job
    output_dir: str = "outputs/ppo_cartpole"
    request_timeout_s: float = 60.0  # an env worker's wait for one batch of actions


@dataclass(frozen=True)
class JobConfig:
    """Every section the job reads, typed."""

    name: str  # the run's name, in the learning curve's title
    algo: PPOConfig
    run: RunSettings


# ``cluster`` is rlinfra's section (``Cluster`` and ``ComponentPlacement`` parse it); the rest are the job's.
SECTIONS = ("cluster", *(section.name for section in dataclasses.fields(JobConfig)))


def parse_job_config(cfg: Mapping[str, Any]) -> JobConfig:
    """The whole config checked and typed: unknown sections refused, ``algo`` and ``run`` parsed."""
    check_sections(cfg, SECTIONS)
    return JobConfig(name=str(cfg.get("name") or ""), algo=algo_config(cfg), run=run_settings(cfg))


def algo_config(cfg: Mapping[str, Any]) -> PPOConfig:
    """``algo`` as a ``PPOConfig``, with the ranges the job needs."""
    algo = parse_section(PPOConfig, cfg, "algo")
    require(algo.iterations >= 1, "algo.iterations", algo.iterations, "at least 1")
    require(algo.max_staleness >= 0, "algo.max_staleness", algo.max_staleness, "0 or more")
    require(algo.num_envs >= 1 and algo.num_steps >= 1, "algo.num_envs/num_steps", algo.num_envs, ">= 1")
    options = ("ddp", "allreduce")
    require(algo.data_parallel in options, "algo.data_parallel", algo.data_parallel, f"one of {options}")
    return algo


def run_settings(cfg: Mapping[str, Any]) -> RunSettings:
    """``run`` as ``RunSettings``, with the ranges the job needs."""
    settings = parse_section(RunSettings, cfg, "run")
    settings.check()
    require(
        settings.request_timeout_s > 0,
        "run.request_timeout_s",
        settings.request_timeout_s,
        "a positive number",
    )
    return settings


def env_spaces(env_id: str) -> tuple[int, int]:
    """Observation size and number of actions; a ``JobConfigError`` naming ``algo.env_id``."""
    try:
        return discrete_spaces(env_id)
    except ValueError as error:
        raise JobConfigError(f"algo.env_id: {error}") from None


__all__ = ["JobConfig", "JobConfigError", "RunSettings", "env_spaces", "parse_job_config"]
