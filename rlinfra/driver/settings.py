"""The ``run`` section every job has: where outputs go, how often to checkpoint, how patient to be.

A job with more settings subclasses ``RunSettings`` (a ``Section``: pydantic checks the types and
ranges; a subclass may declare a field again to narrow it); ``Run`` reads only these fields.
"""

from typing import Literal

from pydantic import Field

from rlinfra.config import Section

# How weight versions move (``WeightSync``): the names of ``rlinfra.services.weights.transports``.
Transport = Literal["object_store", "object_store_shared", "broadcast"]
WandbMode = Literal["online", "offline", "disabled"]  # W&B's own


class WandbSettings(Section):
    """``run.wandb``: the run's records also to Weights & Biases (``pip install 'rlinfra[wandb]'``)."""

    project: str = Field(description="the W&B project")
    name: str | None = Field(default=None, description="the run's name in W&B (None: W&B's)")
    mode: WandbMode = Field(default="online", description="offline: files only, no network (`wandb sync`)")


class RunSettings(Section):
    """``run``: outputs, checkpoints, the weight transport and the driver's deadlines."""

    entrypoint: str = Field(
        default="", description="the job: 'package.module:JobClass' (rlinfra run reads it)"
    )
    output_dir: str = Field(default="outputs/run", description="metrics, checkpoints, summary.json")
    checkpoint_every: int = Field(default=1, ge=1, description="iterations between checkpoints")
    trainer: str = Field(default="actor", description="the component start_trainer launches and restarts")
    transport: Transport = Field(default="object_store", description="how weight versions move")
    call_timeout_s: float = Field(default=300.0, gt=0, description="the wait for one group step")
    launch_timeout_s: float = Field(default=180.0, gt=0, description="the wait for a group to start")
    plot: bool = Field(default=True, description="draw the curve towards the target")
    tensorboard: bool = Field(default=True, description="event files in OUTPUT/tensorboard")
    wandb: WandbSettings | None = Field(default=None, description="W&B: the same records, to a W&B run")
