"""The loop's bookkeeping in ``Run``, in process: a ``Run`` built without Ray (its constructor
starts none) over fake groups, a fake weight sync and a ``Job`` whose step gathers batches under
ids. What is checked: the iterations and their records, checkpoints, stale batches dropped, every
recovery said (state, metrics, console), a lost trainer rank restarting the trainer from the last
checkpoint with the state, the metrics and the ledger rewound, and every batch id ending once."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from rlinfra.driver.checkpoints import CheckpointError, CheckpointStore
from rlinfra.driver.failure_report import failed_ranks
from rlinfra.driver.job import BUDGET, TARGET, Batch, Job
from rlinfra.driver.metrics import read_events, read_metrics
from rlinfra.driver.run import Run
from rlinfra.driver.settings import RunSettings
from rlinfra.driver.state import RunState
from rlinfra.driver.supervisor import Supervisor, UnsupervisedLoss
from rlinfra.placement.restart import RestartPolicy
from rlinfra.runtime.supervision import REFUSED, RESTARTED, RestartBudget, RestartBudgetExhausted
from tests.driver.fakes import FakeGroup, FakeSync, Made, gone_failure


def collect(rank: int, batch_id: str) -> tuple[Any, ...]:
    return (batch_id,)


class LoopJob(Job):
    """Each iteration gathers one batch per env rank, issues the next ones (pipelined: they are in
    flight across the update), then updates on what it gathered. ``faults`` maps an iteration to
    what happens during its step: ``"env"`` (env rank 1 dies) or ``"trainer"`` (trainer rank 1
    dies during the update, once)."""

    title, unit, target_key = "loop", "iteration", "score"

    def __init__(self, folder: Path, total: int, faults: dict[int, str] | None = None, target=None) -> None:
        self.settings = RunSettings(output_dir=str(folder), tensorboard=False, plot=False, checkpoint_every=2)
        self.state = RunState()
        self.total = total
        self.faults = dict(faults or {})
        self.goal = target
        self.env = FakeGroup("env", 3)
        self.starts = 0
        self.started: list[tuple[bytes | None, int | None]] = []  # the trainer's (re)starts

    def start(self, run: Run) -> None:
        self.starts += 1
        self.pending = run.generate(self.env, "collect", collect)

    def step(self, run: Run) -> dict[str, Any]:
        fault = self.faults.get(run.state.iteration + 1)
        if fault == "env":
            self.env.kill(1)
        batches = run.gather(self.pending)
        self.pending = run.generate(self.env, "collect", collect)
        if fault == "trainer":
            del self.faults[run.state.iteration + 1]  # once: the redone iteration goes through

            def update() -> None:
                run.trainer.kill(1)
                raise gone_failure(run.trainer.name, [1])

            run.on_trainer(update)
        run.updated(b.id for b in batches)
        return {"score": float(run.state.iteration)}

    def trainer_state(self, run: Run) -> bytes:
        return f"trainer@{run.state.iteration}".encode()

    def target(self) -> float | None:
        return self.goal


def make_run(tmp_path: Path, total: int = 4, **job: Any) -> tuple[Run, LoopJob, io.StringIO]:
    """A ``Run`` wired as ``execute`` would after ``job.launch``: the trainer, the weight sync to
    the receivers, the supervisor (env supervised, trainer watched) and the trainer's restart."""
    loop = LoopJob(tmp_path, total, **job)
    out = io.StringIO()
    run = Run(loop, {}, console=Console(file=out, width=200))
    run.trainer = FakeGroup("actor", 2)
    rollout = FakeGroup("rollout", 2)
    run.sync = FakeSync(rollout, version=5)  # type: ignore[assignment]
    run.supervise([loop.env])

    def start(checkpoint: bytes | None, publish_above: int | None) -> int:
        loop.started.append((checkpoint, publish_above))
        run.trainer = FakeGroup("actor", 2)
        return (publish_above or 0) + 1

    run._restart_with = (start, RestartBudget(RestartPolicy(max_restarts=1, within_s=600)))
    return run, loop, out


def finish(run: Run) -> None:
    """What ``execute`` does however the run ends: in-flight batch ids end, the log is closed."""
    run._end_open_batches()
    run.log.close()


def test_the_loop_runs_its_budget_with_a_record_and_checkpoints_and_every_id_ends_once(tmp_path):
    run, _, _ = make_run(tmp_path, total=3)
    assert run._iterate() == BUDGET
    finish(run)
    records = read_metrics(tmp_path)
    assert [r["iteration"] for r in records] == [1, 2, 3]
    assert all(r["served_version"] == 5 and r["learner_version"] == 5 for r in records)
    times = [r["time_s"] for r in records]  # the job never asks: the run's clock counts each step
    assert times == sorted(times) and times[-1] == round(run.state.training_s, 3) and run.state.training_s > 0
    saved = CheckpointStore(tmp_path).load_latest()
    assert saved is not None and saved.step == 3 and saved.payloads["actor"] == b"trainer@3"
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*")) == [
        "step-00000002",
        "step-00000003",
    ]  # every 2 iterations and at the last
    summary = run.state.ledger.summary()
    assert summary == {
        "issued": 12, "trained": 9, "dropped": 3, "lost": 0, "rolled_back": 0, "open": 0, "duplicated": 0,
    }  # fmt: skip


def test_the_loop_stops_at_the_target(tmp_path):
    run, _, _ = make_run(tmp_path, total=10, target=2.0)
    assert run._iterate() == TARGET
    assert run.state.iteration == 2


def test_a_worker_death_mid_loop_is_said_in_the_state_the_metrics_and_the_console(tmp_path):
    run, loop, out = make_run(tmp_path, total=3, faults={2: "env"})
    assert run._iterate() == BUDGET
    finish(run)
    assert [(r.component, r.rank) for r in loop.env.restarts] == [("env", 1)]
    assert len(run.state.recoveries) == 1
    (event,) = run.state.events
    assert event["event"] == "replaced" and (event["component"], event["rank"], event["node"]) == (
        "env",
        1,
        1,
    )
    assert event["iteration"] == 1 and event["cause"].startswith(
        "worker group 'env': collect failed on rank(s) 1"
    )
    assert read_events(tmp_path) == [event]
    assert "recovered env:1 on node 1: replaced after worker group 'env'" in out.getvalue()
    summary = run.state.ledger.summary()
    assert (summary["lost"], summary["trained"], summary["open"], summary["duplicated"]) == (1, 9, 0, 0)


def test_a_dropped_rank_is_said_as_dropped(tmp_path):
    run, _, out = make_run(tmp_path)
    rollout = FakeGroup("rollout", 3, nodes=[0, 0, 1])
    run.supervisor = Supervisor([rollout], shrinkable=[rollout])
    rollout.lose_node(1)
    run.heal(gone_failure("rollout", [2]))
    (event,) = run.state.events
    assert (event["event"], event["component"], event["rank"], event["detail"]) == (
        "dropped",
        "rollout",
        2,
        "node lost",
    )
    assert "rollout:2: dropped after" in out.getvalue() and "the run goes on without it" in out.getvalue()


def test_a_lost_trainer_rank_restarts_the_trainer_from_the_last_checkpoint_and_rewinds(tmp_path):
    run, loop, out = make_run(tmp_path, total=4, faults={4: "trainer"})
    lost = run.trainer
    assert run._iterate() == BUDGET
    finish(run)
    assert lost.shut_down and run.trainer is not lost
    assert loop.started == [(b"trainer@2", 5)]  # the checkpoint of iteration 2, published above v5
    assert run.sync.updates == [6] and run.sync.sender is run.trainer  # type: ignore[union-attr]
    assert run.supervisor is not None and run.supervisor.watched == [run.trainer]
    assert loop.starts == 2  # batches issued again after the restart
    (restart,) = run.state.trainer_restarts
    assert (restart.component, restart.rank, restart.outcome, restart.detail) == (
        "actor", 1, RESTARTED, "from the checkpoint of iteration 2",
    )  # fmt: skip
    (event,) = run.state.events
    assert event["event"] == RESTARTED and event["restored_iteration"] == 2 and event["iteration"] == 2
    assert "recovered actor:1 on node 1: restarted" in out.getvalue()
    # iterations 3 and 4 are redone: each logged once, the rolled-back batches never trained again
    assert [r["iteration"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4]
    ledger = run.state.ledger
    assert ledger.summary()["rolled_back"] == 3 and ledger.summary()["duplicated"] == 0
    assert ledger.open_ids == [] and sorted(set(ledger.trained_in.values())) == [1, 2, 3, 4]
    assert run.state.served_versions == [5, 6]


def test_a_trainer_restart_refused_by_its_budget_is_recorded_and_stops_the_run(tmp_path):
    run, loop, _ = make_run(tmp_path)
    start, _ = run._restart_with  # type: ignore[misc]
    run._restart_with = (start, RestartBudget(RestartPolicy(max_restarts=0, within_s=600)))
    lost = run.trainer
    loss = UnsupervisedLoss({"actor": [1]}, gone_failure("actor", [1]))
    with pytest.raises(RestartBudgetExhausted):
        run._restart_trainer(loss)
    (refused,) = run.state.trainer_restarts
    assert (refused.component, refused.rank, refused.outcome) == ("actor", 1, REFUSED)
    assert not lost.shut_down and loop.started == []


def test_fresh_keeps_batches_within_the_staleness_and_drops_the_others(tmp_path):
    run, _, _ = make_run(tmp_path)
    run.staged_version = 8  # the learner's version: staged, not served yet
    ledger = run.state.ledger
    batches = [
        Batch(rank, ledger.issue(f"env:{rank}"), Made(rank, 0, "collect", (v,)))
        for rank, v in enumerate([8, 6, 5])
    ]
    kept = run.fresh(batches, max_staleness=2, version=lambda b: b.value.args[0])
    assert [b.rank for b in kept] == [0, 1]
    assert ledger.ended == {batches[2].id: "dropped"} and run.state.dropped_batches == 1
    assert run.state.batch_versions == [[8, 6, 5]]
    record = run._standard_record()
    assert (record["learner_version"], record["served_version"]) == (8, 5)
    assert (record["batch_version"], record["staleness"], record["dropped"]) == (5, 3, 1)


def test_a_step_that_forgets_updated_stops_the_loop(tmp_path):
    run, loop, _ = make_run(tmp_path)
    loop.step = lambda run: {"score": 0.0}  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match=r"LoopJob.step returned without run.updated\(\)"):
        run._iterate()


def test_the_failure_report_names_the_ranks_of_each_kind_of_error():
    loss = UnsupervisedLoss({"actor": [0, 1]}, gone_failure("actor", [0, 1]))
    assert [(f.component, f.rank, f.kind) for f in failed_ranks(loss)] == [
        ("actor", 0, "lost"),
        ("actor", 1, "lost"),
    ]
    spent = RestartBudgetExhausted("env", 2, 1, "restart budget spent")
    assert [(f.component, f.rank, f.node_rank, f.kind) for f in failed_ranks(spent)] == [
        ("env", 2, 1, "unreplaceable")
    ]
    wrapped = RuntimeError("outer")
    wrapped.__cause__ = gone_failure("rollout", [3])
    assert [(f.component, f.rank, f.reason) for f in failed_ranks(wrapped)] == [
        ("rollout", 3, "the worker process died")
    ]


def test_resuming_under_another_trainer_name_is_refused_naming_both(tmp_path):
    run, _, _ = make_run(tmp_path, total=2)
    assert run._iterate() == BUDGET
    finish(run)
    renamed = LoopJob(tmp_path, 2)
    renamed.components = ("learner", *renamed.components)
    renamed.settings = renamed.settings.model_copy(update={"trainer": "learner"})
    with pytest.raises(CheckpointError, match=r"holds the state of 'actor', not of run.trainer 'learner'"):
        Run(renamed, {}, resume=True)
