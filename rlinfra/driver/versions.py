"""Weight-version bookkeeping between the trainer and the receiving group: the first version
given at launch, each update's version staged while generation goes on (``stage``: prepare), and
served between batches (``commit``: pause → swap → verify → resume); with a probe, the engines'
log-probs of fixed sequences checked against the trainer's at every committed version.

A mixin of ``Run`` (as ``SupervisedSteps`` is): every barrier step is retried after the dead are
replaced; the trainer's probe log-probs are a trainer call.
"""

from collections.abc import Callable
from typing import Any

from rlinfra.runtime.group import WorkerGroup
from rlinfra.services.weights import WeightSync
from rlinfra.services.weights.probe import LogprobProbe, Sequences

from .records import ContractError
from .settings import RunSettings
from .supervised import SupervisedSteps


class WeightVersions(SupervisedSteps):
    """The versions on their way from ``trainer`` to ``_receivers`` (through ``sync``, once both
    run). ``between_batches(self)`` runs at the first ``commit`` after ``_between_done`` is
    cleared (once a step)."""

    settings: RunSettings
    trainer: WorkerGroup = None  # type: ignore[assignment]  # start_trainer sets it
    sync: WeightSync | None = None
    _receivers: WorkerGroup | None = None  # the group that gets the trainer's weights
    _first_version: int | None = None  # the trainer's, as start_trainer published it
    staged_version: int | None = None  # trained and staged on the receivers, not yet served
    sync_s: dict[str, float]  # the last stage's and commit's times
    _probe: LogprobProbe | None = None
    logprob_mismatch: float | None = None  # the probe's, at the last committed version
    between_batches: Callable[[Any], None] | None
    _between_done = False

    def _connect_weights(self) -> None:
        """The weight barrier from the trainer to the receiving group, once both run."""
        receivers, trainer = self._receivers, self.trainer
        if self.sync is not None or receivers is None or trainer is None or self._first_version is None:
            return
        weights = trainer.execute_on(0).weights_state().wait()[0]
        receivers.set_initial_weights(weights, self._first_version).wait()
        self.sync = WeightSync(
            trainer, receivers, transport=self.settings.transport, initial_version=self._first_version,
            step_timeout_s=self.settings.call_timeout_s,
        )  # fmt: skip

    @property
    def served_version(self) -> int:
        return self.sync.version if self.sync is not None else 0

    @property
    def learner_version(self) -> int:
        """The trainer's weight version: the one staged, if any, else the one served."""
        return self.staged_version if self.staged_version is not None else self.served_version

    def stage(self, trained: int) -> None:
        """Stage the trainer's version ``trained`` (published as ``trained + state.version_offset``,
        see ``start_trainer``) on every receiver while they keep generating (``prepare``), and
        record the trainer's log-probs of the probe under it (see ``probe``). Nothing, when no
        group receives weights."""
        if self.sync is None:
            return
        version = self.state.published(trained)
        if self.staged_version is not None and self.staged_version != version:
            unserved = f"version {self.staged_version}, staged by the last update, was never served"
            raise ContractError(f"{unserved}: run.commit() it between batches before the next update")
        sync, probe = self.sync, self._probe
        self.sync_s["prepare_s"] = self.supervised(lambda: sync.staged_or_prepare(version)).prepare_s
        self.staged_version = version
        if probe is not None:
            logprobs = self.trainer.execute_on(0).probe_logprobs  # rank 0's
            self.call_trainer(lambda: probe.expect(version, lambda sequences: logprobs(sequences).wait()[0]))

    def commit(self) -> None:
        """Pause → swap → verify → resume for the staged version, if any (staged again first if a
        replacement dropped it), between batches; then the receivers' log-probs of the probe, if
        any, checked against the trainer's."""
        if self.between_batches is not None and not self._between_done:
            self._between_done = True
            self.between_batches(self)
        version, sync, probe = self.staged_version, self.sync, self._probe
        if version is None or sync is None:
            return
        report = self.supervised(lambda: sync.commit_version(version))
        self.sync_s["pause_s"], self.sync_s["held_s"] = report.pause_s, report.held_s
        self.state.served_versions.append(sync.version)
        self.staged_version = None
        if probe is not None:
            self.logprob_mismatch = self.supervised(lambda: probe.check(version, sync.receivers))

    def probe(self, sequences: Sequences, tolerance: float) -> None:
        """From now on, the receivers' log-probs of ``sequences`` ((prompt, completion) token ids)
        must equal the trainer's (rank 0's ``probe_logprobs(sequences)``) within ``tolerance`` at
        every committed version: the record's ``logprob_mismatch``, else ``LogprobMismatchError``."""
        self._probe = LogprobProbe(sequences, tolerance)
