"""The GRPO objective (Shao et al. 2024, DeepSeekMath) as pure functions of tensors, plus batch collation.

GRPO replaces PPO's value function with a group baseline: each prompt is answered G times and a
completion's advantage is its reward relative to its own group. The policy term is PPO's clipped ratio
per token; a k3 estimate of KL(pi || pi_ref) keeps the policy near the warm start.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache

from .completion import Completion


@dataclass
class CompletionBatch:
    """Completions as padded tensors, with each distinct prompt stored (and run through the model) once.

    The G completions of a group share their prompt exactly, so the prompt's keys and values are
    computed once per group and gathered for every row: for two-digit addition (a 7-token prompt and
    3-4 answer tokens, G = 8) that is 2.2x fewer tokens through the forward and the backward.
    """

    prompt_ids: torch.Tensor  # [P, Lp] long, left-padded: every prompt ends at column Lp - 1
    prompt_mask: torch.Tensor  # [P, Lp] long
    group_index: torch.Tensor  # [R] long: the prompt row of each completion row
    completion_ids: torch.Tensor  # [R, Lc] long, right-padded
    mask: torch.Tensor  # [R, Lc] float, 1 on real completion tokens: the only ones the loss sees
    old_logprobs: torch.Tensor  # [R, Lc] float, log pi_sample of each token (0 off the mask)

    def __len__(self) -> int:
        return int(self.completion_ids.shape[0])

    def to(self, device: torch.device | str) -> CompletionBatch:
        return CompletionBatch(
            self.prompt_ids.to(device),
            self.prompt_mask.to(device),
            self.group_index.to(device),
            self.completion_ids.to(device),
            self.mask.to(device),
            self.old_logprobs.to(device),
        )

    def select(self, rows: torch.Tensor | slice) -> CompletionBatch:
        """A subset of the rows, keeping only the prompts they use."""
        group_index = self.group_index[rows]
        used, remapped = torch.unique(group_index, return_inverse=True)
        return CompletionBatch(
            self.prompt_ids[used],
            self.prompt_mask[used],
            remapped,
            self.completion_ids[rows],
            self.mask[rows],
            self.old_logprobs[rows],
        )


def collate(completions: Sequence[Completion], pad_id: int) -> CompletionBatch:
    """List of completions -> one padded batch; completions with identical prompt ids share a prompt row.

    Every completion needs at least one token (the engine always emits one), because the first
    completion token is the one predicted from the prompt's last position.
    """
    if not completions:
        raise ValueError("cannot collate an empty list of completions")
    prompt_rows: dict[tuple[int, ...], int] = {}
    group_index = []
    for i, c in enumerate(completions):
        if not c.completion_ids or not c.prompt_ids:
            raise ValueError(f"completion {i} has an empty prompt or completion")
        if len(c.logprobs) != len(c.completion_ids):
            raise ValueError(
                f"completion {i}: {len(c.logprobs)} log-probs for {len(c.completion_ids)} tokens"
            )
        group_index.append(prompt_rows.setdefault(tuple(c.prompt_ids), len(prompt_rows)))
    # Padded nested lists first, one tensor per field: per-row tensor writes cost more than the model
    # forward for a batch of 256 three-token completions.
    prompts = list(prompt_rows)
    lp = max(len(p) for p in prompts)
    lc = max(len(c.completion_ids) for c in completions)
    prompt_ids = torch.tensor([[pad_id] * (lp - len(p)) + list(p) for p in prompts], dtype=torch.long)
    prompt_mask = torch.tensor([[0] * (lp - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long)
    completion_ids = torch.tensor(
        [c.completion_ids + [pad_id] * (lc - len(c.completion_ids)) for c in completions], dtype=torch.long
    )
    mask = torch.tensor(
        [[1.0] * len(c.completion_ids) + [0.0] * (lc - len(c.completion_ids)) for c in completions],
        dtype=torch.float32,
    )
    old = torch.tensor(
        [c.logprobs + [0.0] * (lc - len(c.logprobs)) for c in completions], dtype=torch.float32
    )
    return CompletionBatch(prompt_ids, prompt_mask, torch.tensor(group_index), completion_ids, mask, old)


def _new_cache(model: nn.Module) -> DynamicCache:
    config = getattr(model, "config", None)
    if "config" in inspect.signature(DynamicCache.__init__).parameters:
        return DynamicCache(config=config)
    return DynamicCache()


def _cache_kwarg(model: nn.Module) -> str:
    """transformers 5 renamed past_key_values to cache (the old name still works, with a warning)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def completion_logprobs(model: nn.Module, batch: CompletionBatch, temperature: float = 1.0) -> torch.Tensor:
    """log pi(token | prompt, earlier tokens) for every completion token, [R, Lc] (valid where
    ``batch.mask``), differentiable.

    Two forwards: the distinct prompts once (their last position predicts each completion's first
    token), then all completion tokens against the prompts' cached keys and values, gathered per row.
    Divided by the sampling temperature so that, for unchanged weights, these equal the engine's
    log-probs and the first PPO ratio is exactly 1.
    """
    prompt_pos = (batch.prompt_mask.cumsum(-1) - 1).clamp(min=0)
    cache = _new_cache(model)
    kwarg = _cache_kwarg(model)
    first = model(
        input_ids=batch.prompt_ids,
        attention_mask=batch.prompt_mask,
        position_ids=prompt_pos,
        use_cache=True,
        logits_to_keep=1,
        **{kwarg: cache},
    ).logits[:, -1, :]
    first = first[batch.group_index]
    logits = [first[:, None, :]]
    lc = batch.completion_ids.shape[1]
    if lc > 1:
        cache.batch_select_indices(batch.group_index)
        inputs = batch.completion_ids[:, :-1]
        mask = torch.cat([batch.prompt_mask[batch.group_index], batch.mask[:, :-1].long()], dim=1)
        start = prompt_pos[batch.group_index, -1:] + 1
        positions = start + torch.arange(lc - 1, device=start.device)[None, :]
        rest = model(
            input_ids=inputs, attention_mask=mask, position_ids=positions, use_cache=True, **{kwarg: cache}
        )
        logits.append(rest.logits)
    logp = torch.log_softmax(torch.cat(logits, dim=1).float() / temperature, dim=-1)
    return logp.gather(-1, batch.completion_ids[:, :, None]).squeeze(-1)


@torch.no_grad()
def sequence_logprobs(
    model: nn.Module, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int
) -> list[list[float]]:
    """For each (prompt ids, completion ids): log pi(token | what precedes it) of every completion
    token at temperature 1 (the log-prob probe's definition, as the engines compute it)."""
    completions = [
        Completion("", list(prompt), list(completion), [0.0] * len(completion), True)
        for prompt, completion in sequences
    ]
    was_training = model.training
    model.eval()
    try:
        logp = completion_logprobs(model, collate(completions, pad_id))
    finally:
        model.train(was_training)
    return [row[: len(c.completion_ids)].tolist() for row, c in zip(logp, completions, strict=True)]


class CompletionScorer(nn.Module):
    """``completion_logprobs`` as one module call: what DistributedDataParallel wraps.

    The prefix-shared scorer runs the policy twice (prompts, then completions). DDP's contract is one
    forward per backward, and the scorer needs the policy's own ``forward`` signature and ``config``
    (which a DDP wrapper hides), so DDP wraps this module and the policy inside it stays a plain
    Hugging Face model. Holds no parameters of its own: ``policy`` is the trained model itself.
    """

    def __init__(self, policy: nn.Module, temperature: float = 1.0) -> None:
        super().__init__()
        self.policy = policy
        self.temperature = temperature

    def forward(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        group_index: torch.Tensor,
        completion_ids: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        batch = CompletionBatch(prompt_ids, prompt_mask, group_index, completion_ids, mask, mask)
        return completion_logprobs(self.policy, batch, self.temperature)

    def score(self, batch: CompletionBatch) -> torch.Tensor:
        return self(batch.prompt_ids, batch.prompt_mask, batch.group_index, batch.completion_ids, batch.mask)


def group_advantages(
    rewards: torch.Tensor | Sequence[float], group_size: int, eps: float = 1e-4
) -> torch.Tensor:
    """(r - group mean) / (group std + eps) for consecutive groups of ``group_size``.

    A group whose members all scored the same gets advantage 0: it says nothing about which answer is
    better, and it costs nothing but compute. The population std (not Bessel-corrected) keeps a group of
    G with a single success at a bounded advantage, sqrt(G - 1).
    """
    r = torch.as_tensor(rewards, dtype=torch.float32)
    if r.ndim != 1 or group_size < 1 or r.numel() % group_size:
        raise ValueError(f"{tuple(r.shape)} rewards do not split into groups of {group_size}")
    groups = r.view(-1, group_size)
    centred = groups - groups.mean(dim=1, keepdim=True)
    return (centred / (groups.std(dim=1, unbiased=False, keepdim=True) + eps)).view(-1)


@dataclass
class GRPOLoss:
    """The scalar to minimise plus the diagnostics that say whether the update was sane."""

    total: torch.Tensor
    policy: torch.Tensor  # the clipped surrogate, negated
    kl: torch.Tensor  # k3 estimate of KL(pi || pi_ref), token mean
    clip_frac: torch.Tensor  # fraction of completion tokens whose ratio left [1 - eps, 1 + eps]
    ratio_mean: torch.Tensor  # should sit at ~1: far from it means the samples are stale


def masked_sequence_mean(
    values: torch.Tensor, mask: torch.Tensor, num_sequences: float | None = None
) -> torch.Tensor:
    """Token mean within each sequence, then mean over sequences: every completion weighs the same,
    however long it is (GRPO's normalisation). ``num_sequences`` overrides the divisor when the rows
    given are a subset of the batch the mean is over (the rest contributing zero)."""
    per_seq = (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
    return per_seq.sum() / (per_seq.numel() if num_sequences is None else num_sequences)


def grpo_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    kl_coef: float,
    num_sequences: float | None = None,
) -> GRPOLoss:
    """All log-prob tensors are [B, T]; ``advantages`` is [B] (one per sequence, broadcast over tokens).
    ``num_sequences``: see ``masked_sequence_mean``.

    The k3 estimator exp(ref - new) - (ref - new) - 1 is unbiased for KL(pi || ref) under samples from pi,
    always >= 0, and far lower-variance than the naive log-ratio.
    """
    mask = mask.float()
    ratio = torch.exp(new_logprobs - old_logprobs)
    adv = advantages[:, None]
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * adv)
    policy = -masked_sequence_mean(surrogate, mask, num_sequences)
    log_ref_ratio = ref_logprobs - new_logprobs
    kl = masked_sequence_mean(torch.exp(log_ref_ratio) - log_ref_ratio - 1.0, mask, num_sequences)
    total = policy + kl_coef * kl if kl_coef else policy
    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        clipped = ((ratio - 1.0).abs() > clip_eps).float()
        clip_frac = (clipped * mask).sum() / n
        ratio_mean = (ratio * mask).sum() / n
    return GRPOLoss(total, policy.detach(), kl.detach(), clip_frac, ratio_mean)
