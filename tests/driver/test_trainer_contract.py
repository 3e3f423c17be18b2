"""The trainer contract ``Run`` relies on, checked on the class before any process starts."""

from __future__ import annotations

import pytest

from rlinfra import Worker
from rlinfra.driver import TRAINER_METHODS, TrainerContractError
from rlinfra.driver.trainer import check_trainer
from rlinfra.services.weights import WeightSender


def test_the_bundled_trainers_keep_the_contract() -> None:
    from examples.bandit.job import Policy as BanditPolicy
    from examples.grpo_lm.workers import Policy as GRPOPolicy
    from examples.ppo_cartpole.workers import ActorWorker

    for trainer in (BanditPolicy, ActorWorker, GRPOPolicy):
        check_trainer(trainer, "actor")


class Forgetful(WeightSender, Worker):
    def setup(self, checkpoint: bytes | None) -> int:
        return 0


class NotASender(Worker):
    def setup(self, checkpoint: bytes | None) -> int:
        return 0

    def checkpoint(self) -> bytes:
        return b""

    def weights_state(self) -> dict:
        return {}


def test_a_trainer_without_checkpoint_or_its_own_weights_state_is_named_with_what_it_lacks() -> None:
    with pytest.raises(TrainerContractError) as caught:
        check_trainer(Forgetful, "learner")
    message = str(caught.value)
    assert message.startswith("Forgetful, the trainer ('learner'), lacks: ")
    assert TRAINER_METHODS["checkpoint"] in message and TRAINER_METHODS["weights_state"] in message
    assert TRAINER_METHODS["setup"] not in message


def test_a_trainer_that_is_no_weight_sender_is_refused() -> None:
    with pytest.raises(TrainerContractError, match=r"NotASender, the trainer .* lacks: WeightSender among"):
        check_trainer(NotASender, "actor")
