"""Fast checks of the PPO core: GAE bootstrapping, the clipped objective, learning, DDP sync, weights."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from examples.ppo_cartpole.ppo.buffer import RolloutBuffer, compute_gae
from examples.ppo_cartpole.ppo.config import PPOConfig
from examples.ppo_cartpole.ppo.envs import VectorEnv
from examples.ppo_cartpole.ppo.learner import Learner
from examples.ppo_cartpole.ppo.loss import clipped_policy_loss, ppo_loss
from examples.ppo_cartpole.ppo.policy import ActorCritic
from examples.ppo_cartpole.ppo.rollout import RolloutCollector
from examples.ppo_cartpole.ppo.train_local import train

GAMMA, LAM = 0.5, 0.5


def _two_env_buffer(terminated: list[bool], truncated: list[bool]) -> RolloutBuffer:
    """Three steps, two envs with identical rewards/values; both envs end an episode at t=1 with the
    given flags. V(final_obs) at that step is 8, V(obs after the rollout) is 10."""
    buf = RolloutBuffer(num_steps=3, num_envs=2, obs_dim=1)
    values, ends = [1.0, 2.0, 3.0], [False, True, False]
    for t in range(3):
        term = np.array(terminated) & ends[t]
        trunc = np.array(truncated) & ends[t]
        v = np.full(2, values[t], np.float32)
        buf.add(np.zeros((2, 1)), np.zeros(2), np.zeros(2), v, np.ones(2), term, trunc, np.full(2, 8.0))
    return buf


def test_gae_bootstraps_on_truncation_not_termination() -> None:
    # Hand-computed with gamma = lambda = 0.5, rewards 1, values [1, 2, 3], episode end at t=1.
    # truncated:  next_values [2, 8, 10] -> deltas [1, 3, 3]  -> A = [1 + .25*3, 3, 3]
    # terminated: next_values [2, 0, 10] -> deltas [1, -1, 3] -> A = [1 - .25*1, -1, 3]
    buf = _two_env_buffer(terminated=[False, True], truncated=[True, False])
    batch = buf.finish(np.full(2, 10.0, np.float32), GAMMA, LAM, weight_version=7)
    np.testing.assert_allclose(batch.advantages[:, 0], [1.75, 3.0, 3.0])
    np.testing.assert_allclose(batch.advantages[:, 1], [0.75, -1.0, 3.0])
    np.testing.assert_allclose(batch.returns[:, 0], [2.75, 5.0, 6.0])
    np.testing.assert_allclose(batch.returns[:, 1], [1.75, 1.0, 6.0])
    assert batch.weight_version == 7 and batch.staleness(current_version=9) == 2


def test_gae_termination_wins_when_both_flags_set() -> None:
    # CartPole can fall on step 500: terminated and truncated together, and there is no future.
    buf = _two_env_buffer(terminated=[True, True], truncated=[True, False])
    batch = buf.finish(np.full(2, 10.0, np.float32), GAMMA, LAM, weight_version=0)
    np.testing.assert_allclose(batch.advantages[:, 0], batch.advantages[:, 1])


def test_gae_without_episode_ends_is_discounted_td_sum() -> None:
    rewards = np.ones((2, 1), np.float32)
    values = np.zeros((2, 1), np.float32)
    next_values = np.array([[0.0], [4.0]], np.float32)
    adv, ret = compute_gae(rewards, values, next_values, np.zeros((2, 1)), gamma=0.5, gae_lambda=1.0)
    np.testing.assert_allclose(adv[:, 0], [1 + 0.5 * (1 + 0.5 * 4), 1 + 0.5 * 4])
    np.testing.assert_allclose(ret, adv)


def test_clipped_branch_has_zero_gradient_outside_clip_range() -> None:
    ratio = torch.tensor([1.5, 1.5, 0.5, 0.5], requires_grad=True)
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0])
    clipped_policy_loss(ratio, advantages, clip_coef=0.2).backward()
    # A>0 above 1+eps and A<0 below 1-eps take the clipped (constant) branch: no gradient. The other
    # two are where the unclipped term is the more pessimistic one, so it still pulls: -A / n.
    torch.testing.assert_close(ratio.grad, torch.tensor([0.0, 0.25, -0.25, 0.0]))


def test_ppo_loss_is_finite_and_on_policy_diagnostics_are_zero() -> None:
    torch.manual_seed(0)
    policy = ActorCritic(obs_dim=4, num_actions=2, hidden_size=16)
    obs, actions = torch.randn(32, 4), torch.randint(0, 2, (32,))
    logprob, entropy, value = policy(obs, actions)
    out = ppo_loss(
        logprob, logprob.detach(), torch.randn(32), value, torch.randn(32), entropy, 0.2, 0.5, 0.01
    )
    out.total.backward()
    assert torch.isfinite(out.total)
    assert all(torch.isfinite(p.grad).all() for p in policy.parameters())
    assert out.approx_kl.item() == pytest.approx(0.0, abs=1e-7) and out.clip_frac.item() == 0.0


def test_policy_weights_round_trip() -> None:
    torch.manual_seed(0)
    source, target = ActorCritic(4, 2, 16), ActorCritic(4, 2, 16)
    weights = source.export_weights()
    assert all(isinstance(t, torch.Tensor) for t in weights.values())
    target.load_weights(weights)
    obs = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    a = source.act(obs, torch.Generator().manual_seed(1))
    b = target.act(obs, torch.Generator().manual_seed(1))
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    with torch.no_grad():
        next(source.parameters()).add_(1.0)  # a published version must not follow later updates
    assert not torch.equal(next(source.parameters()), weights[next(iter(weights))])


def test_short_training_run_improves_return() -> None:
    config = PPOConfig(num_envs=8, num_steps=64, update_epochs=4, num_minibatches=4, iterations=15, seed=1)
    threads = torch.get_num_threads()
    try:
        result = train(config, log=lambda _: None)
    finally:
        torch.set_num_threads(threads)  # train() pins 1 thread; don't leak that into other tests
    assert result.iterations == 15 and result.env_steps == 15 * 8 * 64
    assert result.mean_return > 2.0 * result.first_mean_return


def _ddp_worker(rank: int, world_size: int, init_file: str, out_dir: str, mode: str) -> None:
    """One trainer rank: same seed as the other, its own shard of the same rollout."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        torch.manual_seed(0)
        config = PPOConfig(
            num_envs=4, num_steps=32, update_epochs=2, num_minibatches=2, hidden_size=16, data_parallel=mode
        )
        envs = VectorEnv(config.env_id, config.num_envs, seed=0)
        policy = ActorCritic(envs.obs_dim, envs.num_actions, config.hidden_size)
        before = policy.export_weights()
        learner = Learner(policy, config)
        batch = RolloutCollector(envs, policy, config).collect(learner.weight_version)
        learner.update(batch)
        torch.save({"before": before, "after": policy.export_weights()}, Path(out_dir) / f"rank{rank}.pt")
        # The DDP learner torn down before its process group, not after it with the function's
        # locals: the GRPO learner's test hung that way, and gloo aborted in this one now and then.
        del learner
        gc.collect()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("mode", ["ddp", "allreduce"])
def test_learner_keeps_ddp_replicas_identical(tmp_path: Path, mode: str) -> None:
    world_size = 2
    mp.spawn(_ddp_worker, args=(world_size, str(tmp_path / "init"), str(tmp_path), mode), nprocs=world_size)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world_size)]
    for name, tensor in ranks[0]["after"].items():
        torch.testing.assert_close(ranks[1]["after"][name], tensor, rtol=0, atol=0)
    # Different shards give different local gradients, so identical results mean they were averaged.
    assert any(not torch.equal(ranks[0]["before"][k], v) for k, v in ranks[0]["after"].items())
