"""The job's own config sections, parsed once into typed records before Ray starts.

``algo`` and ``run`` are OmegaConf structured configs (``PPOConfig``, ``RunSettings``): OmegaConf
checks each key against the dataclass and each value against the field's type; this module turns
its errors into one ``JobConfigError`` per mistake, named by key, and adds the ranges a type
cannot say. ``cluster`` is rlinfra's: ``Cluster`` and ``ComponentPlacement`` parse it. Every other
top-level key is refused, with the nearest section named: nothing a user writes is ignored.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from examples.ppo_cartpole.ppo.config import PPOConfig
from rlinfra.placement.config_access import to_plain
from rlinfra.services.weights.barrier import TRANSPORTS


class JobConfigError(ValueError):
    """A mistake in the job's own config (``algo``, ``run``, an unknown section), named by key."""


@dataclass(frozen=True)
class RunSettings:
    """The ``run`` section: where outputs go and how patient the job is."""

    entrypoint: str = "examples.ppo_cartpole.job:main"  # read by ``rlinfra run``, not by the job
    output_dir: str = "outputs/ppo_cartpole"
    checkpoint_every: int = 1  # iterations; a checkpoint is ~100 kB, so every iteration is cheap
    transport: str = "object_store"  # weight-sync transport
    request_timeout_s: float = 60.0  # an env worker's wait for one batch of actions
    call_timeout_s: float = 300.0  # the driver's wait for a rollout or a training step
    launch_timeout_s: float = 180.0
    plot: bool = True
    tensorboard: bool = True  # event files in OUTPUT/tensorboard, beside metrics.jsonl


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
    unknown = [str(key) for key in cfg if key not in SECTIONS]
    if unknown:
        raise _unknown_key(unknown[0], unknown[0], "section", SECTIONS)
    return JobConfig(name=str(cfg.get("name") or ""), algo=algo_config(cfg), run=run_settings(cfg))


def algo_config(cfg: Mapping[str, Any]) -> PPOConfig:
    """``algo`` as a ``PPOConfig``, with the ranges the job needs."""
    algo = _section(PPOConfig, cfg, "algo")
    _require(algo.iterations >= 1, "algo.iterations", algo.iterations, "at least 1")
    _require(algo.max_staleness >= 0, "algo.max_staleness", algo.max_staleness, "0 or more")
    _require(algo.num_envs >= 1 and algo.num_steps >= 1, "algo.num_envs/num_steps", algo.num_envs, ">= 1")
    options = ("ddp", "allreduce")
    _require(algo.data_parallel in options, "algo.data_parallel", algo.data_parallel, f"one of {options}")
    return algo


def run_settings(cfg: Mapping[str, Any]) -> RunSettings:
    """``run`` as ``RunSettings``, with the ranges the job needs."""
    settings = _section(RunSettings, cfg, "run")
    _require(settings.checkpoint_every >= 1, "run.checkpoint_every", settings.checkpoint_every, "at least 1")
    _require(settings.transport in TRANSPORTS, "run.transport", settings.transport, f"one of {TRANSPORTS}")
    for key in ("request_timeout_s", "call_timeout_s", "launch_timeout_s"):
        _require(getattr(settings, key) > 0, f"run.{key}", getattr(settings, key), "a positive number")
    return settings


def env_spaces(env_id: str) -> tuple[int, int]:
    """Observation size and number of actions, from one throw-away env; a ``JobConfigError``
    naming ``algo.env_id`` if gymnasium does not know it or it is not a discrete-action env."""
    try:
        probe = gym.make(env_id)
    except gym.error.Error as error:
        raise JobConfigError(f"algo.env_id: {error}") from None
    try:
        if not isinstance(probe.action_space, gym.spaces.Discrete) or len(probe.observation_space.shape) != 1:
            raise JobConfigError(
                f"algo.env_id: {env_id!r} has {probe.action_space} actions and observations of shape "
                f"{probe.observation_space.shape}; expected discrete actions and flat observations"
            )
        return int(probe.observation_space.shape[0]), int(probe.action_space.n)
    finally:
        probe.close()


def _section(schema: type, cfg: Mapping[str, Any], name: str) -> Any:
    """Section ``name`` merged over ``schema``'s defaults (an absent or empty section is all
    defaults), by OmegaConf's type rules: ``"5"`` is a fine int, ``1.5`` is not; a switch must be
    ``true`` or ``false`` (OmegaConf would read ``2`` or ``"yes"`` as true)."""
    section = to_plain(cfg.get(name)) or {}
    if not isinstance(section, Mapping):
        raise JobConfigError(f"{name}: expected a mapping, got {section!r}")
    hints = typing.get_type_hints(schema)
    for key, value in section.items():
        if hints.get(str(key)) is bool and not isinstance(value, bool):  # OmegaConf reads 2 as true
            raise JobConfigError(f"{name}.{key}: expected true or false, got {value!r}")
    base = OmegaConf.structured(schema)
    OmegaConf.set_readonly(base, False)  # a frozen dataclass gives a read-only config: nothing merges
    try:
        return OmegaConf.to_object(OmegaConf.merge(base, section))
    except ConfigKeyError as error:
        fields = [f.name for f in dataclasses.fields(schema)]
        raise _unknown_key(f"{name}.{error.key}", str(error.key), "key", fields) from None
    except ValidationError as error:
        expected = hints[str(error.key)]
        raise JobConfigError(
            f"{name}.{error.key}: expected {expected.__name__}, got {to_plain(error.value)!r}"
        ) from None


def _unknown_key(where: str, key: str, kind: str, allowed: Sequence[str]) -> JobConfigError:
    """Typos would otherwise be silently ignored: name the key and the nearest valid one."""
    nearest = difflib.get_close_matches(key, list(allowed), n=1, cutoff=0.6)
    hint = f"did you mean {nearest[0]!r}? " if nearest else ""
    return JobConfigError(f"{where}: unknown {kind}; {hint}expected one of {', '.join(allowed)}")


def _require(ok: bool, key: str, value: Any, expected: str) -> None:
    if not ok:
        raise JobConfigError(f"{key}: got {value!r}; expected {expected}")
