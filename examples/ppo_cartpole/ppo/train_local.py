"""Single-process PPO on CartPole: the reference the distributed job must match.

Run from the repository root:  python -m examples.ppo_cartpole.ppo.train_local [--seed 1]
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .config import PPOConfig
from .envs import VectorEnv
from .learner import Learner
from .policy import ActorCritic
from .rollout import RolloutCollector


@dataclass
class TrainResult:
    solved: bool
    iterations: int
    env_steps: int
    seconds: float
    mean_return: float
    first_mean_return: float  # after the first iteration: the baseline a short run must beat


def train(config: PPOConfig, log: Callable[[str], None] = print) -> TrainResult:
    """Collect -> GAE -> update, until the moving mean return reaches the target or iterations run out."""
    torch.set_num_threads(1)  # the net is tiny: extra threads only contend with env and other workers
    torch.manual_seed(config.seed)
    envs = VectorEnv(config.env_id, config.num_envs, config.seed)
    policy = ActorCritic(envs.obs_dim, envs.num_actions, config.hidden_size)
    learner = Learner(policy, config)
    collector = RolloutCollector(envs, policy, config)
    start = time.perf_counter()
    first = math.nan
    mean_return = math.nan
    it = 0
    for it in range(1, config.iterations + 1):
        batch = collector.collect(weight_version=learner.weight_version)
        metrics = learner.update(batch)
        mean_return = envs.mean_return(config.return_window)
        first = mean_return if it == 1 else first
        elapsed = time.perf_counter() - start
        log(_format(it, it * config.batch_size, elapsed, mean_return, envs.episodes_finished, metrics))
        if mean_return >= config.target_return:
            break
    envs.close()
    solved = mean_return >= config.target_return
    return TrainResult(solved, it, it * config.batch_size, time.perf_counter() - start, mean_return, first)


def _format(it: int, steps: int, elapsed: float, ret: float, episodes: int, m: dict[str, float]) -> str:
    return (
        f"iter {it:4d} | steps {steps:7d} | {steps / elapsed:6.0f} steps/s | return {ret:6.1f} "
        f"({episodes} eps) | pi {m['policy_loss']:+.3f} v {m['value_loss']:7.3f} "
        f"ent {m['entropy']:.3f} kl {m['approx_kl']:.4f} clip {m['clip_frac']:.3f} lr {m['lr']:.2e}"
    )


def _parse_config(argv: list[str] | None = None) -> PPOConfig:
    """Every PPOConfig field becomes a --flag, so tuning runs need no code edits."""
    parser = argparse.ArgumentParser(description=__doc__)
    for name, default in PPOConfig().model_dump().items():
        kind = (lambda s: s.lower() in ("1", "true", "yes")) if isinstance(default, bool) else type(default)
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=default)
    return PPOConfig(**vars(parser.parse_args(argv)))


def main(argv: list[str] | None = None) -> None:
    config = _parse_config(argv)
    result = train(config)
    status = "reached" if result.solved else "did NOT reach"
    print(
        f"{status} mean return {config.target_return:g} (last {config.return_window} episodes: "
        f"{result.mean_return:.1f}) | time-to-{config.target_return:g}: {result.seconds:.1f} s | "
        f"{result.iterations} iterations | {result.env_steps} env steps | "
        f"{result.env_steps / result.seconds:.0f} steps/s"
    )


if __name__ == "__main__":
    main()
