"""``Run``: a supervised, versioned RL driver loop, owned once; a ``Job`` supplies the algorithm.

What a job writes (see ``Job``): which components its YAML places and its driver, ``loop``: launch
the groups, then ``for step in run.steps(total)`` (see ``rlinfra.driver.steps``). The rest is here,
in this order:

    parse       the cluster, the placement, the job's components checked (no Ray yet on errors)
    reserve     one placement group for the layout, shown as tables before any worker starts
    launch      the job's groups (``launch``); the trained groups with their rendezvous and
                checkpoint (``start_trainer``, ``trained.py``); the weight barrier from the trainer
                to the ``WeightReceiver`` group (``versions.py``); every other group supervised;
                time-sharing when they share devices
    iterate     ``run.steps``: each step's record logged (JSONL and TensorBoard) and shown, the
                clock and the checkpoints kept, until the budget or the target
    ride out    a dead rollout/env/reward worker is replaced inside the calls the job makes
                (``supervised``, a stream's ``gather``, ``step.train``); a lost trained rank
                restarts the trained groups from the last checkpoint, rewinds the state, the
                metrics and the ledger, and runs ``job.loop`` again (its launches return the
                running groups); each is a console line, a metrics event and an entry of
                ``summary.json`` (``outputs.py``)
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
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.text import Text

from rlinfra.config import JobConfigError
from rlinfra.driver.checkpoints import CheckpointStore
from rlinfra.driver.failure_report import FailureReport
from rlinfra.driver.signals import CtrlC, sigint_ignored
from rlinfra.driver.supervisor import Recovery, Supervisor, UnsupervisedLoss
from rlinfra.placement import ClusterSpec, ComponentPlacement
from rlinfra.placement.config import cluster_section, parse_cluster_config
from rlinfra.runtime.cluster import Cluster
from rlinfra.runtime.errors import WorkerGroupError
from rlinfra.runtime.group import WorkerGroup
from rlinfra.runtime.hosting import HostMethods, memory_peak
from rlinfra.runtime.layout import Layout
from rlinfra.runtime.supervision import Restart, RestartBudget
from rlinfra.runtime.timesharing import TimeSharing
from rlinfra.services.weights import WeightReceiver

from .outputs import RunOutputs
from .preflight import preflight
from .records import ContractError
from .result import BUDGET, ENDED, FAILED, INTERRUPTED, SUMMARY_FILE, TARGET, RunResult
from .steps import BatchStream, Step
from .supervised import Pending
from .trained import StartTrainer, TrainedGroups

if TYPE_CHECKING:
    from .job import Job


class Run(TrainedGroups):
    """One run of ``job`` on the config ``cfg`` (its ``cluster`` section is rlinfra's); the calls
    that ride out faults (``supervised``, ``generate``/``gather``, ``lost``, ``call_trainer``,
    ``heal``) are ``SupervisedSteps``'. ``cluster``: an existing cluster to use and leave running;
    ``on_iteration`` sees each record as it is written; ``between_batches(run)`` runs at an
    iteration's first ``commit``, when no batch is in flight (elastic scaling: ``run.resize``);
    ``resume`` continues from the last checkpoint in ``run.output_dir``."""

    _awake: str | None = None  # the component that time-shares the trainer's devices

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
        if not hasattr(job, "settings") or not hasattr(job, "state"):
            raise ContractError(f"{type(job).__name__}.__init__ must call super().__init__(cfg) first")
        self.job, self.cfg, self.settings, self.state = job, cfg, job.settings, job.state
        self._preflight()
        self.console = console or Console()
        self.between_batches, self.on_iteration = between_batches, on_iteration
        self.output = Path(job.settings.output_dir)
        self.store = CheckpointStore(self.output)
        saved = self.store.load_latest() if resume else None
        if resume and saved is None:
            raise FileNotFoundError(f"--resume: no checkpoint in {self.store.root}; run without --resume")
        # Each trained group's payload and the driver's state a restart goes back to (none: the start).
        self._last_checkpoint: tuple[dict[str, bytes], dict[str, Any] | None] = ({}, None)
        self.ended: str | None = None  # how a resumed run that has nothing left to run ended
        if saved is not None:
            self._last_checkpoint = (dict(saved.payloads), saved.state)
            self._refuse_unless_saved(self.settings.trainer, "run.trainer")  # before Ray starts
            self.state.load(saved.state)
            self.ended = self._ended_with_this_config(saved.step)
        self.result = RunResult(job, self.output, resumed_from=self.state.iteration)
        # Iterations logged after the checkpoint are redone: the log continues from it.
        self.out = RunOutputs(
            self.console, self.result, self.state.iteration if resume else None, not self.ended
        )
        self._given_cluster = cluster
        self.cluster: Cluster = cluster  # type: ignore[assignment]  # set in execute before any use
        self.layout: Layout | None = None
        self.sync_s = {"prepare_s": 0.0, "pause_s": 0.0, "held_s": 0.0}  # the last stage and commit
        self._groups: list[WorkerGroup] = []
        self.in_flight: list[Pending] = []
        self.trainers: dict[str, WorkerGroup] = {}  # every trained group, the publisher among them
        self._restart_with: dict[str, tuple[StartTrainer, RestartBudget]] = {}  # start_trainer's
        self.total = 0  # the budget of ``steps``
        self.outcome = BUDGET
        self._looping = False  # ``steps`` has begun: a lost trainer rank restarts the trainer
        self._ctrl_c = CtrlC()

    def _ended_with_this_config(self, last_step: int) -> str | None:
        """``budget`` or ``target`` when the run being resumed ended so, at its last checkpoint,
        with this very config: nothing is left to run (a changed config, e.g. a larger budget,
        goes on)."""
        try:
            summary = json.loads((self.output / SUMMARY_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        ended = summary.get("outcome") in (BUDGET, TARGET) and summary.get("iterations") == last_step
        same = summary.get("config") == self.job.config.model_dump(mode="json")
        return str(summary["outcome"]) if ended and same else None

    def _preflight(self) -> None:
        """What needs no cluster, checked before Ray starts: the job's components (``preflight``)
        and, where the accelerators are known (``simulate``, ``num_gpus_per_node``), the placement
        and its memory plan, as ``rlinfra plan`` checks them."""
        if self.cfg.get("cluster") is None:
            preflight(self.job, None)
            return  # refused by name where the run starts its cluster (a unit test drives none)
        config = parse_cluster_config(cluster_section(self.cfg))
        preflight(self.job, config)
        counts = config.simulate or config.num_gpus_per_node
        if counts is not None:
            ComponentPlacement({"cluster": config}, ClusterSpec.from_config(config, counts))

    # ----------------------------------------------------------------------------- the life
    def execute(self) -> RunResult:
        """Place, launch, iterate; always release what was started (see the module docstring)."""
        started = time.perf_counter()
        job, state, result = self.job, self.state, self.result
        if self.ended is not None:  # nothing left: say so, start nothing
            self.out.log.close()
            result.outcome, result.ended_by = ENDED, self.ended
            return result
        try:
            self.cluster = self._given_cluster or Cluster(cluster_section(self.cfg))
            self.placement = ComponentPlacement(self.cfg, self.cluster)
            for warning in self.placement.memory_warnings:  # cluster.memory_check: warn
                self.console.print(Text.assemble(("warning: ", "yellow"), warning), soft_wrap=True)
            with self.console.status("reserving the layout"):
                self.layout = Layout(self.cluster, self.placement, job.components)
            self.out.plan(self.cluster, self.placement, self.layout)
            job.check(self)
            with self._ctrl_c.watching():
                self._loop()
            result.outcome = self.outcome
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
                if self.turns is not None:
                    result.switches = self.turns.summary()
                    result.phases = [(p.component, p.action) for p in self.turns.phases]
                    self.turns.close()
                for group in reversed(self._groups):  # every worker and the placement group released
                    group.shutdown()
                if self.layout is not None:
                    self.layout.release()
                if self._given_cluster is None and self.cluster is not None:
                    self.cluster.shutdown()
                result.wall_s = time.perf_counter() - started
                self.out.end(self.cfg.get("name") or "")
        return result

    def _loop(self) -> None:
        """``job.loop``; again after each trainer restart, which rewinds to the last checkpoint."""
        while True:
            try:
                self.job.loop(self)
                return
            except UnsupervisedLoss as loss:  # a trainer rank: the whole group, from the checkpoint
                if not self._looping:
                    raise
                self._restart_trainer(loss)

    def _restart_trainer(self, loss: UnsupervisedLoss) -> None:
        """Bring every trained group back from the last checkpoint (or its start), the weights
        served above the last version (``_new_trainer``); drop what was in flight (made with the
        lost trainer's weights); rewind the state, the metrics and the ledger to that checkpoint:
        the iterations since are redone."""
        for pending in self.in_flight:
            with contextlib.suppress(WorkerGroupError):
                pending.call.wait()
        self.in_flight.clear()
        payloads, saved = self._last_checkpoint
        back_to = int(saved["iteration"]) if saved is not None else 0
        detail = f"from the checkpoint of {self.job.unit} {back_to}" if saved else "from its start"
        restarts = [self._new_trainer(name, loss, payloads.get(name), detail) for name in list(self.trainers)]
        self.state.served_versions.append(self.served_version)
        self.state.rewind(saved)
        self.out.log.rewind(back_to)
        self.staged_version = None
        if self._awake is not None:  # the restarted trainer came back asleep
            self.wake(self._awake)
        for restart in restarts:
            self._event(restart, restart.took_s, restored_iteration=back_to)

    def steps(self, total: int) -> Iterator[Step]:
        """One ``Step`` per iteration until ``state.iteration`` reaches ``total`` (or the job's
        target): the job's loop body makes one update per step (``step.train``). Around each
        the run keeps the clock and the checkpoints, and writes and shows the step's record (the
        iteration, the versions, the weight barrier's times, the batches' versions, what the job
        logged). The first call supervises every launched group not supervised yet."""
        self.total = total
        if not self._looping:
            self._looping = True
            self.supervise()  # unless the job did
            self.out.placed(self._groups)
            self.state.served_versions.append(self.served_version)
            self.out.begin(total, self.state.iteration)
        self.clock = time.perf_counter()
        while self.state.iteration < total:
            step = Step(self, self.state.iteration + 1, last=self.state.iteration + 1 == total)
            self._between_done = False  # ``between_batches`` runs at this step's first commit
            yield step
            if not step.trained:
                rule = "each step makes one update per trained group (with no batches when none is left)"
                waiting = ", ".join(step.waiting_for())
                raise ContractError(f"step {step.number} ended without step.train(...) of {waiting}: {rule}")
            self._tick()  # what the step did after its update (an evaluation) counts too
            record = self._standard_record() | step.record
            self.out.step(record)
            if self.on_iteration is not None:
                self.on_iteration(record)
            if self._ctrl_c.pressed:  # its KeyboardInterrupt was swallowed somewhere: stop here
                raise KeyboardInterrupt
            target, value = self.job.target(), record.get(self.job.target_key)
            if self.job.stop_at_target and target is not None and value is not None and value >= target:
                self.outcome = TARGET
                break
        else:
            self.outcome = BUDGET
        self._measure_memory()

    def _measure_memory(self) -> None:
        """Each component the memory plan predicted: its ranks' peaks, measured in their processes
        (``summary.json``'s ``memory``, a metrics event, a warning when over the plan)."""
        predicted: dict[str, int] = {}
        planned = getattr(self, "placement", None)  # none on a run driven without a cluster
        for device in planned.memory if planned is not None else ():
            for held in device.held:
                predicted[held.component] = max(held.total, predicted.get(held.component, 0))
        for group in [group for group in self._groups if group.name in predicted]:
            action = "reading its peak memory"
            peaks = group.call(HostMethods.rlinfra_run, args=(memory_peak,), action=action).wait()
            kind = "device" if "device" in peaks[0] else "rss"
            measured = [peak.get(kind, peak["rss"]) for peak in peaks]
            self.out.memory(group.name, predicted[group.name], measured, kind)

    def _standard_record(self) -> dict[str, Any]:
        """What every iteration's record has: progress, versions, the weight barrier's times."""
        record: dict[str, Any] = {
            "iteration": self.state.iteration, "time_s": round(self.state.training_s, 3),
            "learner_version": self.learner_version, "served_version": self.served_version,
        } | {key: round(value, 5) for key, value in self.sync_s.items()}  # fmt: skip
        if self._probe is not None:
            record["logprob_mismatch"] = self.logprob_mismatch
        return record

    def _end_open_batches(self) -> None:
        """Batches in flight when the run ends are never trained on: each id ends, as dropped."""
        self.in_flight.clear()
        self.state.ledger.dropped(self.state.ledger.open_ids)

    # ------------------------------------------------------------------------------ launch
    def launch(self, name: str, group: WorkerGroup, *, max_concurrency: int = 1) -> WorkerGroup:
        """Launch ``group`` (from ``Worker.create_group``) as component ``name`` into its slice of
        the layout, with the run's deadlines; the group already running under ``name`` when the
        loop runs again. ``max_concurrency=2`` lets a receiver stage the next weights while it
        serves. A group of ``WeightReceiver`` workers gets the trainer's weights: its first ones
        (rank 0's ``weights_state()``) now, every later version through ``stage`` and ``commit``."""
        running = next((g for g in self._groups if g.name == name), None)
        if running is not None:
            return running
        settings, strategy = self.settings, self.placement.get_strategy(name)
        with self.console.status(f"starting {name}"):
            launched = group.launch(
                self.cluster, strategy, name=name, layout=self.layout, max_concurrency=max_concurrency,
                launch_timeout=settings.launch_timeout_s, call_timeout=settings.call_timeout_s,
            )  # fmt: skip
        self._groups.append(launched)
        if issubclass(launched.worker_cls, WeightReceiver):
            if self._receivers is not None:
                pair = f"{name} and {self._receivers.name}"
                raise ContractError(f"{pair} both receive weights; a run has one receiving group")
            self._receivers = launched
        self._connect_weights()
        return launched

    def supervise(
        self,
        rewire: Callable[[dict[str, list[int]]], None] | None = None,
        shrinkable: Sequence[WorkerGroup] = (),
    ) -> None:
        """Replace dead workers of every launched group but the trained ones mid-run (the weight
        receivers re-admitted at the served version, then ``rewire(replaced)``); ``shrinkable``
        may go on with fewer ranks when a node is lost. The trained groups are watched: a lost
        rank restarts them from the checkpoint. ``steps`` calls it with no hooks when the job
        did not."""
        if self.supervisor is not None:
            return
        watched = list(self.trainers.values())
        groups = [group for group in self._groups if group not in watched]
        self.supervisor = Supervisor(groups, self.sync, rewire, watched=watched, shrinkable=shrinkable)

    def time_share(self, groups: Sequence[WorkerGroup], awake: str) -> None:
        """When ``groups`` share devices (the layout colocates the trainer with ``awake``), they
        take turns: ``awake`` first, the rest asleep."""
        if self.turns is None and self.relation(self.trainer.name, awake) == "colocated":
            self.turns, self._awake = TimeSharing(list(groups), awake=awake), awake

    def per_rank(self, total: int, component: str, key: str) -> int:
        """``total`` (the config's ``key``) split evenly over the ranks of ``component``: each one's
        share, or a ``JobConfigError`` naming ``key`` when it does not divide."""
        ranks = self.placement.get_world_size(component)
        if total % ranks:
            problem = f"{total} cannot be split evenly over {ranks} {component} workers"
            raise JobConfigError(problem, where=key, expected=f"a multiple of {ranks}")
        return total // ranks

    def batches(
        self,
        group: WorkerGroup,
        method: Callable[..., Any],
        args: tuple[Any, ...] | Callable[[int], tuple[Any, ...]] = (),
    ) -> BatchStream:
        """Batches made by every rank of ``group``: ``method(batch_id, *args)`` (or ``*args(rank)``)
        returns a ``Batch`` (see ``BatchStream``)."""
        return BatchStream(self, group, method, args if callable(args) else lambda rank: args)

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
        self.state.events.append(self.out.event(restart, self.state.iteration, served_after_s, **extra))
        self.out.placed(self._groups)  # the new process ids

    # ---------------------------------------------------------------------- updates, weights
    def record_update(self, batch_ids: Iterable[str]) -> None:
        """The trainer updated on ``batch_ids`` (``step.train``): they are trained, the iteration
        is done, and every ``run.checkpoint_every`` iterations (and at the last) the trainer and
        the state are saved."""
        state = self.state
        self._tick()
        state.ledger.trained(batch_ids, iteration=state.iteration + 1)
        state.iteration += 1
        if state.iteration % self.settings.checkpoint_every == 0 or state.iteration == self.total:
            self.checkpoint()

    def _tick(self) -> None:
        """Count the training seconds (across resumes) up to now: at each update (so that its
        checkpoint has them) and at the end of each step."""
        now = time.perf_counter()
        self.state.training_s += now - self.clock
        self.clock = now

    def wake(self, component: str) -> float:
        """Give ``component`` the shared devices (time-sharing); the switch's seconds, else 0."""
        turns = self.turns
        if turns is None:
            return 0.0
        switch = self.supervised(lambda: turns.wake(component))
        return switch.total_s if switch is not None else 0.0
