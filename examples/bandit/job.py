"""The smallest job on ``rlinfra.driver``: REINFORCE on a 4-armed bandit (README: "Write your own job").

A trainer (``Policy``, one rank) holds the arms' logits; samplers (``Sampler``, any number) pull
arms with the weights they serve and stamp each batch with its version. ``Bandit.loop`` is the
driver, top to bottom. Placement, launch, supervision, checkpoints, ``--resume``, metrics and
Ctrl-C are the run's.
"""

from __future__ import annotations

import io

import torch

from rlinfra import WeightReceiver, Worker
from rlinfra.driver import Batch, Job, JobConfig, Run, Section, Trainer, Update

PAYOUTS = (0.2, 0.5, 0.8, 0.3)  # each arm's chance of a reward of 1


class Policy(Trainer):
    """The trainer: softmax logits over the arms, one REINFORCE step per update."""

    def __init__(self, learning_rate: float) -> None:
        self.learning_rate, self.logits, self.version = learning_rate, torch.zeros(len(PAYOUTS)), 0

    def setup(self, checkpoint: bytes | None) -> int:
        """Restore ``checkpoint()``'s bytes, if given; returns the version."""
        if checkpoint is not None:
            saved = torch.load(io.BytesIO(checkpoint), weights_only=True)
            self.logits, self.version = saved["logits"], int(saved["version"])
        return self.version

    def weights_state(self) -> dict[str, torch.Tensor]:
        return {"logits": self.logits.clone()}

    def train(self, batches: list[Batch]) -> Update:
        arms = torch.tensor([arm for batch in batches for arm in batch.payload["arms"]])
        rewards = torch.tensor([r for batch in batches for r in batch.payload["rewards"]])
        advantages = rewards - rewards.mean()
        chosen = torch.nn.functional.one_hot(arms, len(PAYOUTS)).float()
        self.logits += self.learning_rate * (
            advantages[:, None] * (chosen - torch.softmax(self.logits, 0))
        ).mean(0)
        self.version += 1
        return Update(self.version, [batch.id for batch in batches])

    def checkpoint(self) -> bytes:
        buffer = io.BytesIO()
        torch.save({"logits": self.logits, "version": self.version}, buffer)
        return buffer.getvalue()


class Sampler(WeightReceiver, Worker):
    """Pulls arms with the weights it serves; every batch carries their version."""

    weights_as_torch = True

    def pull(self, batch_id: str, count: int) -> Batch:
        with self.serving() as weights:
            arms = torch.multinomial(torch.softmax(weights.tensors["logits"], 0), count, replacement=True)
            rewards = (torch.rand(count) < torch.tensor(PAYOUTS)[arms]).float()
            return Batch(batch_id, weights.version, {"arms": arms.tolist(), "rewards": rewards.tolist()})


class Algo(Section):
    iterations: int = 200
    pulls: int = 64
    learning_rate: float = 0.5
    target: float = 0.75


class Bandit(Job):
    title, components, target_key = "bandit", ("actor", "rollout"), "mean_reward"

    class Config(JobConfig):
        algo: Algo

    def loop(self, run: Run) -> None:
        algo = self.config.algo
        policy = run.start_trainer(lambda: Policy.create_group(algo.learning_rate))
        samplers = run.launch("rollout", Sampler.create_group(), max_concurrency=2)  # gets the weights
        pulls = run.batches(samplers, Sampler.pull, (algo.pulls,))  # a dead sampler's pulls are redone
        for step in run.steps(algo.iterations):
            batches = pulls.gather()  # every sampler's pulls, each made with one version
            run.commit()  # the version staged last step: pause → swap → verify → resume
            pulls.issue()  # the next pulls, on the newest weights, while the trainer updates
            step.train(policy.train, step.drop_stale(batches, 1))  # its version staged meanwhile
            rewards = [r for batch in batches for r in batch.payload["rewards"]]
            step.log(mean_reward=sum(rewards) / len(rewards))

    def target(self) -> float:
        return float(self.config.algo.target)

    def line(self, record: dict) -> str:
        return f"iteration {record['iteration']:3d} | mean reward {record['mean_reward']:.3f}"
