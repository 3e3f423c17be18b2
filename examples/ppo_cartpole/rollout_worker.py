"""The PPO job's rollout workers: batched policy inference behind the version barrier's gate.

Ray loads an actor's class in every process that receives a handle to it (it unpickles the class,
importing its module), and every env worker is handed the handles of its rollout workers. So this
module imports nothing heavy at the top: torch and the policy are imported when a rollout worker
is built, in its own process, and an env worker's process never pays for torch (about 2 s of CPU
each on a small machine, measured at launch).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from examples.ppo_cartpole.ppo.buffer import PolicyOutput
from examples.ppo_cartpole.ppo.config import PPOConfig
from rlinfra import WeightReceiver, WeightsView, Worker

if TYPE_CHECKING:
    import torch


class RolloutWorker(WeightReceiver, Worker):
    """Batched policy inference, serving ``act``/``value`` from the weights it was last given.
    Launched with ``max_concurrency=2``: one thread serves the env workers while the other stages
    the next weights into the shadow buffer."""

    weights_as_torch = True

    def __init__(self, algo: PPOConfig, obs_dim: int, num_actions: int) -> None:
        import torch

        from examples.ppo_cartpole.ppo.policy import ActorCritic

        torch.set_num_threads(1)
        config = algo
        self.policy = ActorCritic(obs_dim, num_actions, config.hidden_size)
        # Each rank samples its own stream, reproducibly, without touching torch's global RNG.
        self.generator = torch.Generator().manual_seed(config.seed * 7919 + self._rank)
        self.loaded_version: int | None = None
        # One request at a time per worker: loading new weights must never overlap a forward pass
        # (which would compute with one version and stamp another), and the generator is not
        # thread-safe. The second thread of the actor is for weight staging, not inference.
        self.inference_lock = threading.Lock()

    def act(self, obs: np.ndarray) -> tuple[PolicyOutput, int]:
        """Actions, log-probabilities and values for a batch of observations, with the version."""
        with self.serving() as weights, self.inference_lock:
            self._load(weights)
            return self.policy.act(np.array(obs), self.generator), weights.version

    def value(self, obs: np.ndarray) -> tuple[np.ndarray, int]:
        """V(s), to bootstrap truncated episodes and the cut at the end of a rollout."""
        with self.serving() as weights, self.inference_lock:
            self._load(weights)
            return self.policy.value(np.array(obs)), weights.version

    def _load(self, weights: WeightsView) -> None:
        """Copy a newly swapped-in version into the module once (10k parameters: microseconds)."""
        if weights.version != self.loaded_version:
            # Initial weights arrive as read-only numpy views of the object store: copy them.
            self.policy.load_weights({name: _writable_tensor(t) for name, t in weights.tensors.items()})
            self.loaded_version = weights.version


def _writable_tensor(value: Any) -> torch.Tensor:
    """Ray hands numpy arrays over as read-only views of its object store; torch wants to own them."""
    import torch

    return value.clone() if isinstance(value, torch.Tensor) else torch.from_numpy(np.array(value))
