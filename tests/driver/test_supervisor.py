"""``Supervisor.heal`` and ``resize`` against in-process fakes of our own groups and weight sync:
the order of a healing (abandon → replace → admit → rewire → re-stage), what ends supervision
with an error, and a shrinkable group going on without a lost node's rank."""

from __future__ import annotations

from typing import Any

import pytest

from rlinfra.driver.supervisor import Supervisor, UnsupervisedLoss
from rlinfra.runtime.errors import RankFailure, WorkerGroupError
from rlinfra.runtime.supervision import REFUSED, REPLACED, RestartBudgetExhausted, UnreplaceableError
from tests.driver.fakes import FakeGroup, FakeSync, gone_failure, without_noop_leaves


def rig(*, staged: int | None = 6, max_restarts: int = 3, **supervisor: Any):
    """Rollout (the weight receivers, 4 ranks on nodes 0-3) and env (2 ranks) supervised, the
    trainer (2 ranks) watched; every event in one log."""
    log: list[Any] = []
    rollout = FakeGroup("rollout", 4, max_restarts=max_restarts, log=log)
    env = FakeGroup("env", 2, log=log)
    trainer = FakeGroup("actor", 2, log=log)
    sync = FakeSync(rollout, version=5, staged=staged, log=log)

    def rewire(replaced: dict[str, list[int]]) -> None:
        log.append(("rewire", replaced))

    supervisor.setdefault("watched", [trainer])
    sup = Supervisor([rollout, env], sync, rewire, **supervisor)
    return sup, rollout, env, trainer, sync, log


def test_heal_abandons_replaces_admits_rewires_and_restages_in_that_order():
    sup, rollout, _, _, sync, log = rig()
    rollout.kill(1)
    cause = gone_failure("rollout", [1])
    recovery = sup.heal(cause)
    assert without_noop_leaves(log) == [
        ("abandon", 6),
        ("replace", "rollout", 1),
        ("admit", (1,), 5),
        ("rewire", {"rollout": [1]}),
        ("prepare", 6),
    ]
    assert [(r.component, r.rank, r.outcome) for r in recovery.restarts] == [("rollout", 1, REPLACED)]
    assert recovery.admitted_version == 5 and recovery.dropped == []
    assert recovery.cause == str(cause).partition("\n")[0]
    assert recovery.finished_monotonic > 0 and recovery.took_s >= 0
    assert rollout.gone_ranks() == [] and rollout.incarnation[1] == 1
    assert sync.staged == 6 and sync.alive == [0, 1, 2, 3]


def test_heal_replaces_every_gone_rank_of_every_group_and_admits_only_receivers():
    sup, rollout, env, _, _, log = rig(staged=None)
    rollout.kill(0)
    rollout.kill(3)
    env.kill(1)
    recovery = sup.heal(gone_failure("env", [1]))
    assert [(r.component, r.rank) for r in recovery.restarts] == [("rollout", 0), ("rollout", 3), ("env", 1)]
    assert ("admit", (0, 3), 5) in log and not any(e[0] == "admit" and 1 in e[1] for e in log)
    assert ("rewire", {"rollout": [0, 3], "env": [1]}) in log
    assert ("abandon", None) in log and not any(e[0] == "prepare" for e in log)  # nothing was staged


def test_heal_of_a_non_receiver_group_still_abandons_and_restages_but_admits_nobody():
    sup, _, env, _, _, log = rig()
    env.kill(0)
    sup.heal(gone_failure("env", [0]))
    assert without_noop_leaves(log) == [
        ("abandon", 6),
        ("replace", "env", 0),
        ("rewire", {"env": [0]}),
        ("prepare", 6),
    ]


def test_heal_reraises_the_original_error_when_nobody_died():
    sup, _, _, _, _, log = rig()
    bug = WorkerGroupError("rollout", "generate", {2: RankFailure(2, 2, "ValueError: a bug")})
    with pytest.raises(WorkerGroupError) as raised:
        sup.heal(bug)
    assert raised.value is bug
    assert log == []  # nothing abandoned, replaced or rewired


def test_a_spent_restart_budget_ends_supervision_naming_component_and_rank():
    sup, rollout, _, _, _, log = rig(max_restarts=1)
    rollout.kill(2)
    sup.heal(gone_failure("rollout", [2]))
    rollout.kill(2)
    with pytest.raises(RestartBudgetExhausted) as spent:
        sup.heal(gone_failure("rollout", [2]))
    assert (spent.value.component, spent.value.rank, spent.value.node_rank) == ("rollout", 2, 2)
    assert str(spent.value).startswith("rollout:2 (node 2): restart budget spent")
    assert [r.outcome for r in rollout.restarts] == [REPLACED, REFUSED]
    assert log.count(("replace", "rollout", 2)) == 1


def test_a_lost_watched_rank_is_an_unsupervised_loss_and_nothing_is_replaced():
    sup, rollout, _, trainer, _, log = rig()
    trainer.kill(1)
    rollout.kill(0)  # also gone: the trainer's loss comes first, nothing is touched
    cause = gone_failure("actor", [1])
    with pytest.raises(UnsupervisedLoss) as loss:
        sup.heal(cause)
    assert loss.value.gone == {"actor": [1]}
    assert loss.value.cause is cause and loss.value.__cause__ is cause
    assert "lost actor rank(s) [1]" in str(loss.value)
    assert log == [] and rollout.restarts == []


def test_a_shrinkable_group_drops_the_rank_of_a_lost_node_and_goes_on():
    log: list[Any] = []
    rollout = FakeGroup("rollout", 4, nodes=[0, 0, 1, 1], log=log)
    sync = FakeSync(rollout, staged=6, log=log)
    sup = Supervisor([rollout], sync, lambda replaced: log.append(("rewire", replaced)), shrinkable=[rollout])
    rollout.lose_node(1)  # ranks 2 and 3
    recovery = sup.heal(gone_failure("rollout", [2, 3]))
    assert recovery.dropped == [("rollout", 2), ("rollout", 3)]
    assert recovery.restarts == [] and recovery.admitted_version is None
    assert rollout.ranks == [0, 1] and sync.alive == [0, 1]
    assert [r.outcome for r in rollout.restarts] == [REFUSED, REFUSED]
    assert log == [
        ("abandon", 6),
        ("remove", "rollout", (2,)),
        ("remove", "rollout", (3,)),
        ("leave", (2, 3)),
        ("rewire", {"rollout": [2, 3]}),
        ("prepare", 6),
    ]


def test_a_lost_node_is_unreplaceable_in_a_group_that_is_not_shrinkable():
    sup, rollout, _, _, _, _ = rig()
    rollout.lose_node(3)
    with pytest.raises(UnreplaceableError) as lost:
        sup.heal(gone_failure("rollout", [3]))
    assert (lost.value.component, lost.value.rank, lost.value.node_rank) == ("rollout", 3, 3)
    assert rollout.ranks == [0, 1, 2, 3]


def test_a_shrinkable_group_never_drops_its_last_rank():
    lone = FakeGroup("rollout", 1)
    sup = Supervisor([lone], shrinkable=[lone])
    lone.lose_node(0)
    with pytest.raises(UnreplaceableError):
        sup.heal(gone_failure("rollout", [0]))
    assert lone.ranks == [0]


def test_a_newcomer_that_dies_during_admission_is_replaced_again():
    sup, rollout, _, _, sync, log = rig()
    rollout.kill(1)
    sync.admit_fails.append(lambda ranks: [rollout.kill(rank) for rank in ranks])
    recovery = sup.heal(gone_failure("rollout", [1]))
    assert [(r.rank, r.outcome) for r in recovery.restarts] == [(1, REPLACED), (1, REPLACED)]
    assert rollout.incarnation[1] == 2 and rollout.gone_ranks() == []
    assert without_noop_leaves(log) == [
        ("abandon", 6),
        ("replace", "rollout", 1),
        ("admit", (1,), 5),
        ("replace", "rollout", 1),
        ("admit", (1,), 5),
        ("rewire", {"rollout": [1]}),
        ("prepare", 6),
    ]


def test_a_second_error_with_nobody_gone_stands():
    sup, rollout, _, _, sync, log = rig()
    rollout.kill(1)
    sync.admit_fails.append(lambda ranks: None)  # admission fails, yet nobody is gone
    with pytest.raises(Exception) as raised:
        sup.heal(gone_failure("rollout", [1]))
    assert type(raised.value).__name__ == "WeightSyncError" and raised.value.step == "admit"
    assert not any(entry[0] in ("rewire", "prepare") for entry in log)


def test_a_newcomer_found_dead_after_bring_back_is_replaced_in_the_same_heal():
    sup, _, env, _, _, log = rig(staged=None)
    env.kill(0)
    env.on_replace = lambda rank: env.kill(rank) if env.incarnation[rank] == 1 else None
    recovery = sup.heal(gone_failure("env", [0]))
    assert [(r.component, r.rank) for r in recovery.restarts] == [("env", 0), ("env", 0)]
    assert env.gone_ranks() == [] and env.incarnation[0] == 2
    assert [e for e in log if e[0] == "rewire"] == [("rewire", {"env": [0]})]  # once, at the end


def test_resize_removes_and_adds_receivers_admitted_at_the_committed_version():
    sup, rollout, _, _, sync, log = rig()
    sup.resize(rollout, remove=[2, 3])
    assert rollout.ranks == [0, 1] and sync.alive == [0, 1]
    assert log == [
        ("abandon", 6),
        ("remove", "rollout", (2, 3)),
        ("leave", (2, 3)),
        ("rewire", {"rollout": [2, 3]}),
        ("prepare", 6),
    ]
    log.clear()
    sup.resize(rollout, add=[3])
    assert rollout.ranks == [0, 1, 3] and sync.alive == [0, 1, 3]
    assert log == [
        ("abandon", 6),
        ("add", "rollout", (3,)),
        ("admit", (3,), 5),
        ("rewire", {"rollout": [3]}),
        ("prepare", 6),
    ]
    assert rollout.restarts == []  # not charged to the restart budget


def test_resize_of_a_group_that_receives_no_weights_leaves_the_staged_version_alone():
    sup, _, env, _, sync, log = rig()
    sup.resize(env, remove=[1])
    assert log == [("remove", "env", (1,)), ("rewire", {"env": [1]})]
    assert sync.staged == 6
