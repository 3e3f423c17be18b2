"""The GRPO update: one or more gradient steps from one batch of scored completions, alone or as one
rank of a data-parallel group.

Kept apart from the loop so the distributed job can drive it from learner actors: it needs only
completions and their rewards, never the engine or the task.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from transformers import PreTrainedModel

from .completion import Completion
from .config import GRPOConfig
from .grpo import CompletionBatch, CompletionScorer, collate, completion_logprobs, group_advantages, grpo_loss

METRICS = ("loss", "policy_loss", "kl", "clip_frac", "ratio_mean", "grad_norm")


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def frozen_copy(model: nn.Module) -> nn.Module:
    """The KL reference: a snapshot that no optimiser step or weight swap can reach."""
    ref = copy.deepcopy(model)
    ref.eval()
    ref.requires_grad_(False)
    return ref


class Learner:
    """Holds the policy, the frozen reference, the optimiser and the weight version.

    Under an initialised process group the policy (inside its ``CompletionScorer``) is wrapped in
    DistributedDataParallel (which broadcasts rank 0's weights at construction), each rank trains on
    its strided shard of the same batch, and gradients are averaged, so the replicas stay identical.
    Advantages are computed over the whole batch before sharding, so a group's baseline never depends
    on how it was split.
    """

    def __init__(
        self, policy: PreTrainedModel, config: GRPOConfig, reference: nn.Module | None = None
    ) -> None:
        self.policy = policy
        self.config = config
        self.reference = reference if reference is not None else frozen_copy(policy)
        self.rank, self.world_size = _world()
        pad = policy.config.pad_token_id
        if pad is None:
            raise ValueError("the policy's config has no pad_token_id")
        self.pad_id = int(pad)
        self.scorer = CompletionScorer(policy, config.temperature)
        self.model: nn.Module = self.scorer
        if self.world_size > 1:
            from torch.nn.parallel import DistributedDataParallel

            self.model = DistributedDataParallel(self.scorer)
        self.params = [p for p in policy.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=config.learning_rate,
            betas=(0.9, config.adam_beta2),
            weight_decay=config.weight_decay,
        )
        self.weight_version = 0
        self.updates = 0

    def current_lr(self) -> float:
        """Linear ramp over the first lr_warmup_updates: Adam's first steps move every weight by about
        lr regardless of the gradient's size, which at full lr knocks the warm start off its optimum."""
        cfg = self.config
        step = self.updates + 1
        if step < cfg.lr_warmup_updates:
            return cfg.learning_rate * step / cfg.lr_warmup_updates
        span = max(cfg.updates - cfg.lr_warmup_updates, 1)
        frac = min(1.0, max(0.0, (step - cfg.lr_warmup_updates) / span))
        return cfg.learning_rate * (1.0 - frac * (1.0 - cfg.lr_end_factor))

    def shard(self, batch: CompletionBatch, advantages: torch.Tensor) -> tuple[CompletionBatch, torch.Tensor]:
        """This rank's rows. Strided, so each rank sees every part of the batch."""
        index = slice(self.rank, None, self.world_size)
        return batch.select(index), advantages[index]

    def update(self, completions: Sequence[Completion], rewards: Sequence[float]) -> dict[str, float]:
        """One GRPO update from one batch of scored completions (grouped, group_size consecutive rows
        per prompt, as the engine returns them); bumps ``weight_version``. Metrics are rank-averaged."""
        cfg = self.config
        lr = self.current_lr()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if len(completions) != len(rewards):
            raise ValueError(f"{len(completions)} completions but {len(rewards)} rewards")
        device = next(self.policy.parameters()).device
        advantages = group_advantages(rewards, cfg.group_size).to(device)
        batch, adv = self.shard(collate(completions, self.pad_id).to(device), advantages)
        rows = len(batch)
        informative = float((adv != 0).float().mean()) if rows else 0.0
        if cfg.kl_coef == 0:
            batch, adv = self._informative_rows(batch, adv)
        ref_logprobs = None
        if cfg.kl_coef:
            with torch.no_grad():
                ref_logprobs = completion_logprobs(self.reference, batch, cfg.temperature)
        self.policy.train()
        sums = torch.zeros(len(METRICS))
        for _ in range(cfg.steps_per_update):
            sums += self._step(batch, adv, ref_logprobs, rows)
        self.weight_version += 1
        self.updates += 1
        metrics = dict(
            zip(METRICS, self._average_over_ranks(sums / cfg.steps_per_update).tolist(), strict=True)
        )
        informative = float(self._average_over_ranks(torch.tensor([informative]))[0])
        return metrics | {
            "weight_version": float(self.weight_version),
            "informative_frac": informative,
            "lr": lr,
        }

    @staticmethod
    def _informative_rows(batch: CompletionBatch, adv: torch.Tensor) -> tuple[CompletionBatch, torch.Tensor]:
        """Without a KL term, a row with zero advantage (its whole group scored alike) contributes
        exactly zero gradient; dropping it before the forward saves its compute and changes nothing,
        since the loss still divides by the full row count. One row is always kept (its advantage is
        0 anyway) so that every DDP rank runs a backward and the gradient all-reduce cannot hang."""
        keep = (adv != 0).nonzero().squeeze(-1)
        if keep.numel() == 0:
            keep = torch.zeros(1, dtype=torch.long, device=adv.device)
        return batch.select(keep), adv[keep]

    def _step(
        self, batch: CompletionBatch, adv: torch.Tensor, ref_logprobs: torch.Tensor | None, rows: int
    ) -> torch.Tensor:
        cfg = self.config
        b = batch
        new_logprobs = self.model(b.prompt_ids, b.prompt_mask, b.group_index, b.completion_ids, b.mask)
        ref = new_logprobs.detach() if ref_logprobs is None else ref_logprobs  # kl_coef == 0: KL unused
        out = grpo_loss(
            new_logprobs,
            batch.old_logprobs,
            ref,
            adv,
            batch.mask,
            cfg.clip_eps,
            cfg.kl_coef,
            num_sequences=rows,
        )
        self.optimizer.zero_grad(set_to_none=True)
        out.total.backward()  # under DDP, this also averages the gradients across ranks
        grad_norm = nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm)
        self.optimizer.step()
        parts = (out.total, out.policy, out.kl, out.clip_frac, out.ratio_mean, grad_norm)
        return torch.stack([p.detach().float() for p in parts]).cpu()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Detached CPU copies of the policy weights: what gets published to rollout engines."""
        return {k: v.detach().cpu().clone() for k, v in self.policy.state_dict().items()}

    def _average_over_ranks(self, values: torch.Tensor) -> torch.Tensor:
        """Metrics from one rank describe only its shard; averaging makes the logged numbers global."""
        if self.world_size > 1:
            # NCCL reduces device tensors only; gloo takes the CPU tensor as it is.
            device = next(self.policy.parameters()).device if dist.get_backend() == "nccl" else "cpu"
            values = values.to(device)
            dist.all_reduce(values, op=dist.ReduceOp.SUM)
            values = values.cpu() / self.world_size
        return values
