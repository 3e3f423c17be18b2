"""Batch ids: the driver's proof that no batch was lost, half-used or trained on twice.

The driver names every batch it asks for before it is made (``issue``); the worker that makes it
stamps the id into the batch, and the trainer reports the ids it trained on. Each id then ends
in exactly one way:

    trained    the trainer reported it (once: a second time is a duplicate)
    dropped    made but not trained on: too stale (``filter_stale``), or made by a lost trainer's weights
    lost       never made: its worker died mid-collection; a new id is issued to recollect it
    rolled back  trained on, but the update was lost with the trainer (restarted from a checkpoint
               taken before it); its iteration is redone with new batches

A second ending (a duplicate, or an id trained after it was lost) raises ``BatchLedgerError`` at
once, and ``open_ids`` lists what has not ended yet; at the end of a run it is empty.
"""

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

ENDINGS = TRAINED, DROPPED, LOST, ROLLED_BACK = "trained", "dropped", "lost", "rolled_back"


class BatchLedgerError(RuntimeError):
    """A batch id ended twice or in contradictory ways: something was duplicated or half-used."""


@dataclass
class BatchLedger:
    """Every batch id issued this run, and how each ended (one of ``ENDINGS``)."""

    issued: list[str] = field(default_factory=list)
    ended: dict[str, str] = field(default_factory=dict)
    duplicates: list[str] = field(default_factory=list)
    trained_in: dict[str, int] = field(default_factory=dict)  # id -> the iteration whose update used it
    _next: int = 0

    def issue(self, source: str) -> str:
        """A new id for a batch ``source`` (e.g. ``"env:3"``) is about to make."""
        self._next += 1
        batch_id = f"{source}#{self._next}"
        self.issued.append(batch_id)
        return batch_id

    def trained(self, batch_ids: Iterable[str], iteration: int = 0) -> None:
        """The trainer reports these ids as trained on in ``iteration``'s update; any id trained
        before is a duplicate."""
        for batch_id in batch_ids:
            self._end(batch_id, TRAINED)
            self.trained_in[batch_id] = iteration

    def rolled_back(self, after_iteration: int) -> None:
        """The updates after ``after_iteration`` were lost with the trainer: their batches end as
        rolled back (never trained on again: their iterations get new batches)."""
        undone = [i for i, iteration in self.trained_in.items() if iteration > after_iteration]
        for batch_id in undone:
            self.ended[batch_id] = ROLLED_BACK
            del self.trained_in[batch_id]

    def dropped(self, batch_ids: Iterable[str]) -> None:
        for batch_id in batch_ids:
            self._end(batch_id, DROPPED)

    def lost(self, batch_ids: Iterable[str]) -> None:
        for batch_id in batch_ids:
            self._end(batch_id, LOST)

    def _end(self, batch_id: str, how: str) -> None:
        if batch_id not in self.ended:
            self.ended[batch_id] = how
            return
        self.duplicates.append(f"{batch_id} {how} after {self.ended[batch_id]}")
        raise BatchLedgerError(f"batch {batch_id} {how} after it was already {self.ended[batch_id]}")

    @property
    def open_ids(self) -> list[str]:
        """Issued ids that have not ended (in flight now; none once the run has drained)."""
        return [batch_id for batch_id in self.issued if batch_id not in self.ended]

    def summary(self) -> dict[str, Any]:
        """Counts for the run's summary: issued, each ending, still open and duplicated."""
        counts = Counter(self.ended.values())
        summary = {"issued": len(self.issued)} | {how: counts[how] for how in ENDINGS}
        return summary | {"open": len(self.open_ids), "duplicated": len(self.duplicates)}
