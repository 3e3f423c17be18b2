"""Every PPO hyperparameter in one place, so the local driver and the distributed job train the same thing."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlinfra.config import Section


class PPOConfig(Section):
    """Hyperparameters of PPO on CartPole (Schulman et al. 2017), tuned for a fast, reliable solve.

    The defaults favour few, large iterations (2048 transitions, 80 minibatch steps each): CartPole-v1
    reaches a 20-episode mean return of 475 in ~15-25 iterations (~30-50k env steps), and the
    distributed job pays its weight-sync and transfer overhead per iteration, not per step. The
    ranges are declared as pydantic fields, which the distributed job's config checks.
    """

    env_id: str = "CartPole-v1"
    num_envs: int = Field(16, ge=1)
    # Per env per rollout; batch = num_envs * num_steps transitions.
    num_steps: int = Field(128, ge=1)
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_coef: float = 0.2
    update_epochs: int = 10
    num_minibatches: int = 8
    learning_rate: float = 1e-3
    anneal_lr: bool = True
    anneal_iterations: int = 50  # lr decays linearly to lr_floor * learning_rate over this many updates
    lr_floor: float = 0.1
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    norm_adv: bool = True
    hidden_size: int = 64
    seed: int = 1
    # An upper bound; training stops as soon as the target is reached.
    iterations: int = Field(300, ge=1)
    target_return: float = 475.0
    return_window: int = 20  # episodes in the moving mean compared against target_return
    # Distributed job only. 0: collect, train, sync, repeat. 1: the next rollout runs on the current
    # weights while the learner trains and the new weights are staged (one-step off-policy).
    max_staleness: int = Field(1, ge=0)
    # "ddp": torch DistributedDataParallel; "allreduce": one flat all-reduce per step, by hand.
    data_parallel: Literal["ddp", "allreduce"] = "ddp"

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches
