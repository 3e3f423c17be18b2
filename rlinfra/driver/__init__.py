"""The driver API: what a job imports to write a supervised, versioned RL loop on rlinfra.

    from rlinfra.driver import Job, Run, RunSettings, RunState

A job subclasses ``Job`` (its worker groups, one iteration), ``RunState`` (its counters) and, for
settings of its own, ``RunSettings``; ``Run(job, cfg).execute()`` does the rest: placement,
launch, supervision, weight versions, checkpoints and ``--resume``, metrics, Ctrl-C, the failure
report. It imports Ray: a job's driver needs it anyway.
"""

from rlinfra.config import JobConfigError, Section, parse_config
from rlinfra.driver.entry import job_main, plot_curve
from rlinfra.driver.job import TRAINER_METHODS, Batch, Job, RunResult, TrainerContractError
from rlinfra.driver.metrics import read_events, read_metrics
from rlinfra.driver.module_entry import run_module
from rlinfra.driver.run import Run
from rlinfra.driver.settings import RunSettings
from rlinfra.driver.state import RunState

__all__ = [
    "TRAINER_METHODS",
    "Batch",
    "Job",
    "JobConfigError",
    "Run",
    "RunResult",
    "RunSettings",
    "RunState",
    "Section",
    "TrainerContractError",
    "job_main",
    "parse_config",
    "plot_curve",
    "read_events",
    "read_metrics",
    "run_module",
]
