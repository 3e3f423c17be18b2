"""Actor-critic MLP: the only model in the job, shared by the learner and the inference workers."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical

from .buffer import PolicyOutput


def _layer(in_dim: int, out_dim: int, gain: float) -> nn.Linear:
    """Orthogonal init with small output gains keeps the initial policy near-uniform and values near 0,
    which is what makes PPO on small MLPs start stably."""
    layer = nn.Linear(in_dim, out_dim)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def _mlp(obs_dim: int, hidden: int, out_dim: int, out_gain: float) -> nn.Sequential:
    root2 = float(np.sqrt(2.0))
    return nn.Sequential(
        _layer(obs_dim, hidden, root2),
        nn.Tanh(),
        _layer(hidden, hidden, root2),
        nn.Tanh(),
        _layer(hidden, out_dim, out_gain),
    )


class ActorCritic(nn.Module):
    """Separate actor and critic trunks: sharing one hurts on CartPole because the value loss scale
    (returns up to ~100) swamps the policy gradient."""

    def __init__(self, obs_dim: int, num_actions: int, hidden_size: int = 64) -> None:
        super().__init__()
        self.actor = _mlp(obs_dim, hidden_size, num_actions, out_gain=0.01)
        self.critic = _mlp(obs_dim, hidden_size, 1, out_gain=1.0)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Training path, with autograd: (logprob of the taken actions, entropy, value)."""
        dist = Categorical(logits=self.actor(obs))
        return dist.log_prob(actions), dist.entropy(), self.critic(obs).squeeze(-1)

    @torch.inference_mode()
    def act(self, obs: np.ndarray, generator: torch.Generator | None = None) -> PolicyOutput:
        """Sample actions for a batch of observations. An explicit generator makes rollouts reproducible
        without touching the global torch RNG that the learner also draws from."""
        x = torch.as_tensor(obs, dtype=torch.float32)
        logits = self.actor(x)
        probs = torch.softmax(logits, dim=-1)
        action = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        logprob = torch.log_softmax(logits, dim=-1).gather(-1, action.unsqueeze(-1)).squeeze(-1)
        value = self.critic(x).squeeze(-1)
        return PolicyOutput(action.numpy(), logprob.numpy(), value.numpy())

    @torch.inference_mode()
    def value(self, obs: np.ndarray) -> np.ndarray:
        """V(s) alone, for bootstrapping from the final observation of a truncated episode."""
        return self.critic(torch.as_tensor(obs, dtype=torch.float32)).squeeze(-1).numpy()

    def export_weights(self) -> dict[str, torch.Tensor]:
        """Detached copies, so a published weight version cannot change under the receiver when the
        learner steps again."""
        return {name: t.detach().clone() for name, t in self.state_dict().items()}

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self.load_state_dict(weights, strict=True)
