"""N gymnasium envs stepped in lockstep, with the episode bookkeeping PPO's logging needs."""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv


class VecStep(NamedTuple):
    """One vector step. `obs` already belongs to the next episode where `done`; `final_obs` holds the
    observation that episode actually ended on (equal to `obs` elsewhere), needed to bootstrap."""

    obs: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: np.ndarray

    @property
    def done(self) -> np.ndarray:
        return self.terminated | self.truncated


class VectorEnv:
    """SyncVectorEnv in SAME_STEP autoreset mode: every step returns a real transition for every env.
    (The gymnasium 1.x default, NEXT_STEP, spends one ignored action per reset, which would put fake
    transitions into the rollout.)"""

    def __init__(self, env_id: str, num_envs: int, seed: int, history: int = 100) -> None:
        self.envs = SyncVectorEnv(
            [lambda: gym.make(env_id) for _ in range(num_envs)], autoreset_mode=AutoresetMode.SAME_STEP
        )
        self.num_envs = num_envs
        self.seed = seed
        self.obs_dim = int(np.prod(self.envs.single_observation_space.shape))
        self.num_actions = int(self.envs.single_action_space.n)
        self._running_return = np.zeros(num_envs, dtype=np.float64)
        self.episode_returns: deque[float] = deque(maxlen=history)
        self.episodes_finished = 0

    def reset(self) -> np.ndarray:
        """Seeds env i with seed + i (gymnasium's convention for an int seed): same seed, same episodes."""
        obs, _ = self.envs.reset(seed=self.seed)
        self._running_return[:] = 0.0
        return obs

    def step(self, actions: np.ndarray) -> VecStep:
        obs, reward, terminated, truncated, info = self.envs.step(actions)
        final_obs = obs.copy()
        if "_final_obs" in info:
            for i in np.flatnonzero(info["_final_obs"]):
                final_obs[i] = info["final_obs"][i]
        out = VecStep(obs, reward.astype(np.float32), terminated, truncated, final_obs)
        self._track(out)
        return out

    def _track(self, step: VecStep) -> None:
        self._running_return += step.reward
        for i in np.flatnonzero(step.done):
            self.episode_returns.append(float(self._running_return[i]))
            self.episodes_finished += 1
            self._running_return[i] = 0.0

    def mean_return(self, window: int) -> float:
        """Mean over the last `window` finished episodes (NaN before any finish): the solve criterion."""
        if not self.episode_returns:
            return float("nan")
        recent = list(self.episode_returns)[-window:]
        return float(np.mean(recent))

    def close(self) -> None:
        self.envs.close()


def discrete_spaces(env_id: str) -> tuple[int, int]:
    """Observation size and number of actions of ``env_id``, from one throw-away env; a
    ``ValueError`` if gymnasium does not know it or it is not a discrete-action env."""
    try:
        probe = gym.make(env_id)
    except gym.error.Error as error:
        raise ValueError(str(error)) from None
    try:
        if not isinstance(probe.action_space, gym.spaces.Discrete) or len(probe.observation_space.shape) != 1:
            raise ValueError(
                f"{env_id!r} has {probe.action_space} actions and observations of shape "
                f"{probe.observation_space.shape}; expected discrete actions and flat observations"
            )
        return int(probe.observation_space.shape[0]), int(probe.action_space.n)
    finally:
        probe.close()
