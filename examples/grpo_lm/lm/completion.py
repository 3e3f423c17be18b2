"""``Completion``: one sampled completion, as it travels from an engine to the reward workers and
the learner. Plain data in a module of its own, importing neither torch nor transformers, so that
a process that only scores completions (a reward worker) does not pay for importing them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Completion:
    """One sampled completion and what the learner needs to score and train on it."""

    prompt: str
    prompt_ids: list[int]  # as the model saw them, without padding (starts with <bos>)
    completion_ids: list[int]  # without padding; ends with <eos> iff finished
    logprobs: list[float]  # log pi_sample(token | prefix) per completion token, same length
    finished: bool  # emitted <eos> within max_new_tokens
    text: str = ""  # decoded completion without the trailing <eos>; other special tokens kept verbatim
    weight_version: int = 0  # version of the weights that sampled it (staleness bookkeeping)
    extra: dict[str, float] = field(default_factory=dict)  # room for reward etc. downstream
