"""Trajectory storage and GAE, with the formats that cross process boundaries: the version-stamped
batch and one inference call's answer. numpy only (no torch), so an env worker's process starts
without importing torch."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


class PolicyOutput(NamedTuple):
    """What the environment side needs from one inference call; numpy so it crosses processes cheaply."""

    action: np.ndarray  # [N] int64
    logprob: np.ndarray  # [N] float32, log pi_old(a|s), needed for the PPO ratio
    value: np.ndarray  # [N] float32, V(s), needed for GAE


def compute_gae(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    dones: np.ndarray,
    gamma: float,
    gae_lambda: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimation (Schulman et al. 2016) over time-major [T, N] arrays.

    `next_values[t]` is V of the state that followed step t *in the same episode*: 0 after a
    termination (there is no future), V(final_obs) after a truncation (the future exists, we just
    stopped watching). `dones` only cuts the recursion so one episode's advantage never leaks into
    the next. Keeping the two apart is what stops the 500-step time limit from looking like failure.
    """
    advantages = np.zeros_like(rewards, dtype=np.float32)
    running = np.zeros(rewards.shape[1:], dtype=np.float32)
    for t in reversed(range(rewards.shape[0])):
        delta = rewards[t] + gamma * next_values[t] - values[t]
        running = delta + gamma * gae_lambda * (1.0 - dones[t]) * running
        advantages[t] = running
    return advantages, advantages + values


@dataclass
class RolloutBatch:
    """One rollout of `num_envs` envs for `num_steps` steps, time-major, ready for the learner.

    `weight_version` is the policy version that produced the actions; the distributed trainer uses
    it to drop batches that are too off-policy for the PPO ratio to be trusted.
    """

    obs: np.ndarray  # [T, N, obs_dim] float32
    actions: np.ndarray  # [T, N] int64
    logprobs: np.ndarray  # [T, N] float32
    values: np.ndarray  # [T, N] float32
    rewards: np.ndarray  # [T, N] float32
    terminated: np.ndarray  # [T, N] bool
    truncated: np.ndarray  # [T, N] bool
    advantages: np.ndarray  # [T, N] float32
    returns: np.ndarray  # [T, N] float32
    weight_version: int
    batch_ids: tuple[str, ...] = ()  # the driver's ids of the rollouts joined here (one each)

    @property
    def num_transitions(self) -> int:
        return int(self.actions.size)

    def staleness(self, current_version: int) -> int:
        """How many learner updates happened since these actions were sampled."""
        return current_version - self.weight_version

    @classmethod
    def concat(cls, batches: list[RolloutBatch]) -> RolloutBatch:
        """Join rollouts of several env workers along the env axis. They must come from one weight
        version: a batch that mixes versions has no single behaviour policy for the PPO ratio."""
        versions = sorted({batch.weight_version for batch in batches})
        if len(versions) != 1:
            raise ValueError(f"cannot join rollouts of different weight versions {versions}")
        names = [f.name for f in dataclasses.fields(cls) if f.name not in ("weight_version", "batch_ids")]
        arrays = {name: np.concatenate([getattr(batch, name) for batch in batches], axis=1) for name in names}
        ids = tuple(batch_id for batch in batches for batch_id in batch.batch_ids)
        return cls(**arrays, weight_version=versions[0], batch_ids=ids)


class RolloutBuffer:
    """Fixed-size [T, N] storage filled step by step; preallocated so collection does no allocation."""

    def __init__(self, num_steps: int, num_envs: int, obs_dim: int) -> None:
        shape = (num_steps, num_envs)
        self.obs = np.zeros((*shape, obs_dim), dtype=np.float32)
        self.actions = np.zeros(shape, dtype=np.int64)
        self.logprobs = np.zeros(shape, dtype=np.float32)
        self.values = np.zeros(shape, dtype=np.float32)
        self.rewards = np.zeros(shape, dtype=np.float32)
        self.terminated = np.zeros(shape, dtype=bool)
        self.truncated = np.zeros(shape, dtype=bool)
        self.final_values = np.zeros(shape, dtype=np.float32)
        self.step = 0

    def add(
        self,
        obs: np.ndarray,
        action: np.ndarray,
        logprob: np.ndarray,
        value: np.ndarray,
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        final_value: np.ndarray,
    ) -> None:
        """Record one vector step. `final_value` is V(final_obs) for envs that just ended (any value
        elsewhere is ignored); it must be computed now, before the autoreset obs replaces it."""
        t = self.step
        self.obs[t], self.actions[t], self.logprobs[t], self.values[t] = obs, action, logprob, value
        self.rewards[t], self.terminated[t], self.truncated[t] = reward, terminated, truncated
        self.final_values[t] = final_value
        self.step += 1

    def next_values(self, last_value: np.ndarray) -> np.ndarray:
        """V(s_{t+1}) within each episode: the next stored value, except at episode ends (bootstrap
        from the final obs on truncation, 0 on termination; termination wins if both are set)."""
        following = np.concatenate([self.values[1:], last_value[None]], axis=0)
        done = self.terminated | self.truncated
        following = np.where(done, self.final_values, following)
        return np.where(self.terminated, 0.0, following).astype(np.float32)

    def finish(
        self, last_value: np.ndarray, gamma: float, gae_lambda: float, weight_version: int
    ) -> RolloutBatch:
        """Close the rollout; `last_value` is V of the obs after the final step (bootstraps the cut)."""
        assert self.step == self.actions.shape[0], "rollout is not full"
        dones = (self.terminated | self.truncated).astype(np.float32)
        advantages, returns = compute_gae(
            self.rewards, self.values, self.next_values(last_value), dones, gamma, gae_lambda
        )
        self.step = 0
        return RolloutBatch(
            obs=self.obs.copy(),
            actions=self.actions.copy(),
            logprobs=self.logprobs.copy(),
            values=self.values.copy(),
            rewards=self.rewards.copy(),
            terminated=self.terminated.copy(),
            truncated=self.truncated.copy(),
            advantages=advantages,
            returns=returns,
            weight_version=weight_version,
        )
