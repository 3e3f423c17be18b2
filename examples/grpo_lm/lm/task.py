"""The synthetic task: two-digit addition ("23+45=" -> "68", "07+45=" -> "52") with a rule-based reward.

The operands range over 0..99, so the 10,000 ordered pairs split once, by a fixed permutation that
does not depend on any run seed, into a held-out *test* split (the accuracy curve every run reports),
a *validation* split (used only to stop the supervised warm-up), and the *train* split (the only
prompts any training ever sees). Fixed splits make accuracies comparable across seeds and runs, and
disjointness makes them measure generalisation rather than memorisation.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import cache

from .completion import Completion

MAX_OPERAND = 99
SPLIT_SEED = 20240607  # fixed forever: changing it changes what "held-out accuracy" means
TEST_SIZE = 500
VAL_SIZE = 500
MAX_ANSWER_DIGITS = len(str(2 * MAX_OPERAND))

Pair = tuple[int, int]


def format_prompt(a: int, b: int) -> str:
    """Operands always written with two digits ("07+45="): each digit then sits at a fixed position, so
    the model can learn *which* positions to add instead of first having to find them. With
    variable-width operands the same model learns the units digit several times more slowly."""
    return f"{a:02d}+{b:02d}="


def parse_prompt(prompt: str) -> Pair:
    """Inverse of format_prompt; the reward recomputes the answer from the prompt, so there is no label
    to get out of sync with the text."""
    if not prompt.endswith("="):
        raise ValueError(f"not an addition prompt (no trailing '='): {prompt!r}")
    left, sep, right = prompt[:-1].partition("+")
    if not sep or not left.isdigit() or not right.isdigit():
        raise ValueError(f"not an addition prompt 'aa+bb=': {prompt!r}")
    return int(left), int(right)


def answer(prompt: str) -> str:
    a, b = parse_prompt(prompt)
    return str(a + b)


@cache
def _splits() -> tuple[tuple[Pair, ...], tuple[Pair, ...], tuple[Pair, ...]]:
    pairs = [(a, b) for a in range(MAX_OPERAND + 1) for b in range(MAX_OPERAND + 1)]
    random.Random(SPLIT_SEED).shuffle(pairs)
    test = tuple(pairs[:TEST_SIZE])
    val = tuple(pairs[TEST_SIZE : TEST_SIZE + VAL_SIZE])
    train = tuple(pairs[TEST_SIZE + VAL_SIZE :])
    return train, val, test


def train_pairs() -> tuple[Pair, ...]:
    return _splits()[0]


def heldout_prompts(n: int | None = None) -> list[str]:
    """The first n prompts of the fixed test split (all of it by default): a prefix, so a smaller eval
    is a subset of a larger one and curves of different eval sizes stay comparable."""
    test = _splits()[2]
    return [format_prompt(a, b) for a, b in test[: len(test) if n is None else n]]


def validation_prompts(n: int | None = None) -> list[str]:
    val = _splits()[1]
    return [format_prompt(a, b) for a, b in val[: len(val) if n is None else n]]


class PromptSampler:
    """A seeded stream of training prompts (uniform over the train split, with replacement).

    Its own random.Random, so the prompt stream depends on the seed alone and not on how much torch
    randomness the model, the sampler or the optimiser consumed in between. A string seed gives a
    stream unrelated to every integer seed's (random.Random hashes strings).
    """

    def __init__(self, seed: int | str) -> None:
        self._rng = random.Random(seed)
        self._pairs = train_pairs()

    def sample(self, n: int) -> list[str]:
        return [format_prompt(*self._rng.choice(self._pairs)) for _ in range(n)]


def reward(prompt: str, completion_text: str, finished: bool = True, format_credit: float = 0.0) -> float:
    """1.0 for the exact answer followed by <eos>, else 0.0.

    ``format_credit`` (default 0: the warm-started policy is always well formed, so it buys nothing) is
    a small reward for a wrong but well-formed answer (1-3 digits, then <eos>); it must stay well below
    1 so that being right always dominates looking right. An unfinished completion earns nothing: the
    answer must be committed to, or a run of digits cut off by max_new_tokens could match by accident.
    """
    if not finished:
        return 0.0
    if completion_text == answer(prompt):
        return 1.0
    well_formed = completion_text.isdigit() and len(completion_text) <= MAX_ANSWER_DIGITS
    return format_credit if well_formed else 0.0


def score(completions: Sequence[Completion], format_credit: float = 0.0) -> list[float]:
    """``reward`` of each completion."""
    return [reward(c.prompt, c.text, c.finished, format_credit) for c in completions]


def exact_match(
    prompts: Sequence[str], completion_texts: Sequence[str], finished: Sequence[bool] | None = None
) -> float:
    """Fraction of prompts answered exactly: the held-out metric. Texts exclude the trailing <eos>;
    with ``finished`` given, a completion that never emitted <eos> counts as wrong, as in the reward."""
    done = [True] * len(prompts) if finished is None else list(finished)
    if not len(prompts) == len(completion_texts) == len(done):
        raise ValueError(f"{len(prompts)} prompts, {len(completion_texts)} completions, {len(done)} flags")
    if not prompts:
        return 0.0
    hits = sum(reward(p, t, f) == 1.0 for p, t, f in zip(prompts, completion_texts, done, strict=True))
    return hits / len(prompts)
