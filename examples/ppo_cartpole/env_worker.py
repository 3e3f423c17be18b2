"""The PPO job's env workers: they step vectorised gymnasium envs, ask their rollout worker(s) for
actions (one batched request per step), keep the trajectory, compute GAE and return
version-stamped rollouts. Written on numpy and gymnasium only, in a module of its own, so that an
env worker's process never imports torch (seconds of CPU per process on a small machine).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayActorError

from examples.ppo_cartpole.ppo.buffer import PolicyOutput, RolloutBuffer
from examples.ppo_cartpole.ppo.config import PPOConfig
from examples.ppo_cartpole.ppo.envs import VectorEnv
from rlinfra import Worker
from rlinfra.driver import Batch


class MixedVersionError(RuntimeError):
    """A rollout saw more than one weight version: its batch would have no single behaviour policy."""


class EnvWorker(Worker):
    """Steps ``num_envs`` CartPole envs. Each step is one batched ``act`` request per rollout worker
    it is connected to (its envs are split among them, requests in flight together)."""

    def __init__(self, algo: PPOConfig, num_envs: int, request_timeout_s: float) -> None:
        self.config = algo
        self.request_timeout_s = request_timeout_s
        # Different seeds per env worker, so their episodes differ; the same on every run. A
        # replaced worker (incarnation 1, 2 …) starts new episodes rather than replaying the old.
        seed = self.config.seed + 1000 * (self._rank + 1) + 7919 * self.incarnation
        # History long enough to hold every episode of one rollout (short early episodes included).
        self.envs = VectorEnv(self.config.env_id, num_envs, seed, history=self.config.num_steps * num_envs)
        self.buffer = RolloutBuffer(self.config.num_steps, num_envs, self.envs.obs_dim)
        self.obs = self.envs.reset()
        self.policies: list[tuple[str, Any]] = []
        self.splits: list[np.ndarray] = []
        self.episodes_reported = 0

    def connect(self, policies: list[tuple[str, Any]]) -> list[str]:
        """Use these rollout workers (``(name, actor handle)``); returns their names."""
        if not policies:
            raise ValueError("an env worker needs at least one rollout worker")
        self.policies = list(policies)
        self.splits = np.array_split(np.arange(self.envs.num_envs), len(policies))
        return [name for name, _ in policies]

    def collect(self, batch_id: str = "") -> Batch:
        """One rollout of ``num_steps`` vector steps. Returns a reference to the GAE-ready batch,
        stamped with the driver's ``batch_id`` and the one weight version every action and value
        of it came from, and the episodes that ended. A rollout cut short (a rollout worker died
        mid-way) is never used: the next call starts an empty buffer."""
        versions: set[int] = set()
        cfg = self.config
        self.buffer.step = 0
        for _ in range(cfg.num_steps):
            out, version = self._request("act", self.obs)
            versions.add(version)
            step = self.envs.step(out.action)
            final_value = np.zeros(self.envs.num_envs, dtype=np.float32)
            if step.truncated.any():  # only truncations bootstrap from the final observation
                final_value, version = self._request("value", step.final_obs)
                versions.add(version)
            self.buffer.add(
                self.obs, out.action, out.logprob, out.value, step.reward,
                step.terminated, step.truncated, final_value,
            )  # fmt: skip
            self.obs = step.obs
        last_value, version = self._request("value", self.obs)
        versions.add(version)
        if len(versions) != 1:
            raise MixedVersionError(
                f"env:{self._rank}: one rollout was served by weight versions {sorted(versions)}; "
                "weights must only change between rollouts"
            )
        batch = self.buffer.finish(last_value, cfg.gamma, cfg.gae_lambda, weight_version=versions.pop())
        batch = dataclasses.replace(batch, batch_ids=(batch_id,))
        finished = self.envs.episodes_finished - self.episodes_reported
        self.episodes_reported = self.envs.episodes_finished
        returns = list(self.envs.episode_returns)[-finished:] if finished else []
        # The batch goes to the object store and only its reference to the driver: the actor ranks
        # fetch it from here directly (env → actor), the driver sees just the summary.
        summary = {
            "rollout": ray.put(batch),
            "transitions": batch.num_transitions,
            "episode_returns": returns,
        }
        return Batch(batch_id, batch.weight_version, summary)

    def _request(self, method: str, obs: np.ndarray) -> tuple[Any, int]:
        """Send each rollout worker its slice of ``obs`` at once; join the answers in env order.
        A rollout worker that dies or stalls becomes an error naming it, never a hang."""
        refs = [
            getattr(handle, method).remote(obs[idx])
            for (_, handle), idx in zip(self.policies, self.splits, strict=True)
        ]
        try:
            answers = ray.get(refs, timeout=self.request_timeout_s)
        except GetTimeoutError:
            raise TimeoutError(
                f"env:{self._rank}: rollout worker(s) {self._names()} did not answer '{method}' "
                f"within {self.request_timeout_s:g} s"
            ) from None
        except RayActorError as error:
            raise RuntimeError(
                f"env:{self._rank}: a rollout worker of {self._names()} died: {error}"
            ) from None
        versions = {version for _, version in answers}
        if len(versions) != 1:
            raise MixedVersionError(
                f"env:{self._rank}: rollout workers {self._names()} answered one step with versions "
                f"{sorted(versions)}"
            )
        parts = [part for part, _ in answers]
        if method == "act":
            joined: Any = PolicyOutput(*(np.concatenate(column) for column in zip(*parts, strict=True)))
        else:
            joined = np.concatenate(parts)
        return joined, versions.pop()

    def _names(self) -> str:
        return ", ".join(name for name, _ in self.policies)
