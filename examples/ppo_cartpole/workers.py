"""The job's trainer as an rlinfra ``Worker`` class: PPO updates, data-parallel over
torch.distributed (gloo); rank 0 publishes the weights (``WeightSender``). The rollout workers
(policy inference behind the version barrier's gate) are in ``rollout_worker.py``, a light module
because the env workers (``env_worker.py``, no torch) hold their handles.

Everything that is not placement, launch or weight movement is the Ray-free PPO core in ``ppo/``.
"""

from __future__ import annotations

import io

import ray
import torch

from examples.ppo_cartpole.ppo.buffer import RolloutBatch
from examples.ppo_cartpole.ppo.config import PPOConfig
from examples.ppo_cartpole.ppo.learner import Learner
from examples.ppo_cartpole.ppo.policy import ActorCritic
from rlinfra.driver import Batch, Trainer, Update


class ActorWorker(Trainer):
    """One data-parallel rank of the trainer. Every rank gets the whole batch and trains on its own
    strided shard; gradients are averaged, so the replicas stay identical and rank 0 publishes."""

    def __init__(self, algo: PPOConfig, obs_dim: int, num_actions: int) -> None:
        torch.set_num_threads(1)
        self.config = algo
        self.obs_dim, self.num_actions = obs_dim, num_actions
        self.learner: Learner | None = None

    def setup(self, checkpoint_bytes: bytes | None = None) -> int:
        """Build the model and optimiser once the process group is up (the learner broadcasts rank
        0's parameters); restore a checkpoint (``checkpoint()``'s bytes, loaded ``weights_only``)
        when given. Returns the weight version (the run publishes it above the one served after
        a restart)."""
        torch.manual_seed(self.config.seed)
        checkpoint = None
        if checkpoint_bytes is not None:
            checkpoint = torch.load(io.BytesIO(checkpoint_bytes), weights_only=True)
        policy = ActorCritic(self.obs_dim, self.num_actions, self.config.hidden_size)
        if checkpoint is not None:
            policy.load_weights(checkpoint["policy"])
        self.learner = Learner(policy, self.config)
        if checkpoint is not None:
            self.learner.optimizer.load_state_dict(checkpoint["optimizer"])
            self.learner.weight_version = int(checkpoint["weight_version"])
            self.learner.updates = int(checkpoint["updates"])
        return self.learner.weight_version

    def train(self, batches: list[Batch], fetch_timeout_s: float = 60.0) -> Update:
        """One PPO update on the rollouts of every env worker (one version), fetched straight from
        the env workers' object stores; bumps the version.

        An env worker that died after making its rollout took the rollout with it (it owned the
        object). Then nothing is trained: ``Update.lost`` names those batches, and the driver
        trains on the others (every rank fetches the same refs, so all agree)."""
        rollouts, lost = [], []
        for batch in batches:
            try:
                rollouts.append(ray.get(batch.payload["rollout"], timeout=fetch_timeout_s))
            except (ray.exceptions.OwnerDiedError, ray.exceptions.ObjectLostError):
                lost.append(batch.id)
        learner = self._learner()
        if lost:
            return Update(learner.weight_version, [], lost=lost)
        rollout = RolloutBatch.concat(rollouts)  # the ids stamped into the rollouts by the env workers
        metrics = learner.update(rollout)
        return Update(int(metrics.pop("weight_version")), list(rollout.batch_ids), metrics)

    def weights_state(self) -> dict[str, torch.Tensor]:
        """What the weight sync publishes: a copy, so the next update cannot change it mid-send."""
        return self._learner().policy.export_weights()

    def checkpoint(self) -> bytes:
        """Model, optimiser and version as bytes: the driver writes the file, so no worker needs the
        output folder (which on a real cluster is on the driver's machine)."""
        learner = self._learner()
        buffer = io.BytesIO()
        torch.save(
            {
                "policy": learner.policy.export_weights(),
                "optimizer": learner.optimizer.state_dict(),
                "weight_version": learner.weight_version,
                "updates": learner.updates,
            },
            buffer,
        )
        return buffer.getvalue()

    def updates(self) -> int:
        """How many updates these weights have had (across restarts from checkpoints)."""
        return self._learner().updates

    def parameters_digest(self) -> str:
        """A hash of this replica's parameters: equal on every rank while data parallelism works."""
        import hashlib

        digest = hashlib.sha256()
        for tensor in self._learner().policy.export_weights().values():
            digest.update(tensor.numpy().tobytes())
        return digest.hexdigest()

    def _learner(self) -> Learner:
        if self.learner is None:
            raise RuntimeError(f"actor:{self._rank}: setup() must run before training")
        return self.learner
