"""The ``run`` section every job has: where outputs go, how often to checkpoint, how patient to be.

A job with more settings subclasses ``RunSettings`` (a frozen dataclass: OmegaConf checks the
types, ``check`` the ranges); ``Run`` reads only these fields.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlinfra.driver.job_config import require
from rlinfra.services.weights.barrier import TRANSPORTS


@dataclass(frozen=True)
class RunSettings:
    """``run``: outputs, checkpoints, the weight transport and the driver's deadlines."""

    entrypoint: str = ""  # read by ``rlinfra run``, not by the job
    output_dir: str = "outputs/run"
    checkpoint_every: int = 1  # iterations
    transport: str = "object_store"  # how weight versions move (``WeightSync``)
    call_timeout_s: float = 300.0  # the driver's wait for one step of a worker group
    launch_timeout_s: float = 180.0
    plot: bool = True
    tensorboard: bool = True  # event files in OUTPUT/tensorboard, beside metrics.jsonl

    def check(self, transports: tuple[str, ...] = TRANSPORTS, why: str = "") -> None:
        """The ranges a type cannot say; ``transports``: those the job's receivers support (``why``)."""
        require(self.checkpoint_every >= 1, "run.checkpoint_every", self.checkpoint_every, "at least 1")
        expected = f"one of {transports}" + (f" ({why})" if why else "")
        require(self.transport in transports, "run.transport", self.transport, expected)
        for key in ("call_timeout_s", "launch_timeout_s"):
            require(getattr(self, key) > 0, f"run.{key}", getattr(self, key), "a positive number")
