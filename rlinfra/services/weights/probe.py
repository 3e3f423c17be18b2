"""The check no weight barrier makes by itself: the engine computes what the trainer computes.

Checksums prove that the engine holds the trainer's bytes under the trainer's names; they cannot
prove that the engine *uses* them as the trainer does (a fused parameter sliced in the wrong
order, a stale cache, a kernel with other numerics: RL users watch this as training-inference
mismatch). A ``LogprobProbe`` is a fixed batch of token sequences. When a version is staged, the
trainer's log-probs of the probe under that version are recorded (``expect``); once the version is
committed, every engine's log-probs of the same tokens are compared with them (``check``): the
largest difference is the update's ``logprob_mismatch``, and one above ``tolerance`` fails the
update with ``LogprobMismatchError`` naming the engine rank, the version and the token.

Trainers implement ``logprobs(sequences)`` on the role that holds the policy; engines implement
``EngineReceiver.engine_logprobs(sequences)``. Sequences are (prompt ids, completion ids); log-probs
are of the completion's tokens given what precedes them, at temperature 1.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rlinfra.runtime.group import WorkerGroup
from rlinfra.services.weights.buffers import WeightsVerifyError
from rlinfra.services.weights.engine import EngineReceiver

Sequences = Sequence[tuple[Sequence[int], Sequence[int]]]
DEFAULT_TOLERANCE = 1e-3  # float32 engines agree with the trainer to ~1e-6; a wrong version is off by >0.01


class LogprobMismatchError(WeightsVerifyError):
    """An engine's log-probs of the probe differ from the trainer's under the version it serves."""


@dataclass
class LogprobProbe:
    """A fixed probe batch and the trainer's log-probs of it, per staged version."""

    sequences: Sequences
    tolerance: float = DEFAULT_TOLERANCE
    expected: dict[int, list[list[float]]] = field(default_factory=dict)

    def expect(self, version: int, trainer_logprobs: Callable[[Sequences], list[list[float]]]) -> None:
        """Record the trainer's log-probs of the probe for ``version`` (its weights are ``version``
        now); older versions are forgotten."""
        self.expected = {version: trainer_logprobs(self.sequences)}

    def check(self, version: int, engines: WorkerGroup, ranks: Sequence[int] | None = None) -> float:
        """Every engine's (or ``ranks``') log-probs of the probe at ``version`` against the
        trainer's; returns the largest absolute difference, raises above ``tolerance``."""
        wanted = self.expected.get(version)
        if wanted is None:
            raise ValueError(f"no trainer log-probs recorded for version {version} (expect() first)")
        chosen = engines.ranks if ranks is None else list(ranks)
        answers = engines.call(EngineReceiver.engine_logprobs, chosen, args=(self.sequences,)).wait()
        worst, where = 0.0, ""
        for rank, got in zip(chosen, answers, strict=True):
            for index, (engine_row, trainer_row) in enumerate(zip(got, wanted, strict=True)):
                if len(engine_row) != len(trainer_row):
                    raise LogprobMismatchError(
                        f"{engines.name}:{rank} gave {len(engine_row)} log-probs for probe sequence "
                        f"{index}, the trainer {len(trainer_row)}"
                    )
                for token, (a, b) in enumerate(zip(engine_row, trainer_row, strict=True)):
                    if abs(a - b) > worst:
                        worst, where = abs(a - b), f"{engines.name}:{rank}, sequence {index}, token {token}"
        if worst > self.tolerance:
            raise LogprobMismatchError(
                f"version {version}: the engine's log-probs of the probe differ from the trainer's by "
                f"{worst:.3g} at {where} (tolerance {self.tolerance:g}): the engine does not compute "
                "what the trainer computes with the weights it was given"
            )
        return worst
