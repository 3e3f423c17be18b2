"""The rollout side of GRPO: sample groups of completions, score them, and measure held-out accuracy.

Everything here needs only a GenerationEngine and the task, which is what a rollout actor holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .completion import Completion
from .engine import GenerationEngine
from .task import PromptSampler, exact_match, score


@dataclass
class ScoredBatch:
    """One update's worth of experience: prompts_per_step groups of group_size completions, in order."""

    completions: list[Completion]
    rewards: list[float]
    group_size: int

    @property
    def mean_reward(self) -> float:
        return sum(self.rewards) / max(len(self.rewards), 1)

    @property
    def mean_length(self) -> float:
        return sum(len(c.completion_ids) for c in self.completions) / max(len(self.completions), 1)


def sample_seed(seed: int, step: int) -> int:
    """A distinct, reproducible sampling seed per (run seed, step), independent of call order."""
    return (seed * 1_000_003 + step) % (2**63 - 1)


def collect(
    engine: GenerationEngine,
    sampler: PromptSampler,
    prompts_per_step: int,
    group_size: int,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    format_credit: float = 0.0,
) -> ScoredBatch:
    """Draw prompts, sample group_size completions for each, score them."""
    prompts = sampler.sample(prompts_per_step)
    completions = engine.generate(prompts, group_size, max_new_tokens, temperature=temperature, seed=seed)
    return ScoredBatch(completions, score(completions, format_credit), group_size)


def evaluate(engine: GenerationEngine, prompts: Sequence[str], max_new_tokens: int) -> float:
    """Greedy exact match: the deterministic answer is the policy's answer, free of sampling noise."""
    completions = engine.generate(prompts, 1, max_new_tokens, greedy=True)
    return exact_match(prompts, [c.text for c in completions], [c.finished for c in completions])
