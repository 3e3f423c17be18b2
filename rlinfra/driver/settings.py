"""The ``run`` section every job has: where outputs go, how often to checkpoint, how patient to be.

A job with more settings subclasses ``RunSettings`` (a frozen dataclass: OmegaConf checks the
types, each field's metadata its range; a subclass may declare a field again to narrow it);
``Run`` reads only these fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlinfra.services.weights.barrier import TRANSPORTS


@dataclass(frozen=True)
class RunSettings:
    """``run``: outputs, checkpoints, the weight transport and the driver's deadlines."""

    entrypoint: str = ""  # read by ``rlinfra run``, not by the job
    output_dir: str = "outputs/run"
    checkpoint_every: int = field(default=1, metadata={"at_least": 1})  # iterations
    # How weight versions move (``WeightSync``); a job whose receivers support fewer narrows it.
    transport: str = field(default="object_store", metadata={"one_of": TRANSPORTS})
    call_timeout_s: float = field(default=300.0, metadata={"above": 0})  # the wait for one group step
    launch_timeout_s: float = field(default=180.0, metadata={"above": 0})
    plot: bool = True
    tensorboard: bool = True  # event files in OUTPUT/tensorboard, beside metrics.jsonl
