"""The smallest job on ``rlinfra.driver``: REINFORCE on a 4-armed bandit (README: "Write your own job").

A trainer (``Policy``, one rank) holds the arms' logits; samplers (``Sampler``, any number) pull
arms with the weights they serve and stamp each batch with its version. The driver loop is
``Bandit.step``: gather the pulls, serve the staged weights, start the next pulls, update, stage.
Placement, launch, supervision, checkpoints, ``--resume``, metrics and Ctrl-C are ``Run``'s.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import torch

from rlinfra import WeightReceiver, WeightSender, Worker
from rlinfra.driver import Job, Run, RunResult, RunSettings, RunState, Section, job_main, parse_config

PAYOUTS = (0.2, 0.5, 0.8, 0.3)  # each arm's chance of a reward of 1


class Policy(WeightSender, Worker):
    """The trainer: softmax logits over the arms, one REINFORCE step per iteration."""

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

    def train(self, batches: list[dict[str, Any]]) -> dict[str, Any]:
        arms = torch.tensor([arm for batch in batches for arm in batch["arms"]])
        rewards = torch.tensor([r for batch in batches for r in batch["rewards"]])
        advantages = rewards - rewards.mean()
        chosen = torch.nn.functional.one_hot(arms, len(PAYOUTS)).float()
        grad = (advantages[:, None] * (chosen - torch.softmax(self.logits, 0))).mean(0)
        self.logits += self.learning_rate * grad
        self.version += 1
        return {"weight_version": self.version, "batch_ids": [b["batch_id"] for b in batches]}

    def checkpoint(self) -> bytes:
        buffer = io.BytesIO()
        torch.save({"logits": self.logits, "version": self.version}, buffer)
        return buffer.getvalue()


class Sampler(WeightReceiver, Worker):
    """Pulls arms with the weights it serves; every batch carries their version."""

    weights_as_torch = True

    def pull(self, batch_id: str, count: int) -> dict[str, Any]:
        with self.serving() as weights:
            probabilities = torch.softmax(weights.tensors["logits"], 0)
            arms = torch.multinomial(probabilities, count, replacement=True)
            rewards = (torch.rand(count) < torch.tensor(PAYOUTS)[arms]).float()
            return {
                "batch_id": batch_id,
                "version": weights.version,
                "arms": arms.tolist(),
                "rewards": rewards.tolist(),
            }


class Algo(Section):
    iterations: int = 200
    pulls: int = 64
    learning_rate: float = 0.5
    target: float = 0.75


class Config(Section):
    algo: Algo
    run: RunSettings


class Bandit(Job):
    title, components, target_key = "bandit", ("actor", "rollout"), "mean_reward"

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        config = parse_config(Config, cfg)
        self.algo, self.settings = config.algo, config.run
        self.total, self.state = self.algo.iterations, RunState()

    def launch(self, run: Run) -> None:
        version = run.start_trainer(lambda: Policy.create_group(self.algo.learning_rate))
        self.samplers = run.launch("rollout", Sampler.create_group(), max_concurrency=2)
        run.connect_weights(self.samplers, version)  # each gets the trainer's weights_state()
        run.supervise([self.samplers])  # a dead sampler is replaced, its pulls made again

    def start(self, run: Run) -> None:
        self.pending = run.generate(
            self.samplers, Sampler.pull, lambda rank, batch_id: (batch_id, self.algo.pulls)
        )

    def step(self, run: Run) -> dict[str, Any]:
        batches = run.gather(self.pending)  # every sampler's pulls, made with one version
        run.commit()  # the version staged last iteration: pause → swap → verify → resume
        self.start(run)  # the next pulls, on the newest weights, while the trainer updates
        fresh = [b.value for b in run.fresh(batches, 1, lambda b: b.value["version"])]
        metrics = run.on_trainer(lambda: run.trainer.train(fresh).wait()[0])
        run.stage(metrics["weight_version"])  # prepared while the samplers keep pulling
        run.updated(metrics["batch_ids"])
        rewards = [r for batch in batches for r in batch.value["rewards"]]
        return {"mean_reward": sum(rewards) / len(rewards)}

    def target(self) -> float:
        return self.algo.target

    def line(self, record: dict[str, Any]) -> str:
        return f"iteration {record['iteration']:3d} | mean reward {record['mean_reward']:.3f}"


def run(cfg: Mapping[str, Any], **options: Any) -> RunResult:
    """``options``: ``resume``, ``cluster``, ``console``, ``on_iteration`` (see ``Run``)."""
    return Run(Bandit(cfg), cfg, **options).execute()


def main(cfg: Mapping[str, Any], *, resume: bool = False) -> int:
    return job_main(run, cfg, resume=resume)
