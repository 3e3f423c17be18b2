"""Rollout collection: the loop that the distributed job splits between inference and env workers."""

from __future__ import annotations

import numpy as np
import torch

from .buffer import RolloutBatch, RolloutBuffer
from .config import PPOConfig
from .envs import VectorEnv
from .policy import ActorCritic


class RolloutCollector:
    """Keeps the envs' current observation across rollouts, so episodes continue through rollout
    boundaries instead of being reset (and biased towards early-episode states) every iteration."""

    def __init__(self, envs: VectorEnv, policy: ActorCritic, config: PPOConfig) -> None:
        self.envs = envs
        self.policy = policy
        self.config = config
        self.buffer = RolloutBuffer(config.num_steps, envs.num_envs, envs.obs_dim)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.obs = envs.reset()

    def collect(self, weight_version: int) -> RolloutBatch:
        """Run `num_steps` vector steps with the current policy and return the GAE-ready batch."""
        for _ in range(self.config.num_steps):
            self._step()
        last_value = self.policy.value(self.obs)
        cfg = self.config
        return self.buffer.finish(last_value, cfg.gamma, cfg.gae_lambda, weight_version)

    def _step(self) -> None:
        out = self.policy.act(self.obs, self.generator)
        step = self.envs.step(out.action)
        final_value = np.zeros(self.envs.num_envs, dtype=np.float32)
        if step.truncated.any():  # only truncations bootstrap; skip the extra forward pass otherwise
            final_value = self.policy.value(step.final_obs)
        self.buffer.add(
            self.obs,
            out.action,
            out.logprob,
            out.value,
            step.reward,
            step.terminated,
            step.truncated,
            final_value,
        )
        self.obs = step.obs
