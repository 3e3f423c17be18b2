"""The trainer contract: what ``Run`` calls on each rank of a trained group, declared once.

A trainer counts its own weight versions and checkpoints its count; the version each goes out as
is the run's rule (``RunState.published``: above the version served after a restart), so no
trainer needs to know about restarts. What it returns from an update is an ``Update``.
"""

from collections.abc import Mapping
from typing import Any

from rlinfra.runtime.worker import Worker
from rlinfra.services.weights import WeightSender

from .records import ContractError

# What ``Run`` calls on each rank of the trainer group, besides the job's own methods.
TRAINER_METHODS = {
    "setup": "setup(checkpoint: bytes | None) -> int (build; restore checkpoint()'s bytes if given; "
    "return the weight version)",
    "checkpoint": "checkpoint() -> bytes (what setup restores)",
    "weights_state": "weights_state() -> {name: tensor} (the weights each version publishes)",
}


class TrainerContractError(ContractError):
    """A trainer class that lacks what ``Run`` calls on it, found before any process starts."""


class Trainer(WeightSender, Worker):
    """The base of a trained group's worker class: override the three ``TRAINER_METHODS``, and
    return an ``Update`` from the method a step trains with (``step.train(group.method, batches)``)."""

    def setup(self, checkpoint: bytes | None) -> int:
        raise NotImplementedError(TRAINER_METHODS["setup"])

    def checkpoint(self) -> bytes:
        raise NotImplementedError(TRAINER_METHODS["checkpoint"])

    def weights_state(self) -> Mapping[str, Any]:
        raise NotImplementedError(TRAINER_METHODS["weights_state"])


def check_trainer(worker_cls: type, component: str, *, publishes: bool = True) -> None:
    """``worker_cls`` keeps the trainer contract: ``TRAINER_METHODS`` of its own, not the bases'
    placeholders, and, for the group whose weights are served (``publishes``), a
    ``WeightSender`` (a ``Trainer`` is one); else a ``TrainerContractError`` naming the class,
    the component and each thing it lacks. Another trained group (a critic) publishes nothing:
    ``setup`` and ``checkpoint`` are enough."""
    missing = (
        [] if issubclass(worker_cls, WeightSender) or not publishes else ["WeightSender among its bases"]
    )
    for name, what in TRAINER_METHODS.items():
        method = getattr(worker_cls, name, None)
        placeholder = method in (getattr(WeightSender, name, None), getattr(Trainer, name))
        if (publishes or name != "weights_state") and (placeholder or not callable(method)):
            missing.append(what)
    if missing:
        lacks = "; ".join(missing)
        raise TrainerContractError(f"{worker_cls.__name__}, the trainer ({component!r}), lacks: {lacks}")
