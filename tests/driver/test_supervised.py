"""``SupervisedSteps`` against in-process fakes of our own groups: supervised calls, batches made
under ids (a batch cut short by a dead worker is lost and made again on its replacement, for
that rank only), and the re-issue race ``gather`` guards: a call issued before a recovery
finished that fails on a worker the recovery already replaced is made again without healing
again (a second heal would find nobody gone and re-raise, ending the run)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlinfra.driver.batches import LOST
from rlinfra.driver.state import RunState
from rlinfra.driver.supervised import Gathered as Batch
from rlinfra.driver.supervised import SupervisedSteps
from rlinfra.driver.supervisor import Supervisor, UnsupervisedLoss
from rlinfra.runtime.errors import RankFailure, WorkerGroupError
from rlinfra.services.weights import WeightSyncError
from tests.driver.fakes import FakeCall, FakeGroup, Made, gone_failure


class Steps(SupervisedSteps):
    """A driver with nothing but the supervised steps (``Run`` is another)."""

    def __init__(self, supervisor: Supervisor | None) -> None:
        self.supervisor = supervisor
        self.state = RunState()
        self.in_flight = []
        self.seen: list[int] = []  # len(state.recoveries) as each after_heal saw it

    def after_heal(self) -> None:
        self.seen.append(len(self.state.recoveries))


def collect(rank: int, batch_id: str) -> tuple[Any, ...]:
    return (batch_id,)


def driver(size: int = 3, *, max_restarts: int = 3, shrinkable: bool = False, nodes=None):
    env = FakeGroup("env", size, max_restarts=max_restarts, nodes=nodes)
    trainer = FakeGroup("actor", 2)
    sup = Supervisor([env], watched=[trainer], shrinkable=[env] if shrinkable else ())
    return Steps(sup), env, trainer


def made(batch: Batch) -> Made:
    value = batch.value
    assert isinstance(value, Made)
    return value


def check_ids(steps: Steps, batches: list[Batch], *others: list[Batch]) -> None:
    """Each batch under its own id, made for that id; every other id issued (but those of
    ``others``, gathered before) ended as lost."""
    ledger = steps.state.ledger
    ids = [b.id for b in [*batches, *(b for gathered in others for b in gathered)]]
    assert len(set(ids)) == len(ids)
    assert all(made(b).args == (b.id,) and b.id.startswith(f"env:{b.rank}#") for b in batches)
    assert sorted(ledger.open_ids) == sorted(ids)
    assert all(ledger.ended[i] == LOST for i in ledger.issued if i not in ids)
    assert steps.in_flight == []


# --- generate / gather ------------------------------------------------------------------------------


def test_gather_returns_one_batch_per_rank_in_rank_order_under_its_id():
    steps, env, _ = driver()
    pending = steps.generate(env, "collect", collect)
    assert steps.in_flight == [pending]
    batches = steps.gather(pending)
    assert [b.rank for b in batches] == [0, 1, 2]
    assert [b.id for b in batches] == ["env:0#1", "env:1#2", "env:2#3"]
    check_ids(steps, batches)
    assert steps.state.recoveries == [] and len(env.calls) == 1


def test_a_rank_that_dies_is_healed_and_its_batch_made_again_for_that_rank_only():
    steps, env, _ = driver()
    pending = steps.generate(env, "collect", collect)
    first = pending.ids[1]
    env.kill(1)
    batches = steps.gather(pending)
    assert [call.ranks for call in env.calls] == [[0, 1, 2], [1]]
    assert [made(b).incarnation for b in batches] == [0, 1, 0]
    assert batches[1].id != first and steps.state.ledger.ended[first] == LOST
    assert [(b.rank, b.id) for b in batches if b.rank != 1] == [(0, "env:0#1"), (2, "env:2#3")]
    check_ids(steps, batches)
    assert len(steps.state.recoveries) == 1 and steps.seen == [1]  # recorded before after_heal
    assert [(r.component, r.rank) for r in steps.state.recoveries[0].restarts] == [("env", 1)]


def test_a_rank_still_running_when_another_died_is_waited_for_not_made_again():
    steps, env, _ = driver(4)
    env.late = {2}  # has not answered when rank 1's death is reported: WorkerGroupError.pending
    pending = steps.generate(env, "collect", collect)
    original = dict(pending.ids)
    env.kill(1)
    batches = steps.gather(pending)
    assert [b.rank for b in batches] == [0, 1, 2, 3]
    assert batches[2].id == original[2] and made(batches[2]).incarnation == 0  # its own, kept
    assert sorted(len(call.ranks) for call in env.calls) == [1, 4]  # rank 1 again, nobody else
    assert len(steps.state.ledger.issued) == 5
    check_ids(steps, batches)


def test_a_call_issued_before_a_recovery_that_fails_on_a_replaced_worker_is_reissued_without_healing():
    steps, env, _ = driver()
    a = steps.generate(env, "collect", collect)
    b = steps.generate(env, "collect", collect)  # in flight too, to rank 1's old worker
    env.kill(1)
    first = steps.gather(a)  # rank 1 replaced here
    assert env.gone_ranks() == [] and len(steps.state.recoveries) == 1
    old_b1 = b.ids[1]
    with pytest.raises(WorkerGroupError):  # what healing again would do: nobody is gone
        Supervisor([env]).heal(gone_failure("env", [1]))
    batches = steps.gather(b)
    assert len(steps.state.recoveries) == 1 and len(env.restarts) == 1  # no second heal
    assert made(batches[1]).incarnation == 1 and batches[1].id != old_b1
    assert steps.state.ledger.ended[old_b1] == LOST
    assert [call.ranks for call in env.calls] == [[0, 1, 2], [0, 1, 2], [1], [1]]
    check_ids(steps, batches, first)


def test_a_call_that_failed_on_a_peer_the_recovery_took_care_of_is_made_again_without_a_heal():
    """An env worker's call, issued before a recovery, fails because the worker it talked to died
    (its own process is fine): the recovery that followed took care of that, so the batch is made
    again and the run goes on; a heal would find nobody gone and stop the run."""
    steps, env, _ = driver()
    a = steps.generate(env, "collect", collect)
    b = steps.generate(env, "collect", collect)
    env.kill(1)
    first = steps.gather(a)  # the recovery: rank 1 replaced
    env.raising[0] = "RuntimeError: env:0: a rollout worker of rollout:1 died"
    waits: list[list[int]] = []

    def peer_back(call: FakeCall) -> None:
        waits.append(list(call.ranks))
        if len(waits) == 2:  # the batch made again: the peer answers now
            env.raising.clear()

    env.before_wait = peer_back
    batches = steps.gather(b)
    assert len(steps.state.recoveries) == 1 and len(env.restarts) == 1  # no second heal
    assert waits == [[0, 1, 2], [0, 1]] and [batch.rank for batch in batches] == [0, 1, 2]
    check_ids(steps, batches, first)


def test_the_race_guard_does_not_hide_a_death_after_the_recovery():
    steps, env, _ = driver()
    a = steps.generate(env, "collect", collect)
    b = steps.generate(env, "collect", collect)
    env.kill(1)
    first = steps.gather(a)
    env.kill(2)  # a new death, after the recovery, on a call issued before it
    batches = steps.gather(b)
    assert len(steps.state.recoveries) == 2
    assert [(r.rank, r.outcome) for r in env.restarts] == [(1, "replaced"), (2, "replaced")]
    assert [made(batch).incarnation for batch in batches] == [0, 1, 1]
    # b's ids of ranks 1 and 2, then the first re-issue of rank 2 (to its dead worker): lost
    assert steps.state.ledger.summary()["lost"] == 1 + 3
    check_ids(steps, batches, first)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    size=st.integers(1, 5),
    deaths=st.lists(st.sets(st.integers(0, 4)), max_size=4),
    late=st.sets(st.integers(0, 4)),
)
def test_whatever_dies_each_rank_is_gathered_once_and_every_other_id_is_lost(size, deaths, late):
    steps, env, _ = driver(size, max_restarts=100)
    schedule = [sorted(r for r in dead if r < size) for dead in deaths]

    def before_wait(call: FakeCall) -> None:  # the ranks of the next wave die during this wait
        if schedule:
            for rank in schedule.pop(0):
                if rank in call.ranks:
                    env.dead.add((rank, call.incarnations[rank]))

    env.before_wait = before_wait
    env.late = {r for r in late if r < size}
    batches = steps.gather(steps.generate(env, "collect", collect))
    assert [b.rank for b in batches] == list(range(size))
    check_ids(steps, batches)
    assert len(steps.state.ledger.issued) == size + steps.state.ledger.summary()["lost"]
    # Each death replaced once; a rank that died after a recovery, on a call issued before it, is
    # first made again on its dead worker (the guard cannot tell its death from the recovery's).
    assert (
        len({(r.rank, r.at) for r in env.restarts})
        == len(env.restarts)
        <= steps.state.ledger.summary()["lost"]
    )
    steps.state.ledger.trained(b.id for b in batches)  # no duplicate: raises otherwise
    assert steps.state.ledger.open_ids == []


def test_a_worker_that_raises_is_not_healed_and_the_error_stands():
    steps, env, _ = driver()
    env.raising[2] = "ValueError: a bug in collect"
    pending = steps.generate(env, "collect", collect)
    with pytest.raises(WorkerGroupError, match="a bug in collect"):
        steps.gather(pending)
    assert steps.state.recoveries == [] and env.restarts == []
    assert steps.state.ledger.ended[pending.ids[2]] == LOST


def test_without_a_supervisor_a_death_stands():
    steps, env, _ = driver()
    steps.supervisor = None
    pending = steps.generate(env, "collect", collect)
    env.kill(0)
    with pytest.raises(WorkerGroupError, match="died"):
        steps.gather(pending)
    assert env.restarts == []


def test_gather_over_a_shrinkable_group_goes_on_without_a_rank_whose_node_was_lost():
    steps, env, _ = driver(3, shrinkable=True, nodes=[0, 0, 1])
    pending = steps.generate(env, "collect", collect)
    env.lose_node(1)
    batches = steps.gather(pending)
    assert env.ranks == [0, 1]
    assert [b.rank for b in batches] == [0, 1]
    assert steps.state.ledger.ended[pending.ids[2]] == LOST


# --- supervised, call_trainer, lost, heal ------------------------------------------------------------------


def test_supervised_heals_and_runs_the_step_again():
    steps, env, _ = driver()
    env.kill(0)
    tries = []

    def step() -> str:
        tries.append(env.incarnation[0])
        if env.gone_ranks():
            raise gone_failure("env", env.gone_ranks())
        return "done"

    assert steps.supervised(step) == "done"
    assert tries == [0, 1] and len(steps.state.recoveries) == 1


def test_supervised_heals_after_a_weight_sync_error_too():
    steps, env, _ = driver()
    env.kill(2)

    def step() -> int:
        if env.gone_ranks():
            raise WeightSyncError("prepare", 7, 5, gone_failure("env", [2]))
        return 7

    assert steps.supervised(step) == 7 and len(env.restarts) == 1


def test_supervised_does_not_retry_a_bug():
    steps, _, _ = driver()
    tries = []

    def step() -> None:
        tries.append(1)
        raise WorkerGroupError("env", "score", {0: RankFailure(0, 0, "KeyError: 'x'")})

    with pytest.raises(WorkerGroupError, match="KeyError"):
        steps.supervised(step)
    assert tries == [1]


def test_supervised_ends_when_the_restart_budget_is_spent():
    steps, env, _ = driver(max_restarts=2)

    def step() -> None:  # the worker dies every time
        env.kill(1)
        raise gone_failure("env", [1])

    with pytest.raises(Exception, match="restart budget spent") as spent:
        steps.supervised(step)
    assert type(spent.value).__name__ == "RestartBudgetExhausted"
    assert len(steps.state.recoveries) == 2


def test_call_trainer_turns_a_lost_trainer_rank_into_an_unsupervised_loss_and_never_retries():
    steps, _, trainer = driver()
    calls = []

    def update() -> None:
        calls.append(1)
        trainer.kill(0)
        raise gone_failure("actor", [0])

    with pytest.raises(UnsupervisedLoss) as loss:
        steps.call_trainer(update)
    assert loss.value.gone == {"actor": [0]} and calls == [1]
    assert trainer.restarts == [] and steps.state.recoveries == []


def test_call_trainer_replaces_a_dead_worker_of_another_group_and_reraises():
    steps, env, _ = driver()
    env.kill(2)
    error = gone_failure("env", [2])

    def update() -> None:
        raise error

    with pytest.raises(WorkerGroupError) as raised:
        steps.call_trainer(update)
    assert raised.value is error
    assert env.gone_ranks() == [] and len(steps.state.recoveries) == 1


def test_lost_ends_the_batches_as_lost_and_replaces_whoever_is_gone():
    steps, env, _ = driver()
    batches = steps.gather(steps.generate(env, "collect", collect))
    env.kill(1)
    steps.lost([batches[1]])
    assert steps.state.ledger.ended[batches[1].id] == LOST
    assert env.gone_ranks() == [] and len(steps.state.recoveries) == 1
    steps.lost([batches[0]])  # nobody gone now: no error, no recovery
    assert steps.state.ledger.ended[batches[0].id] == LOST and len(steps.state.recoveries) == 1
    assert steps.state.ledger.open_ids == [batches[2].id]
