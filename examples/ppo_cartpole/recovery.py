"""Restarting the trainer: a data-parallel rank cannot be replaced in place, so the whole group is.

    stop       every trainer rank (the survivors sit in a collective with the dead one)
    start      a fresh group in the same bundles, a fresh rendezvous, the model from the checkpoint
    publish    the restored weights as the next version above the one served (versions only rise)
    rewind     the driver's counters and the metrics file to the checkpoint: the iterations since
               are redone, so none is repeated in the record and none is skipped

Charged to the actor's restart budget (``restart:`` in the YAML); the run stops with the failure
report once it is spent. Rollout and env workers are not touched: they keep serving, and take the
re-published weights through the normal barrier.
"""

from __future__ import annotations

import time
from typing import Any

from examples.ppo_cartpole import reporting
from examples.ppo_cartpole.launch import Components
from examples.ppo_cartpole.state import DriverState
from rlinfra.runtime.errors import WorkerGroupError
from rlinfra.runtime.supervision import REFUSED, RESTARTED, Restart, RestartBudgetExhausted
from rlinfra.services.supervisor import UnsupervisedLoss
from rlinfra.services.weights import WeightSync, WeightSyncError


def restart_trainer(
    live: Components,
    sync: WeightSync,
    state: DriverState,
    log: reporting.MetricsLog,
    checkpoint: tuple[bytes, dict[str, Any]] | None,
    loss: UnsupervisedLoss,
) -> Restart:
    """See the module docstring; returns the record of the restart (also kept in ``state``)."""
    started, wall = time.monotonic(), time.time()
    actor = live.actor
    lost_ranks = loss.gone.get(actor.name, [])
    rank = lost_ranks[0] if lost_ranks else 0
    node_rank = actor.node_rank_of(rank)
    assert live.trainer_budget is not None and live.start_trainer is not None and live.supervisor is not None
    try:
        live.trainer_budget.charge(actor.name, rank, node_rank)
    except RestartBudgetExhausted as spent:  # the run stops; the report lists this refusal
        state.trainer_restarts.append(
            Restart(
                actor.name, rank, node_rank, str(loss.cause).splitlines()[0], wall, 0.0, REFUSED, str(spent)
            )
        )
        raise
    actor.shutdown()
    actor_bytes, saved = checkpoint if checkpoint is not None else (None, None)
    version = live.start_trainer(actor_bytes, sync.version)
    sync.replace_sender(live.actor)
    live.supervisor.watched = [live.actor]
    _publish(live, sync, version)  # the restored weights, served before anything is collected again
    state.served_versions.append(sync.version)
    back_to = int(saved["iteration"]) if saved is not None else 0
    state.ledger.dropped(state.ledger.open_ids)  # made with the lost trainer's weights
    state.ledger.rolled_back(after_iteration=back_to)
    state.rewind(saved)
    log.rewind(back_to)
    detail = f"from the checkpoint of iteration {back_to}" if saved is not None else "from scratch"
    reason = f"lost rank(s) {lost_ranks}: {str(loss.cause).splitlines()[0]}"
    restart = Restart(
        actor.name, rank, node_rank, reason, wall, time.monotonic() - started, RESTARTED, detail
    )
    state.trainer_restarts.append(restart)
    return restart


def _publish(live: Components, sync: WeightSync, version: int) -> None:
    """``sync.update(version)``, again after replacing a rollout worker that died during it."""
    assert live.supervisor is not None
    while True:
        try:
            sync.update(version)
            return
        except (WorkerGroupError, WeightSyncError) as error:
            live.supervisor.heal(error)  # re-raises when nobody died; budgets bound the retries
