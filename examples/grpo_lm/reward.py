"""The GRPO job's reward workers (the ``reward`` component, one per node): the task's rule applied
to completions. A module of its own that imports neither torch nor transformers, so a reward
worker's process starts in a fraction of an engine's time (it only unpickles ``Completion``s)."""

from __future__ import annotations

from collections.abc import Sequence

from examples.grpo_lm.lm.completion import Completion
from examples.grpo_lm.lm.task import score
from rlinfra import Worker


class RewardWorker(Worker):
    """Scores completions with the task's rule (exact answer, then ``<eos>``)."""

    def __init__(self, format_credit: float) -> None:
        self.format_credit = format_credit

    def score(self, completions: Sequence[Completion]) -> list[float]:
        return score(completions, self.format_credit)
