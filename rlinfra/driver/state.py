"""``RunState``: what a driver carries across iterations, the one place its counters live.

A job subclasses it with its own fields and names in ``CHECKPOINTED`` those that a resumed run
continues from (JSON values: a list comes back as a list, so a checkpointed field holds lists,
not tuples); ``Run`` saves them with each checkpoint, loads them on ``--resume`` and rewinds
them when the trainer is restarted from a checkpoint. The rest (the record of versions, batches
and recoveries) is this process's, never rewound: it is what the run did.
"""

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rlinfra.driver.batches import BatchLedger
from rlinfra.driver.supervisor import Recovery
from rlinfra.runtime.supervision import Restart


@dataclass
class RunState:
    """Progress (checkpointed) and the run's own record (not)."""

    CHECKPOINTED: ClassVar[tuple[str, ...]] = ("iteration", "training_s", "version_offset")
    KEPT_ON_REWIND: ClassVar[tuple[str, ...]] = ("training_s",)  # counts the time actually spent

    iteration: int = 0  # counted across resumes
    training_s: float = 0.0  # from the first batch to the last update, across resumes
    version_offset: int = 0  # published version = the trainer's own count + this (see Run.start_trainer)
    served_versions: list[int] = field(default_factory=list)  # the receivers', after each sync
    batch_versions: list[list[int]] = field(default_factory=list)  # per iteration, per batch
    dropped_batches: int = 0  # too stale to train on
    ledger: BatchLedger = field(default_factory=BatchLedger)  # every batch id and how it ended
    recoveries: list[Recovery] = field(default_factory=list)  # dead workers replaced mid-run
    trainer_restarts: list[Restart] = field(default_factory=list)  # the trainer, from its checkpoint
    events: list[dict[str, Any]] = field(default_factory=list)  # every fault survived, as shown

    def load(self, saved: Mapping[str, Any] | None, keep: tuple[str, ...] = ()) -> None:
        """Take the ``CHECKPOINTED`` fields from ``saved`` (missing ones: those of a fresh state,
        ``type(self)()``), except ``keep``."""
        saved, defaults = saved or {}, type(self)()
        for name in self.CHECKPOINTED:
            if name not in keep:
                setattr(self, name, copy.deepcopy(saved[name]) if name in saved else getattr(defaults, name))

    def rewind(self, saved: Mapping[str, Any] | None) -> None:
        """Back to a checkpoint (or to the start) after a trainer restart: the batches in flight
        are dropped (made with the lost trainer's weights), those trained since are rolled back."""
        self.load(saved, keep=(*self.KEPT_ON_REWIND, "version_offset"))  # what was served stays served
        del self.batch_versions[self.iteration :]
        self.ledger.dropped(self.ledger.open_ids)
        self.ledger.rolled_back(after_iteration=self.iteration)

    def published(self, trained: int, above: int | None = None) -> int:
        """The version the trainer's own count ``trained`` goes out as; after a restart, above the
        version served (``above``): the offset rises to make it so, and never falls."""
        if above is not None:
            self.version_offset = max(self.version_offset, above + 1 - trained)
        return trained + self.version_offset

    def checkpointed(self) -> dict[str, Any]:
        """The fields a resumed run continues from, as plain copies (the state goes on)."""
        return {name: copy.deepcopy(getattr(self, name)) for name in self.CHECKPOINTED}
