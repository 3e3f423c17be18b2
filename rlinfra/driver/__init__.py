"""The driver API: what a job imports to write a supervised, versioned RL loop on rlinfra.

    from rlinfra.driver import Batch, Job, JobConfig, Run, Section, Trainer, Update

A job subclasses ``Job``: its config (a ``JobConfig`` of ``Section``s), its driver ``loop`` (launch
the groups, then ``for step in run.steps(total)``) and, for counters of its own, ``RunState``.
Its trainer's class is a ``Trainer``, which returns an ``Update``; its generating workers return
``Batch``es. ``Job.run(cfg)`` does the rest: placement, launch, supervision, weight versions,
checkpoints and ``--resume``, metrics, Ctrl-C, the failure report.

Names are loaded on first use: a worker process that imports ``Batch`` or ``Update`` loads only
the records, not Ray's driver side, rich or pydantic.
"""

from typing import TYPE_CHECKING

from rlinfra.lazy_exports import lazy_exports

if TYPE_CHECKING:  # for type checkers; at run time each name is imported on first use
    from rlinfra.config import JobConfigError as JobConfigError
    from rlinfra.config import Section as Section
    from rlinfra.config import parse_config as parse_config
    from rlinfra.driver.job import Job as Job
    from rlinfra.driver.job import JobConfig as JobConfig
    from rlinfra.driver.metrics import read_events as read_events
    from rlinfra.driver.metrics import read_metrics as read_metrics
    from rlinfra.driver.module_entry import run_module as run_module
    from rlinfra.driver.records import Batch as Batch
    from rlinfra.driver.records import ContractError as ContractError
    from rlinfra.driver.records import Update as Update
    from rlinfra.driver.result import RunResult as RunResult
    from rlinfra.driver.run import Run as Run
    from rlinfra.driver.settings import RunSettings as RunSettings
    from rlinfra.driver.state import RunState as RunState
    from rlinfra.driver.trainer import TRAINER_METHODS as TRAINER_METHODS
    from rlinfra.driver.trainer import Trainer as Trainer
    from rlinfra.driver.trainer import TrainerContractError as TrainerContractError

_NAMES_BY_MODULE = {
    "rlinfra.config": ("JobConfigError", "Section", "parse_config"),
    "rlinfra.driver.job": ("Job", "JobConfig"),
    "rlinfra.driver.metrics": ("read_events", "read_metrics"),
    "rlinfra.driver.module_entry": ("run_module",),
    "rlinfra.driver.records": ("Batch", "ContractError", "Update"),
    "rlinfra.driver.result": ("RunResult",),
    "rlinfra.driver.run": ("Run",),
    "rlinfra.driver.settings": ("RunSettings",),
    "rlinfra.driver.state": ("RunState",),
    "rlinfra.driver.trainer": ("TRAINER_METHODS", "Trainer", "TrainerContractError"),
}
_EXPORTS = {name: module for module, names in _NAMES_BY_MODULE.items() for name in names}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
