"""The PPO objective (Schulman et al. 2017, eq. 7 and 9), as pure functions of tensors."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PPOLoss:
    """The scalar to minimise plus the diagnostics that tell whether the update was sane."""

    total: torch.Tensor
    policy: torch.Tensor
    value: torch.Tensor
    entropy: torch.Tensor
    approx_kl: torch.Tensor  # large values mean the policy moved further than the clip intends
    clip_frac: torch.Tensor  # fraction of samples whose ratio left [1 - clip, 1 + clip]


def normalize(advantages: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Zero-mean, unit-std advantages make the step size independent of the reward scale."""
    return (advantages - advantages.mean()) / (advantages.std() + eps)


def clipped_policy_loss(ratio: torch.Tensor, advantages: torch.Tensor, clip_coef: float) -> torch.Tensor:
    """L^CLIP, negated: the pessimistic min removes any incentive to push the ratio outside the clip
    range in the direction the advantage rewards, which is the whole trust-region substitute."""
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_coef, 1.0 + clip_coef) * advantages
    return -torch.min(unclipped, clipped).mean()


def ppo_loss(
    new_logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    new_value: torch.Tensor,
    returns: torch.Tensor,
    entropy: torch.Tensor,
    clip_coef: float,
    vf_coef: float,
    ent_coef: float,
) -> PPOLoss:
    """Policy + value + entropy, combined into one scalar so one backward pass serves both heads."""
    log_ratio = new_logprob - old_logprob
    ratio = log_ratio.exp()
    policy = clipped_policy_loss(ratio, advantages, clip_coef)
    value = 0.5 * (new_value - returns).pow(2).mean()
    ent = entropy.mean()
    with torch.no_grad():
        approx_kl = ((ratio - 1.0) - log_ratio).mean()  # low-variance estimator (Schulman, "k3")
        clip_frac = ((ratio - 1.0).abs() > clip_coef).float().mean()
    total = policy + vf_coef * value - ent_coef * ent
    return PPOLoss(total, policy.detach(), value.detach(), ent.detach(), approx_kl, clip_frac)
