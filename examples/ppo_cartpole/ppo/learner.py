"""The PPO update: minibatch epochs over one rollout, alone or as one rank of a data-parallel group."""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from .buffer import RolloutBatch
from .config import PPOConfig
from .loss import PPOLoss, normalize, ppo_loss
from .policy import ActorCritic

METRICS = ("loss", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_frac", "grad_norm")


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class Learner:
    """Owns the optimiser and the weight version. Under an initialised process group every rank
    starts from rank 0's weights, trains on its own shard of the same batch, and averages gradients
    before each step, so the replicas stay bit-identical.

    ``config.data_parallel`` picks how gradients are averaged: ``"ddp"`` wraps the policy in
    torch's DistributedDataParallel (which also broadcasts rank 0's parameters at construction);
    ``"allreduce"`` does one flat all-reduce per step by hand — for a 10k-parameter MLP, DDP's
    bucketing and overlap buy nothing, while its constructor imports torch._dynamo (2-3 s per rank
    on a small CPU box). Both give the same averaged step.
    """

    def __init__(self, policy: ActorCritic, config: PPOConfig) -> None:
        if config.data_parallel not in ("ddp", "allreduce"):
            raise ValueError(f"algo.data_parallel must be 'ddp' or 'allreduce', got {config.data_parallel!r}")
        self.policy = policy
        self.config = config
        self.rank, self.world_size = _world()
        self.params = list(policy.parameters())
        self.model: nn.Module = policy
        self.ddp = self.world_size > 1 and config.data_parallel == "ddp"
        if self.ddp:
            from torch.nn.parallel import DistributedDataParallel

            self.model = DistributedDataParallel(policy)
        elif self.world_size > 1:
            self._broadcast_from_rank0()
        # eps=1e-5 rather than 1e-8: Adam's default over-amplifies tiny early gradients in PPO.
        self.optimizer = torch.optim.Adam(self.params, lr=config.learning_rate, eps=1e-5)
        self.weight_version = 0  # the version number the weights are published under
        self.updates = 0  # updates applied to these weights (equal to the version unless re-published)

    def current_lr(self) -> float:
        """Linear decay to a floor: large early steps learn fast, small late steps stop the policy
        from unlearning once it balances for the full 500 steps."""
        cfg = self.config
        if not cfg.anneal_lr:
            return cfg.learning_rate
        frac = max(cfg.lr_floor, 1.0 - self.updates / cfg.anneal_iterations)
        return cfg.learning_rate * frac

    def shard(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """This rank's slice. Strided, so each rank sees every env and every part of the rollout."""
        return {k: v[self.rank :: self.world_size] for k, v in flatten(batch).items()}

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        """One PPO update from one rollout; bumps `weight_version`. Returns rank-averaged metrics."""
        lr = self.current_lr()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        data = self.shard(batch)
        sums = torch.zeros(len(METRICS))
        steps = 0
        for _ in range(self.config.update_epochs):
            perm = torch.randperm(data["actions"].shape[0])
            for idx in perm.tensor_split(self.config.num_minibatches):
                sums += self._step({k: v[idx] for k, v in data.items()})
                steps += 1
        self.weight_version += 1
        self.updates += 1
        metrics = dict(zip(METRICS, self._average_over_ranks(sums / steps).tolist(), strict=True))
        return metrics | {"lr": lr, "weight_version": float(self.weight_version)}

    def _step(self, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        """One gradient step. Gradients are averaged across ranks before clipping, so every rank clips
        the same global gradient and takes the same step."""
        cfg = self.config
        new_logprob, entropy, new_value = self.model(mb["obs"], mb["actions"])
        adv = normalize(mb["advantages"]) if cfg.norm_adv else mb["advantages"]
        out: PPOLoss = ppo_loss(
            new_logprob,
            mb["logprobs"],
            adv,
            new_value,
            mb["returns"],
            entropy,
            cfg.clip_coef,
            cfg.vf_coef,
            cfg.ent_coef,
        )
        self.optimizer.zero_grad(set_to_none=True)
        out.total.backward()  # under DDP, this also averages the gradients across ranks
        if self.world_size > 1 and not self.ddp:
            self._average_gradients()
        grad_norm = nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm)
        self.optimizer.step()
        parts = (out.total, out.policy, out.value, out.entropy, out.approx_kl, out.clip_frac, grad_norm)
        return torch.stack([p.detach().float() for p in parts])

    def _broadcast_from_rank0(self) -> None:
        """Identical starting points are what make identical averaged steps keep replicas equal."""
        with torch.no_grad():
            for p in self.params:
                dist.broadcast(p, src=0)

    def _average_gradients(self) -> None:
        """One flat all-reduce instead of one per tensor: on gloo the per-call latency dominates."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat /= self.world_size
        for p, chunk in zip(self.params, flat.split([g.numel() for g in grads]), strict=True):
            p.grad = chunk.view_as(p)

    def _average_over_ranks(self, values: torch.Tensor) -> torch.Tensor:
        """Metrics from one rank describe only its shard; averaging makes the logged numbers global."""
        if self.world_size > 1:
            dist.all_reduce(values, op=dist.ReduceOp.SUM)
            values /= self.world_size
        return values


def flatten(batch: RolloutBatch) -> dict[str, torch.Tensor]:
    """Merge time and env axes: PPO's minibatch epochs treat transitions as i.i.d."""
    fields = {
        "obs": batch.obs,
        "actions": batch.actions,
        "logprobs": batch.logprobs,
        "values": batch.values,
        "advantages": batch.advantages,
        "returns": batch.returns,
    }
    return {k: torch.from_numpy(np.ascontiguousarray(v)).flatten(0, 1) for k, v in fields.items()}
