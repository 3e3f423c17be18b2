"""``Run``: a supervised, versioned RL driver loop, owned once; a ``Job`` supplies the algorithm.

What a job writes (see ``Job``): which components its YAML places, how to launch its worker groups
(``launch``), how to begin making batches (``start``) and one iteration (``step``). The rest is
here, in this order:

    parse       the cluster, the placement, the job's components checked (no Ray yet on errors)
    reserve     one placement group for the layout, shown as tables before any worker starts
    launch      the job's groups; the trainer with its rendezvous and checkpoint; the weight
                barrier to the receivers; the supervisor; time-sharing when they share devices
    iterate     ``job.step`` until the budget or the target; each record logged (JSONL and
                TensorBoard), shown, checkpointed every ``run.checkpoint_every``
    ride out    a dead rollout/env/reward worker is replaced inside the calls the job makes
                (``retried``, ``gather``, ``on_trainer``); a lost trainer rank restarts the trainer
                group from the last checkpoint and rewinds the state, the metrics and the ledger;
                each is a console line, a metrics event and an entry of ``summary.json``
    end         however the run ends (budget, target, Ctrl-C/SIGTERM, failure) every batch id in
                flight is ended, the failure (if any) reported, every worker and the placement
                group released, ``summary.json`` written
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rlinfra.config import JobConfigError, did_you_mean
from rlinfra.driver.checkpoints import CheckpointError, CheckpointStore
from rlinfra.driver.failure_report import FailureReport
from rlinfra.driver.metrics import MetricsLog, read_metrics
from rlinfra.driver.signals import CtrlC, sigint_ignored
from rlinfra.driver.supervisor import Recovery, Supervisor, UnsupervisedLoss
from rlinfra.placement import ComponentPlacement, PlacementError
from rlinfra.runtime.cluster import Cluster
from rlinfra.runtime.errors import WorkerGroupError
from rlinfra.runtime.group import WorkerGroup
from rlinfra.runtime.layout import Layout
from rlinfra.runtime.rendezvous import bring_up
from rlinfra.runtime.supervision import REFUSED, RESTARTED, Restart, RestartBudget, RestartBudgetExhausted
from rlinfra.runtime.timesharing import TimeSharing
from rlinfra.services.weights import WeightSync
from rlinfra.services.weights.probe import LogprobProbe, Sequences
from rlinfra.views.node_view import node_loads
from rlinfra.views.plan_view import render_plan

from .entry import plot_curve
from .job import BUDGET, FAILED, INTERRUPTED, SUMMARY_FILE, TARGET, Batch, Job, RunResult, check_trainer
from .supervised import Pending, SupervisedSteps

PLACEMENT_FILE = "placement.json"
CURVE_FILE = "curve.png"
StartTrainer = Callable[[bytes | None, int | None], int]
"""``start(checkpoint, publish_above)``: the trainer group (``run.trainer``) launched and restored
from ``checkpoint`` (None: from scratch); returns the version its weights are published as, above
``publish_above`` when given."""


class Run(SupervisedSteps):
    """One run of ``job`` on the config ``cfg`` (its ``cluster`` section is rlinfra's); the calls
    that ride out faults (``retried``, ``generate``/``gather``, ``lost``, ``on_trainer``, ``heal``)
    are ``SupervisedSteps``'. ``cluster``: an existing cluster to use and leave running;
    ``on_iteration`` sees each record as it is written; ``between_batches(run)`` runs at an
    iteration's first ``commit``, when no batch is in flight (elastic scaling: ``run.resize``);
    ``resume`` continues from the last checkpoint in ``run.output_dir``."""

    def __init__(
        self,
        job: Job,
        cfg: Mapping[str, Any],
        *,
        resume: bool = False,
        cluster: Cluster | None = None,
        console: Console | None = None,
        on_iteration: Callable[[dict[str, Any]], None] | None = None,
        between_batches: Callable[[Run], None] | None = None,
    ) -> None:
        self.job, self.cfg, self.settings, self.state = job, cfg, job.settings, job.state
        if job.components and self.settings.trainer not in job.components:
            hint = did_you_mean(self.settings.trainer, job.components)
            raise JobConfigError(
                f"{self.settings.trainer!r} is not a component of the {job.title} job"
                + (f"; {hint}" if hint else ""),
                where="run.trainer",
                expected="one of " + ", ".join(repr(name) for name in job.components),
            )
        self.console = console or Console()
        self.between_batches, self.on_iteration = between_batches, on_iteration
        self.output = Path(job.settings.output_dir)
        self.store = CheckpointStore(self.output)
        saved = self.store.load_latest() if resume else None
        if resume and saved is None:
            raise FileNotFoundError(
                f"--resume: no checkpoint in {self.output / 'checkpoints'}; run once without --resume first"
            )
        # The trainer's payload and the driver's state a restart goes back to (none: the start).
        self._last_checkpoint: tuple[bytes | None, dict[str, Any] | None] = (None, None)
        if saved is not None:
            if self.settings.trainer not in saved.payloads:
                raise CheckpointError(
                    f"--resume: the checkpoint in {self.output / 'checkpoints'} holds the state of "
                    f"{', '.join(map(repr, saved.payloads))}, not of run.trainer {self.settings.trainer!r}"
                )
            self._last_checkpoint = (saved.payloads[self.settings.trainer], saved.state)
            self.state.load(saved.state)
        # Iterations logged after the checkpoint are redone: the log continues from it.
        resume_at = self.state.iteration if resume else None
        self.log = MetricsLog(self.output, resume_at, tensorboard=self.settings.tensorboard)
        self._given_cluster = cluster
        self.cluster: Cluster = cluster  # type: ignore[assignment]  # set in execute before any use
        self.placement: ComponentPlacement
        self.layout: Layout | None = None
        self.trainer: WorkerGroup = None  # type: ignore[assignment]  # start_trainer sets it
        self.sync: WeightSync | None = None
        self.supervisor: Supervisor | None = None
        self.turns: TimeSharing | None = None
        self.staged_version: int | None = None  # trained and staged on the receivers, not yet served
        self.sync_s = {"prepare_s": 0.0, "pause_s": 0.0, "held_s": 0.0}  # the last stage and commit
        self._probe: LogprobProbe | None = None
        self.logprob_mismatch: float | None = None  # the probe's, at the last committed version
        self._groups: list[WorkerGroup] = []
        self._in_flight: list[Pending] = []
        self._restart_with: tuple[StartTrainer, RestartBudget] | None = None  # start_trainer's
        self._awake: str | None = None
        self._updated = self._between_done = False
        self._freshness: dict[str, int] = {}  # the last ``fresh`` call's, for the record

    # ----------------------------------------------------------------------------- the life
    def execute(self) -> RunResult:
        """Place, launch, iterate; always release what was started (see the module docstring)."""
        started = time.perf_counter()
        job, state = self.job, self.state
        result = RunResult(job, self.output, resumed_from=state.iteration)
        try:
            self.cluster = self._given_cluster or Cluster(self.cfg["cluster"])
            self.placement = ComponentPlacement(self.cfg, self.cluster)
            self._reserve(result)
            job.check(self)
            with self.console.status("starting workers"):
                job.launch(self)
            if self.supervisor is None:
                self.supervise([])
            self._write_placement(result)
            result.outcome = self._iterate()
        except KeyboardInterrupt:
            result.outcome = INTERRUPTED
        except Exception as error:
            result.outcome = FAILED
            self._end_open_batches()
            if self.supervisor is not None:  # launched: the run failed, report it
                attempts = [*state.trainer_restarts, *(r for group in self._groups for r in group.restarts)]
                version = self.sync.version if self.sync is not None else None
                FailureReport.of_run(error, self.output, attempts, version, state.ledger.summary())
            raise
        finally:
            with sigint_ignored():  # a second Ctrl-C must not cut the cleanup short
                self._end_open_batches()
                self.log.close()
                self._release(result)
                self._measure_target(result)
                result.wall_s = time.perf_counter() - started
                summary = json.dumps(result.summary(), indent=1)
                (self.output / SUMMARY_FILE).write_text(summary, encoding="utf-8")
        return result

    def _measure_target(self, result: RunResult) -> None:
        """The training time to the target, from every metrics record (resumed runs included), and
        the curve towards it."""
        key, target = self.job.target_key, self.job.target()
        if not key or target is None:
            return
        points = [p for p in self.job.curve(read_metrics(self.output)) if p.get(key) is not None]
        result.time_to_target_s = next((p["time_s"] for p in points if p[key] >= target), None)
        if self.settings.plot:
            title = f"{self.job.title}: {self.cfg.get('name') or self.output.name}"
            result.plot = plot_curve(points, self.output / CURVE_FILE, key, target, title, self.job.unit)

    def _reserve(self, result: RunResult) -> None:
        missing = [name for name in self.job.components if name not in self.placement.components]
        if missing:
            raise PlacementError(
                f"the {self.job.title} job needs components {', '.join(self.job.components)}; missing "
                f"{', '.join(missing)}",
                where="cluster.component_placement",
            )
        with self.console.status("reserving the layout"):
            self.layout = layout = Layout(self.cluster, self.placement, self.job.components)
        # The same tables, map and layout as ``rlinfra plan``, for the live cluster and the
        # placement group just reserved, before any worker starts.
        cpus = [int(node.resources.get("CPU", 0)) for node in self.cluster.nodes]
        loads = node_loads(layout.plan, self.cluster.spec.num_nodes, cpus)
        render_plan(self.console, self.cluster.spec, self.placement, layout.plan, loads, show_all=False)
        self.console.print()
        pairs = zip(self.job.components, self.job.components[1:], strict=False)
        result.relations = {f"{a}-{b}": layout.plan.relation(a, b) for a, b in pairs}

    def _write_placement(self, result: RunResult) -> None:
        assert self.layout is not None
        names = self.job.components
        result.placements = {n: [p.to_dict() for p in self.placement.get_placements(n)] for n in names}
        result.misplaced_bundles = [
            f"{name}:{row.rank} planned on node {row.planned_node_rank}, placed on {row.node_rank}"
            for name in names
            for row in self.layout.bundle_report(name)
            if not row.matches
        ]
        placed = {"components": result.placements, "relations": result.relations}
        (self.output / PLACEMENT_FILE).write_text(json.dumps(placed, indent=1), encoding="utf-8")

    def _iterate(self) -> str:
        job, state, ctrl_c = self.job, self.state, CtrlC()
        self.state.served_versions.append(self.served_version)
        with ctrl_c.watching(), self._display() as show:
            job.start(self)
            self.clock = time.perf_counter()
            while state.iteration < job.total:
                self._updated, self._freshness, self._between_done = False, {}, False
                try:
                    record = job.step(self)
                except UnsupervisedLoss as loss:  # a trainer rank: the whole group, from the checkpoint
                    self._restart_trainer(loss)
                    job.start(self)
                    continue
                if not self._updated:
                    raise RuntimeError(f"{type(job).__name__}.step returned without run.updated()")
                self._tick()  # what the step did after its update (an evaluation) counts too
                record = self._standard_record() | record
                self.log.write(record)
                show(record)
                if self.on_iteration is not None:
                    self.on_iteration(record)
                if ctrl_c.pressed:  # its KeyboardInterrupt was swallowed somewhere: stop here
                    raise KeyboardInterrupt
                if job.stop_at_target and self._reached(record):
                    return TARGET
        return BUDGET

    def _standard_record(self) -> dict[str, Any]:
        """What every iteration's record has: progress, versions, the weight barrier's times, and
        the batches' versions (from ``fresh``)."""
        record: dict[str, Any] = {
            "iteration": self.state.iteration,
            "time_s": round(self.state.training_s, 3),
            "learner_version": self.learner_version,
            "served_version": self.served_version,
        } | {key: round(value, 5) for key, value in self.sync_s.items()}
        if self._probe is not None:
            record["logprob_mismatch"] = self.logprob_mismatch
        return record | self._freshness

    def _reached(self, record: dict[str, Any]) -> bool:
        target, value = self.job.target(), record.get(self.job.target_key)
        return target is not None and value is not None and value >= target

    @contextlib.contextmanager
    def _display(self) -> Iterator[Callable[[dict[str, Any]], None]]:
        """A progress bar (on a terminal only: in CI the lines say it all) and the job's lines."""
        console = self.console
        title, status = TextColumn(f"[bold]{self.job.title}"), TextColumn("{task.fields[status]}")
        columns = (title, BarColumn(), MofNCompleteColumn(), status, TimeElapsedColumn())
        with Progress(*columns, console=console, disable=not console.is_terminal) as bar:
            task = bar.add_task("train", total=self.job.total, completed=self.state.iteration, status="")

            def show(record: dict[str, Any]) -> None:
                key = self.job.target_key
                status = f"{key} {record[key]:.3f}" if record.get(key) is not None else ""
                bar.update(task, completed=self.state.iteration, status=status)
                line = self.job.line(record)
                if line is not None:
                    console.print(line, highlight=False, soft_wrap=True)

            yield show

    def _end_open_batches(self) -> None:
        """Batches in flight when the run ends are never trained on: each id ends, as dropped."""
        self._in_flight.clear()
        self.state.ledger.dropped(self.state.ledger.open_ids)

    def _release(self, result: RunResult) -> None:
        if self.turns is not None:
            result.switches = self.turns.summary()
            result.phases = [(p.component, p.action) for p in self.turns.phases]
            self.turns.close()
        for group in reversed(self._groups):
            group.shutdown()
        if self.layout is not None:
            self.layout.release()
        if self._given_cluster is None and self.cluster is not None:
            self.cluster.shutdown()

    # ------------------------------------------------------------------------------ launch
    def launch(self, name: str, group: WorkerGroup, *, max_concurrency: int = 1) -> WorkerGroup:
        """Launch ``group`` (from ``Worker.create_group``) as component ``name`` into its slice of
        the layout, with the run's deadlines. ``max_concurrency=2`` lets a receiver stage the next
        weights while it serves."""
        launched = group.launch(
            self.cluster,
            self.placement.get_strategy(name),
            name=name,
            layout=self.layout,
            launch_timeout=self.settings.launch_timeout_s,
            call_timeout=self.settings.call_timeout_s,
            max_concurrency=max_concurrency,
        )
        self._groups.append(launched)
        return launched

    def start_trainer(self, make: Callable[[], WorkerGroup], *, backend: str = "gloo") -> int:
        """Launch the trainer group ``make()`` as component ``run.trainer`` (``actor`` unless the
        config says otherwise), bring up its process group and call its ``setup(checkpoint)``
        (restored from the resumed checkpoint, if any); the same again, into the same bundles,
        when it is restarted. Returns the weight version its weights are published as.

        The version rule is rlinfra's, not the trainer's: a trainer counts its own versions (and
        checkpoints its count); the run publishes each as that count plus ``state.version_offset``,
        which a restart raises so that the restored weights go out above the version being served
        (versions only rise). ``stage`` takes the trainer's count."""

        def start(checkpoint: bytes | None, publish_above: int | None) -> int:
            if self.trainer is not None:
                self._groups.remove(self.trainer)
            group = make()
            check_trainer(group.worker_cls, self.settings.trainer)
            self.trainer = self.launch(self.settings.trainer, group)
            bring_up(self.trainer, backend=backend)
            restored = int(self.trainer.setup(checkpoint).wait()[0])
            if self.turns is not None:  # a restarted trainer takes its predecessor's turns, asleep
                self.turns.rejoin(self.trainer)
            return self.state.published(restored, publish_above)

        self._restart_with = (
            start,
            RestartBudget(self.placement.get_strategy(self.settings.trainer).restart),
        )
        return start(self._last_checkpoint[0], None)

    def connect_weights(
        self, receivers: WorkerGroup, version: int, first: Callable[[WorkerGroup], Any] | None = None
    ) -> None:
        """The weight barrier from the trainer to ``receivers``: each gets ``first(trainer)`` (the
        trainer's weights at ``version``; default: rank 0's ``weights_state()``) through its
        ``set_initial_weights``; every later version goes through ``stage`` and ``commit``."""
        weights = first(self.trainer) if first else self.trainer.execute_on(0).weights_state().wait()[0]
        receivers.set_initial_weights(weights, version).wait()
        self.sync = WeightSync(
            self.trainer,
            receivers,
            transport=self.settings.transport,
            initial_version=version,
            step_timeout_s=self.settings.call_timeout_s,
        )

    def supervise(
        self,
        groups: Sequence[WorkerGroup],
        rewire: Callable[[dict[str, list[int]]], None] | None = None,
        shrinkable: Sequence[WorkerGroup] = (),
    ) -> None:
        """Replace dead workers of ``groups`` mid-run (the weight receivers re-admitted at the
        served version, then ``rewire(replaced)``); ``shrinkable`` may go on with fewer ranks when
        a node is lost. The trainer is watched: a lost rank restarts it from its checkpoint."""
        watched = [self.trainer] if self.trainer is not None else []
        self.supervisor = Supervisor(groups, self.sync, rewire, watched=watched, shrinkable=shrinkable)

    def time_share(self, groups: Sequence[WorkerGroup], awake: str) -> None:
        """When ``groups`` share devices (the layout colocates the trainer with ``awake``), they
        take turns: ``awake`` first, the rest asleep."""
        if self.relation(self.trainer.name, awake) == "colocated":
            self.turns, self._awake = TimeSharing(list(groups), awake=awake), awake

    def share(self, total: int, component: str, key: str) -> int:
        """``total`` (the config's ``key``) split evenly over the ranks of ``component``: each one's
        share, or a ``JobConfigError`` naming ``key`` when it does not divide."""
        ranks = self.placement.get_world_size(component)
        if total % ranks:
            raise JobConfigError(
                f"{key}: {total} cannot be split evenly over {ranks} {component} workers; "
                f"expected a multiple of {ranks}"
            )
        return total // ranks

    def relation(self, a: str, b: str) -> str:
        """How components ``a`` and ``b`` share hardware: ``colocated``, ``disaggregated``, …"""
        assert self.layout is not None
        return self.layout.plan.relation(a, b)

    # ------------------------------------------------------------------------- supervision
    def resize(self, component: str, *, add: Sequence[int] = (), remove: Sequence[int] = ()) -> None:
        """Elastic: stop ranks of a supervised ``component`` or start stopped ones again (admitted at
        the served version), between batches (``between_batches``)."""
        assert self.supervisor is not None  # execute supervises before the first batch
        found = [group for group in self._groups if group.name == component]
        if not found:
            raise KeyError(f"no launched component {component!r}; launched: {[g.name for g in self._groups]}")
        self.supervisor.resize(found[0], add=add, remove=remove)

    def after_heal(self) -> None:
        """After every recovery: say so everywhere, and put a replaced engine back to sleep when it
        is not its turn (time-sharing)."""
        recovery: Recovery = self.state.recoveries[-1]
        for restart in recovery.restarts:
            self._event(restart, recovery.took_s, admitted_version=recovery.admitted_version)
        for component, rank in recovery.dropped:
            gone = Restart(component, rank, None, recovery.cause, time.time(), 0.0, "dropped", "node lost")
            self._event(gone, recovery.took_s)
        turns = self.turns
        if turns is not None and self._awake is not None and turns.state(self._awake) != "awake":
            turns.sleep(self._awake)

    def _event(self, restart: Restart, served_after_s: float, **extra: Any) -> None:
        """A survived fault: a console line, a metrics event, an entry of ``summary.json``."""
        event = {
            "event": restart.outcome,
            "iteration": self.state.iteration,
            "component": restart.component,
            "rank": restart.rank,
            "node": restart.node_rank,
            "cause": restart.reason.splitlines()[0] if restart.reason else "",
            "detail": restart.detail,
            "served_after_s": round(served_after_s, 3),
        } | {key: value for key, value in extra.items() if value is not None}
        self.state.events.append(event)
        self.log.event(event)
        worker, cause = f"{restart.component}:{restart.rank}", event["cause"]
        line = (
            f"{worker}: dropped after {cause}; its node is lost, the run goes on without it"
            if restart.node_rank is None
            else f"{worker} on node {restart.node_rank}: {restart.outcome} after {cause}; serving again "
            f"{served_after_s:.1f} s later"
        )
        self.console.print(f"[yellow]recovered[/] {line}", highlight=False, soft_wrap=True)

    # ------------------------------------------------------------------------------ batches
    def fresh(
        self, batches: Sequence[Batch], max_staleness: int, version: Callable[[Batch], int]
    ) -> list[Batch]:
        """The batches at most ``max_staleness`` versions behind the trainer; the others are
        dropped (and counted). Each batch's ``version`` is recorded."""
        learner = self.learner_version
        versions = [version(b) for b in batches]
        self.state.batch_versions.append(versions)
        paired = list(zip(batches, versions, strict=True))
        stale = [b.id for b, v in paired if learner - v > max_staleness]
        self.state.ledger.dropped(stale)
        self.state.dropped_batches += len(stale)
        oldest = min(versions, default=learner)
        self._freshness = {"batch_version": oldest, "staleness": learner - oldest, "dropped": len(stale)}
        return [b for b, v in paired if learner - v <= max_staleness]

    def updated(self, batch_ids: Iterable[str]) -> None:
        """The trainer updated on ``batch_ids`` (as it reports them): they are trained, the
        iteration is done, and every ``run.checkpoint_every`` iterations (and at the last) the
        trainer and the state are saved."""
        state = self.state
        self._tick()
        state.ledger.trained(batch_ids, iteration=state.iteration + 1)
        state.iteration += 1
        self._updated = True
        if state.iteration % self.settings.checkpoint_every == 0 or state.iteration == self.job.total:
            self.checkpoint()

    def checkpoint(self) -> None:
        """Save the trainer's state and the driver's (atomically); a restart goes back to it."""
        payload = self.job.trainer_state(self)
        saved = self.state.checkpointed()
        self._last_checkpoint = (payload, saved)
        self.store.save(self.state.iteration, {self.settings.trainer: payload}, saved)

    def _tick(self) -> None:
        """Count the training seconds (across resumes) up to now: at each update (so that its
        checkpoint has them) and at the end of each step."""
        now = time.perf_counter()
        self.state.training_s += now - self.clock
        self.clock = now

    # ------------------------------------------------------------------------------ weights
    @property
    def served_version(self) -> int:
        return self.sync.version if self.sync is not None else 0

    @property
    def learner_version(self) -> int:
        """The trainer's weight version: the one staged, if any, else the one served."""
        return self.staged_version if self.staged_version is not None else self.served_version

    def stage(self, trained: int) -> None:
        """Stage the trainer's version ``trained`` (published as ``trained + state.version_offset``,
        see ``start_trainer``) on every receiver while they keep generating (``prepare``), and
        record the trainer's log-probs of the probe under it (see ``probe``)."""
        assert self.sync is not None
        version = self.state.published(trained)
        sync, probe = self.sync, self._probe
        self.sync_s["prepare_s"] = self.retried(lambda: sync.staged_or_prepare(version)).prepare_s
        self.staged_version = version
        if probe is not None:
            logprobs = self.trainer.execute_on(0).probe_logprobs  # rank 0's
            self.on_trainer(lambda: probe.expect(version, lambda sequences: logprobs(sequences).wait()[0]))

    def commit(self) -> None:
        """Pause → swap → verify → resume for the staged version, if any (staged again first if a
        replacement dropped it), between batches; then the receivers' log-probs of the probe, if
        any, checked against the trainer's."""
        if self.between_batches is not None and not self._between_done:
            self._between_done = True
            self.between_batches(self)
        version, sync, probe = self.staged_version, self.sync, self._probe
        if version is None or sync is None:
            return
        report = self.retried(lambda: sync.commit_version(version))
        self.sync_s["pause_s"], self.sync_s["held_s"] = report.pause_s, report.held_s
        self.state.served_versions.append(sync.version)
        self.staged_version = None
        if probe is not None:
            self.logprob_mismatch = self.retried(lambda: probe.check(version, sync.receivers))

    def probe(self, sequences: Sequences, tolerance: float) -> None:
        """From now on, the receivers' log-probs of ``sequences`` ((prompt, completion) token ids)
        must equal the trainer's (rank 0's ``probe_logprobs(sequences)``) within ``tolerance`` at
        every committed version: the record's ``logprob_mismatch``, else ``LogprobMismatchError``."""
        self._probe = LogprobProbe(sequences, tolerance)

    def turn(self, component: str) -> float:
        """Give ``component`` the shared devices (time-sharing); the switch's seconds, else 0."""
        turns = self.turns
        if turns is None:
            return 0.0
        switch = self.retried(lambda: turns.wake(component))
        return switch.total_s if switch is not None else 0.0

    def _restart_trainer(self, loss: UnsupervisedLoss) -> None:
        """Bring the trainer back from the last checkpoint (or its start), serving its weights above
        the last version (``_new_trainer``); drop what was in flight (made with the lost trainer's
        weights); rewind the state, the metrics and the ledger to that checkpoint: the iterations
        since are redone."""
        for pending in self._in_flight:
            with contextlib.suppress(WorkerGroupError):
                pending.call.wait()
        self._in_flight.clear()
        payload, saved = self._last_checkpoint
        back_to = int(saved["iteration"]) if saved is not None else 0
        detail = f"from the checkpoint of {self.job.unit} {back_to}" if saved else "from its start"
        restart = self._new_trainer(loss, payload, detail)
        self.state.served_versions.append(self.served_version)
        self.state.rewind(saved)
        self.log.rewind(back_to)
        self.staged_version = None
        if self._awake is not None:  # the restarted trainer came back asleep
            self.turn(self._awake)
        self._event(restart, restart.took_s, restored_iteration=back_to)

    def _new_trainer(self, loss: UnsupervisedLoss, checkpoint: bytes | None, restored_from: str) -> Restart:
        """A data-parallel rank cannot be replaced in place (its peers sit in a collective with
        it), so the whole trainer group is, charged to its ``restart`` budget: stopped, started
        again in the same bundles with a fresh rendezvous from ``checkpoint``, and its weights
        published through the barrier as the version above the one served (versions only rise),
        so every receiver serves them before anything is made. ``restored_from`` says what
        ``checkpoint`` is, for the record. Every attempt is kept in ``state.trainer_restarts``, a
        refused one too (the budget spent: ``RestartBudgetExhausted``, the run stops); ``loss``
        is raised again when there is no trainer to restart or no weights to publish."""
        sync, supervisor, lost = self.sync, self.supervisor, self.trainer
        if self._restart_with is None or sync is None or supervisor is None:
            raise loss
        start, budget = self._restart_with
        restarts = self.state.trainer_restarts
        started, wall = time.monotonic(), time.time()
        ranks = loss.gone.get(lost.name, [])
        rank = ranks[0] if ranks else 0
        node_rank = lost.node_rank_of(rank)
        cause = str(loss.cause).partition("\n")[0] or type(loss.cause).__name__
        try:
            budget.charge(lost.name, rank, node_rank)
        except RestartBudgetExhausted as spent:
            restarts.append(Restart(lost.name, rank, node_rank, cause, wall, 0.0, REFUSED, str(spent)))
            raise
        lost.shutdown()
        version = start(checkpoint, sync.version)
        sync.replace_sender(self.trainer)
        supervisor.watched = [self.trainer]
        self.retried(lambda: sync.update(version))
        took_s, reason = time.monotonic() - started, f"lost rank(s) {ranks}: {cause}"
        restart = Restart(lost.name, rank, node_rank, reason, wall, took_s, RESTARTED, restored_from)
        restarts.append(restart)
        return restart
