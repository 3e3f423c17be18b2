"""The ``run`` section every job has: where outputs go, how often to checkpoint, how patient to be.

A job with more settings subclasses ``RunSettings`` (a ``Section``: pydantic checks the types and
ranges; a subclass may declare a field again to narrow it); ``Run`` reads only these fields.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlinfra.config import Section

# How weight versions move (``WeightSync``): the names of ``rlinfra.services.weights.transports``.
Transport = Literal["object_store", "object_store_shared", "broadcast", "cuda_ipc"]


class RunSettings(Section):
    """``run``: outputs, checkpoints, the weight transport and the driver's deadlines."""

    entrypoint: str = ""  # read by ``rlinfra run``, not by the job
    output_dir: str = "outputs/run"
    checkpoint_every: int = Field(default=1, ge=1)  # iterations
    trainer: str = "actor"  # the component start_trainer launches, checkpoints and restarts
    transport: Transport = "object_store"  # a job whose receivers support fewer narrows it
    call_timeout_s: float = Field(default=300.0, gt=0)  # the wait for one group step
    launch_timeout_s: float = Field(default=180.0, gt=0)
    plot: bool = True
    tensorboard: bool = True  # event files in OUTPUT/tensorboard, beside metrics.jsonl
