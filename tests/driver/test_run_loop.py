"""The loop's bookkeeping in ``Run``, in process: a ``Run`` built without Ray (its constructor
starts none) over fake groups, a fake weight sync and a ``Job`` whose loop gathers batches under
ids. What is checked: the steps and their records, the versions staged and committed, checkpoints,
stale batches dropped, every recovery said (state, metrics, console), a lost trainer rank
restarting the trainer from the last checkpoint with the state, the metrics and the ledger
rewound, every batch id ending once, and each broken contract named where it is broken."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from rlinfra.driver import Batch, ContractError, Job, Update
from rlinfra.driver.checkpoints import CheckpointError, CheckpointStore
from rlinfra.driver.failure_report import failed_ranks
from rlinfra.driver.metrics import read_events, read_metrics
from rlinfra.driver.result import BUDGET, TARGET
from rlinfra.driver.run import Run
from rlinfra.driver.settings import RunSettings
from rlinfra.driver.steps import Step
from rlinfra.driver.supervisor import Supervisor, UnsupervisedLoss
from rlinfra.placement.restart import RestartPolicy
from rlinfra.runtime.supervision import REFUSED, RESTARTED, RestartBudget, RestartBudgetExhausted
from tests.driver.fakes import FakeGroup, FakeSync, Made, gone_failure


class Makers(FakeGroup):
    """Env workers: ``collect(batch_id)`` returns a ``Batch`` made with the version served."""

    def __init__(self, name: str, size: int, sync: FakeSync | None = None) -> None:
        super().__init__(name, size)
        self.sync = sync

    def answer(self, method: str, rank: int, incarnation: int, args: tuple[Any, ...]) -> Any:
        version = self.sync.version if self.sync is not None else 0
        return Batch(args[0], version, Made(rank, incarnation, method, args))


class Trainer(FakeGroup):
    """Trainer ranks: ``train(batches)`` counts an update (once per call) and reports every id."""

    def __init__(self, name: str, size: int, count: int) -> None:
        super().__init__(name, size)
        self.count = count

    def answer(self, method: str, rank: int, incarnation: int, args: tuple[Any, ...]) -> Any:
        if rank == 0:
            self.count += 1
        return Update(self.count, [b.id for b in args[0]], {"loss": 0.5})


class LoopJob(Job):
    """Each step gathers one batch per env rank, commits the staged version, issues the next
    batches (pipelined: in flight across the update), then updates on what it gathered.
    ``faults`` maps a step to what happens during it: ``"env"`` (env rank 1 dies) or
    ``"trainer"`` (trainer rank 1 dies during the update, once)."""

    title, unit, target_key = "loop", "iteration", "score"

    def __init__(self, folder: Path, total: int, faults: dict[int, str] | None = None, target=None) -> None:
        self.settings = RunSettings(output_dir=str(folder), tensorboard=False, plot=False, checkpoint_every=2)
        super().__init__({"run": self.settings.model_dump()})
        self.total = total
        self.faults = dict(faults or {})
        self.goal = target
        self.env = Makers("env", 3)
        self.loops = 0
        self.started: list[tuple[bytes | None, int | None]] = []  # the trainer's (re)starts
        self.body = self.step

    def loop(self, run: Run) -> None:
        self.loops += 1
        trainer = run.start_trainer(lambda: Trainer("actor", 2, 0))  # make_run started it
        envs = run.batches(self.env, "collect")
        for step in run.steps(self.total):
            self.body(run, step, trainer, envs)

    def step(self, run: Run, step: Step, trainer: Any, envs: Any) -> None:
        fault = self.faults.get(step.number)
        if fault == "env":
            self.env.kill(1)
        batches = envs.gather()
        run.commit()
        envs.issue()
        method = lambda batches: trainer.call("train", args=(batches,))  # noqa: E731
        if fault == "trainer":
            del self.faults[step.number]  # once: the redone step goes through

            def method(batches: list[Batch]) -> Any:
                trainer.kill(1)
                raise gone_failure(trainer.name, [1])

        step.train(method, step.drop_stale(batches, 1))
        step.log(score=float(step.number))

    def trainer_state(self, run: Run, group: Any) -> bytes:
        return f"{group.name}@{run.state.iteration}".encode()

    def target(self) -> float | None:
        return self.goal


def make_run(tmp_path: Path, total: int = 4, **job: Any) -> tuple[Run, LoopJob, io.StringIO]:
    """A ``Run`` wired as ``job.loop``'s launches would wire it: the trainer (its own count at 5,
    as served), the weight sync to the receivers, the supervisor (env supervised, trainer
    watched) and the trainer's restart."""
    loop = LoopJob(tmp_path, total, **job)
    out = io.StringIO()
    run = Run(loop, {}, console=Console(file=out, width=200))
    run.trainer = Trainer("actor", 2, count=5)
    run.trainers = {"actor": run.trainer}
    run.sync = FakeSync(FakeGroup("rollout", 2), version=5)  # type: ignore[assignment]
    loop.env.sync = run.sync  # type: ignore[assignment]
    run._groups = [loop.env]
    run.supervise()

    def start(checkpoint: bytes | None, publish_above: int | None) -> int:
        loop.started.append((checkpoint, publish_above))
        run.trainer = run.trainers["actor"] = Trainer("actor", 2, count=0)
        return run.state.published(0, publish_above)

    run._restart_with = {"actor": (start, RestartBudget(RestartPolicy(max_restarts=1, within_s=600)))}
    return run, loop, out


def finish(run: Run) -> None:
    """What ``execute`` does however the run ends: in-flight batch ids end, the log is closed."""
    run._end_open_batches()
    run.out.log.close()


def test_the_loop_runs_its_budget_with_a_record_and_checkpoints_and_every_id_ends_once(tmp_path):
    run, _, _ = make_run(tmp_path, total=3)
    run._loop()
    assert run.outcome == BUDGET
    finish(run)
    records = read_metrics(tmp_path)
    assert [r["iteration"] for r in records] == [1, 2, 3]
    # each step's update staged (the learner's version), committed at the next step's start
    assert [(r["served_version"], r["learner_version"]) for r in records] == [(5, 6), (6, 7), (7, 8)]
    assert all(r["loss"] == 0.5 and r["score"] == r["iteration"] for r in records)  # logged
    assert [r["batch_version"] for r in records] == [5, 5, 6]  # the first two batches: before any commit
    times = [r["time_s"] for r in records]  # the job never asks: the run's clock counts each step
    assert times == sorted(times) and times[-1] == round(run.state.training_s, 3) and run.state.training_s > 0
    saved = CheckpointStore(tmp_path).load_latest()
    assert saved is not None and saved.step == 3 and saved.payloads["actor"] == b"actor@3"
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
    run._loop()
    assert run.outcome == TARGET
    assert run.state.iteration == 2


def test_a_worker_death_mid_loop_is_said_in_the_state_the_metrics_and_the_console(tmp_path):
    run, loop, out = make_run(tmp_path, total=3, faults={2: "env"})
    run._loop()
    finish(run)
    assert [(r.component, r.rank) for r in loop.env.restarts] == [("env", 1)]
    assert len(run.state.recoveries) == 1
    (event,) = run.state.events
    assert event["event"] == "replaced" and (event["component"], event["rank"], event["node"]) == (
        "env",
        1,
        1,
    )
    assert event["iteration"] == 1 and event["cause"] == "the worker process died"
    assert read_events(tmp_path) == [event]
    assert "recovered env:1 on node 1: replaced after the worker process died" in out.getvalue()
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
    run._loop()
    assert run.outcome == BUDGET
    finish(run)
    assert lost.shut_down and run.trainer is not lost
    assert loop.started == [(b"actor@2", 8)]  # the checkpoint of iteration 2, published above v8
    assert run.sync.updates == [9] and run.sync.sender is run.trainer  # type: ignore[union-attr]
    assert run.supervisor is not None and run.supervisor.watched == [run.trainer]
    assert loop.loops == 2  # the loop runs again: its batches issued again, from the restored trainer
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
    assert run.state.served_versions == [5, 6, 7, 8, 9, 10]  # versions only rise


def with_a_critic(run: Run, loop: LoopJob, fault_at: int | None = None) -> list[bytes | None]:
    """A second trained group, ``critic`` (one rank), updated after the actor in every step;
    at step ``fault_at`` its rank dies during its update (once). Returns its (re)starts."""
    run.trainers["critic"] = Trainer("critic", 1, count=0)
    assert run.supervisor is not None
    run.supervisor.watched = list(run.trainers.values())
    started: list[bytes | None] = []

    def start(checkpoint: bytes | None, publish_above: int | None) -> int:
        started.append(checkpoint)
        run.trainers["critic"] = Trainer("critic", 1, count=0)
        return 0

    run._restart_with["critic"] = (start, RestartBudget(RestartPolicy(max_restarts=1, within_s=600)))

    def body(run: Run, step: Step, trainer: Any, envs: Any) -> None:
        batches = envs.gather()
        run.commit()
        envs.issue()
        step.train(run.trainers["actor"].method("train"), batches)
        critic = run.trainers["critic"]
        if step.number == fault_at and not started:  # once: the redone step goes through
            critic.kill(0)
        step.train(critic.method("train"), batches)
        step.log(score=float(step.number))

    loop.body = body
    return started


def test_two_trained_groups_update_each_step_and_are_checkpointed_each_with_its_own_payload(tmp_path):
    run, loop, _ = make_run(tmp_path, total=2)
    with_a_critic(run, loop)
    run._loop()
    finish(run)
    saved = CheckpointStore(tmp_path).load_latest()
    assert saved is not None and saved.payloads == {"actor": b"actor@2", "critic": b"critic@2"}
    records = read_metrics(tmp_path)
    assert all(r["loss"] == r["critic_loss"] == 0.5 for r in records)  # each under its own name
    assert [r["learner_version"] for r in records] == [6, 7]  # the actor's versions only are staged
    ledger = run.state.ledger.summary()  # both report every id: each ends trained once
    assert (ledger["trained"], ledger["duplicated"]) == (6, 0)


def test_a_step_that_updates_one_of_two_trained_groups_is_refused_naming_the_other(tmp_path):
    run, loop, _ = make_run(tmp_path)
    with_a_critic(run, loop)
    loop.body = lambda run, step, trainer, envs: step.train(
        run.trainers["actor"].method("train"), envs.gather()
    )
    with pytest.raises(ContractError, match=r"step 1 ended without step.train\(...\) of critic"):
        run._loop()


def test_a_lost_critic_rank_restarts_both_trained_groups_each_from_its_own_payload(tmp_path):
    run, loop, _ = make_run(tmp_path, total=4)
    critic_starts = with_a_critic(run, loop, fault_at=4)
    lost_actor = run.trainers["actor"]
    run._loop()
    finish(run)
    assert critic_starts == [b"critic@2"] and loop.started == [(b"actor@2", 8)]
    assert lost_actor.shut_down and run.trainers["actor"] is run.trainer is not lost_actor
    restarts = {r.component: r for r in run.state.trainer_restarts}
    assert restarts["critic"].reason.startswith("lost rank(s) [0]")
    assert restarts["actor"].reason.startswith("with critic:")  # restarted with it, nothing lost
    assert [(e["component"], e["restored_iteration"]) for e in run.state.events] == [
        ("actor", 2),
        ("critic", 2),
    ]
    assert [r["iteration"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4]
    saved = CheckpointStore(tmp_path).load_latest()
    assert saved is not None and saved.payloads == {"actor": b"actor@4", "critic": b"critic@4"}


def test_a_trainer_restart_refused_by_its_budget_is_recorded_and_stops_the_run(tmp_path):
    run, loop, _ = make_run(tmp_path)
    start, _ = run._restart_with["actor"]
    run._restart_with["actor"] = (start, RestartBudget(RestartPolicy(max_restarts=0, within_s=600)))
    lost = run.trainer
    loss = UnsupervisedLoss({"actor": [1]}, gone_failure("actor", [1]))
    with pytest.raises(RestartBudgetExhausted):
        run._restart_trainer(loss)
    (refused,) = run.state.trainer_restarts
    assert (refused.component, refused.rank, refused.outcome) == ("actor", 1, REFUSED)
    assert not lost.shut_down and loop.started == []


def test_drop_stale_keeps_batches_within_the_staleness_and_drops_the_others(tmp_path):
    run, _, _ = make_run(tmp_path)
    run.staged_version = 8  # the learner's version: staged, not served yet
    ledger = run.state.ledger
    batches = [Batch(ledger.issue(f"env:{rank}"), v, None, rank) for rank, v in enumerate([8, 6, 5])]
    step = Step(run, 1, last=False)
    kept = step.drop_stale(batches, max_staleness=2)
    assert [b.rank for b in kept] == [0, 1]
    assert ledger.ended == {batches[2].id: "dropped"} and run.state.dropped_batches == 1
    assert run.state.batch_versions == [[8, 6, 5]]
    record = run._standard_record() | step.record
    assert (record["learner_version"], record["served_version"]) == (8, 5)
    assert (record["batch_version"], record["staleness"], record["dropped"]) == (5, 3, 1)


def test_a_step_without_an_update_stops_the_loop_naming_it(tmp_path):
    run, loop, _ = make_run(tmp_path)
    loop.body = lambda run, step, trainer, envs: envs.gather()
    with pytest.raises(ContractError, match=r"step 1 ended without step.train\(...\) of actor"):
        run._loop()


def test_a_second_update_in_one_step_is_refused(tmp_path):
    run, loop, _ = make_run(tmp_path)

    def twice(run: Run, step: Step, trainer: Any, envs: Any) -> None:
        step.train(lambda batches: trainer.call("train", args=(batches,)), envs.gather())
        step.train(lambda batches: trainer.call("train", args=(batches,)), [])

    loop.body = twice
    with pytest.raises(ContractError, match=r"step 1: actor was trained twice"):
        run._loop()


def test_an_update_whose_predecessor_was_never_committed_is_refused(tmp_path):
    run, loop, _ = make_run(tmp_path)

    def no_commit(run: Run, step: Step, trainer: Any, envs: Any) -> None:
        step.train(lambda batches: trainer.call("train", args=(batches,)), envs.gather())
        step.log(score=0.0)

    loop.body = no_commit
    with pytest.raises(ContractError, match=r"version 6, staged by the last update, was never served"):
        run._loop()
    assert run.state.iteration == 1


def test_a_batch_issued_twice_without_a_gather_is_refused(tmp_path):
    run, loop, _ = make_run(tmp_path)
    loop.body = lambda run, step, trainer, envs: (envs.issue(), envs.issue())
    with pytest.raises(
        ContractError, match=r"env: collect is already in flight; gather\(\) its batches first"
    ):
        run._loop()


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (
            {"batch_id": "x"},
            r"env: collect returned dict; expected rlinfra.driver.Batch\(id, version, payload, rank\)",
        ),
        (
            Batch("another", 5, None),
            r"env: collect returned a Batch with id 'another'; expected the id it was given",
        ),
    ],
)
def test_a_maker_that_returns_no_batch_of_its_own_is_named(tmp_path, answer, message):
    run, loop, _ = make_run(tmp_path)
    loop.env.answer = lambda *args: answer  # type: ignore[method-assign]
    with pytest.raises(ContractError, match=message):
        run._loop()


def test_a_trainer_that_returns_no_update_is_named(tmp_path):
    run, _loop, _ = make_run(tmp_path)
    run.trainer.answer = lambda *args: {"weight_version": 6}  # type: ignore[method-assign]
    with pytest.raises(
        ContractError, match=r"returned dict; expected rlinfra.driver.Update\(version, batch_ids"
    ):
        run._loop()


def test_batches_the_trainer_could_not_read_are_lost_and_the_update_made_on_the_others(tmp_path):
    run, _loop, _ = make_run(tmp_path, total=1)
    answer = run.trainer.answer
    seen: list[int] = []

    def lose_the_first(method: str, rank: int, incarnation: int, args: tuple[Any, ...]) -> Any:
        seen.append(len(args[0]))
        if len(args[0]) == 3:  # the first call: batch 0's maker died after making it
            return Update(5, [], lost=[args[0][0].id])
        return answer(method, rank, incarnation, args)

    run.trainer.answer = lose_the_first  # type: ignore[method-assign]
    run._loop()
    finish(run)
    assert seen == [3, 3, 2, 2]  # two ranks each: all three, then the two left
    summary = run.state.ledger.summary()
    assert (summary["lost"], summary["trained"]) == (1, 2)


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
    run._loop()
    finish(run)
    renamed = LoopJob(tmp_path, 2)
    renamed.components = ("learner", *renamed.components)
    renamed.settings = renamed.settings.model_copy(update={"trainer": "learner"})
    with pytest.raises(CheckpointError, match=r"holds the state of 'actor', not of run.trainer 'learner'"):
        Run(renamed, {}, resume=True)


def test_a_job_whose_trainer_feeds_no_receiving_group_trains_and_stages_nothing(tmp_path):
    run, _, _ = make_run(tmp_path, total=2)
    run.sync = None
    run._loop()
    finish(run)
    records = read_metrics(tmp_path)
    assert [(r["iteration"], r["served_version"], r["learner_version"]) for r in records] == [
        (1, 0, 0),
        (2, 0, 0),
    ]


def test_a_trainer_that_reports_batches_it_was_not_given_as_lost_is_named(tmp_path):
    run, _, _ = make_run(tmp_path)
    run.trainer.answer = lambda *args: Update(5, [], lost=["env:9#99"])  # type: ignore[method-assign]
    with pytest.raises(ContractError, match=r"reported as lost batches it was not given: \['env:9#99'\]"):
        run._loop()


def test_the_closing_line_gives_the_first_crossing_its_own_iteration_and_time(tmp_path):
    run, loop, _ = make_run(tmp_path, total=5, target=2.0)
    loop.stop_at_target = False  # trains on past the target: the crossing is not the last iteration
    run._loop()
    finish(run)
    run.out.end("first crossing")
    result = run.result
    crossing = next(r for r in read_metrics(tmp_path) if r.get("score", 0) >= 2.0)
    assert (result.iterations_to_target, result.time_to_target_s) == (2, crossing["time_s"])
    assert result.report().startswith(
        f"reached score 2 at iteration 2, {crossing['time_s']:.1f} s of training; 5 iterations in all"
    )
