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

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.text import Text

from rlinfra.config import JobConfigError, did_you_mean
from rlinfra.driver.checkpoints import CheckpointStore
from rlinfra.driver.failure_report import FailureReport
from rlinfra.driver.signals import CtrlC, sigint_ignored
from rlinfra.driver.supervisor import Recovery, Supervisor, UnsupervisedLoss
from rlinfra.placement import ClusterSpec, ComponentPlacement, PlacementError
from rlinfra.placement.config import cluster_section, parse_cluster_config
from rlinfra.runtime.cluster import Cluster
from rlinfra.runtime.group import WorkerGroup
from rlinfra.runtime.hosting import HostMethods, memory_peak
from rlinfra.runtime.layout import Layout
from rlinfra.runtime.supervision import Restart, RestartBudget
from rlinfra.runtime.timesharing import TimeSharing
from rlinfra.services.weights import WeightReceiver, WeightSync
from rlinfra.services.weights.probe import LogprobProbe

from .outputs import RunOutputs
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
        if job.components and self.settings.trainer not in job.components:
            hint = did_you_mean(self.settings.trainer, job.components)
            raise JobConfigError(
                f"{self.settings.trainer!r} is not a component of the {job.title} job"
                + (f"; {hint}" if hint else ""),
                where="run.trainer",
                expected="one of " + ", ".join(repr(name) for name in job.components),
            )
        self._preflight()
        self.console = console or Console()
        self.between_batches, self.on_iteration = between_batches, on_iteration
        self.output = Path(job.settings.output_dir)
        self.store = CheckpointStore(self.output)
        saved = self.store.load_latest() if resume else None
        if resume and saved is None:
            raise FileNotFoundError(
                f"--resume: no checkpoint in {self.output / 'checkpoints'}; run once without --resume first"
            )
        # Each trained group's payload and the driver's state a restart goes back to (none: the start).
        self._last_checkpoint: tuple[dict[str, bytes], dict[str, Any] | None] = ({}, None)
        self.ended: str | None = None  # how a resumed run that has nothing left to run ended
        if saved is not None:
            self._last_checkpoint = (dict(saved.payloads), saved.state)
            self._refuse_unless_saved(self.settings.trainer, "run.trainer")  # before Ray starts
            self.state.load(saved.state)
            self.ended = self._ended_with_this_config(saved.step)
        # Iterations logged after the checkpoint are redone: the log continues from it.
        self.out = RunOutputs(job, self.console, self.output, self.state.iteration if resume else None)
        self._given_cluster = cluster
        self.cluster: Cluster = cluster  # type: ignore[assignment]  # set in execute before any use
        self.placement: ComponentPlacement
        self.layout: Layout | None = None
        self.trainer: WorkerGroup = None  # type: ignore[assignment]  # start_trainer sets it
        self.sync: WeightSync | None = None
        self._receivers: WorkerGroup | None = None  # the group that gets the trainer's weights
        self._first_version: int | None = None  # the trainer's, as start_trainer published it
        self.supervisor: Supervisor | None = None
        self.turns: TimeSharing | None = None
        self.staged_version: int | None = None  # trained and staged on the receivers, not yet served
        self.sync_s = {"prepare_s": 0.0, "pause_s": 0.0, "held_s": 0.0}  # the last stage and commit
        self._probe: LogprobProbe | None = None
        self.logprob_mismatch: float | None = None  # the probe's, at the last committed version
        self._groups: list[WorkerGroup] = []
        self.in_flight: list[Pending] = []
        self.trainers: dict[str, WorkerGroup] = {}  # every trained group, the publisher among them
        self._restart_with: dict[str, tuple[StartTrainer, RestartBudget]] = {}  # start_trainer's
        self._awake: str | None = None
        self._between_done = False
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
        """What needs no cluster, checked before Ray starts: the components placed are the job's
        (a misspelt one named, with the nearest of the job's), and where the accelerators are
        known (``simulate``, ``num_gpus_per_node``) the placement and its memory plan, as
        ``rlinfra plan`` checks them."""
        if self.cfg.get("cluster") is None:
            return  # refused by name where the run starts its cluster (a unit test drives none)
        config = parse_cluster_config(cluster_section(self.cfg))
        placed = [name for entry in config.components for name in entry.names]
        components = self.job.components or placed
        unknown = [name for name in placed if name not in components]
        strays = [*unknown, *(name for name in components if name not in placed)]
        if strays:
            hint = did_you_mean(strays[0], components) if unknown else ""
            raise PlacementError(
                f"{'unknown' if unknown else 'missing'} component {strays[0]!r}"
                + (f"; {hint}" if hint else ""),
                where="cluster.component_placement",
                expected=f"the {self.job.title} job's components: " + ", ".join(components),
            )
        counts = config.simulate or (
            config.num_gpus_per_node if config.num_gpus_per_node is not None else None
        )
        if counts is not None:
            ComponentPlacement({"cluster": config}, ClusterSpec.from_config(config, counts))

    # ----------------------------------------------------------------------------- the life
    def execute(self) -> RunResult:
        """Place, launch, iterate; always release what was started (see the module docstring)."""
        started = time.perf_counter()
        job, state = self.job, self.state
        self.result = result = RunResult(job, self.output, resumed_from=state.iteration)
        if self.ended is not None:  # nothing left: say so, start nothing
            self.out.log.close()
            result.outcome, result.ended_by = ENDED, self.ended
            return result
        try:
            self.cluster = self._given_cluster or Cluster(cluster_section(self.cfg))
            self.placement = ComponentPlacement(self.cfg, self.cluster)
            for warning in self.placement.memory_warnings:  # cluster.memory_check: warn
                self.console.print(Text.assemble(("warning: ", "yellow"), warning), soft_wrap=True)
            self._reserve(result)
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
                self._release(result)
                result.wall_s = time.perf_counter() - started
                self.out.end(result, self.cfg.get("name") or "")
        return result

    def _reserve(self, result: RunResult) -> None:
        with self.console.status("reserving the layout"):
            self.layout = Layout(self.cluster, self.placement, self.job.components)
        self.out.plan(self.cluster, self.placement, self.layout, result)

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

    def steps(self, total: int) -> Iterator[Step]:
        """One ``Step`` per iteration until ``state.iteration`` reaches ``total`` (or the job's
        target): the job's loop body makes one update per step (``step.train``). Around each
        the run keeps the clock and the checkpoints, and writes and shows the step's record (the
        iteration, the versions, the weight barrier's times, the batches' versions, what the job
        logged). The first call supervises every launched group not supervised yet."""
        self.total = total
        if not self._looping:
            self._looping = True
            if self.supervisor is None:
                self.supervise()
            if self.layout is not None:
                self.out.placed(self.placement, self.layout, self.result, self._groups, self.cluster.logs_dir)
            self.state.served_versions.append(self.served_version)
            self.out.begin(total, self.state.iteration)
        self.clock = time.perf_counter()
        while self.state.iteration < total:
            step = Step(self, self.state.iteration + 1, last=self.state.iteration + 1 == total)
            self._between_done = False  # ``between_batches`` runs at this step's first commit
            yield step
            if not step.trained:
                raise ContractError(
                    f"step {step.number} ended without step.train(...) of {', '.join(step.waiting_for())}: "
                    "each step makes one update per trained group (with no batches when none is left)"
                )
            self._tick()  # what the step did after its update (an evaluation) counts too
            record = self._standard_record() | step.record
            self.out.step(record)
            if self.on_iteration is not None:
                self.on_iteration(record)
            if self._ctrl_c.pressed:  # its KeyboardInterrupt was swallowed somewhere: stop here
                raise KeyboardInterrupt
            if self.job.stop_at_target and self._reached(record):
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
        for group in self._groups:
            if group.name in predicted:
                action = "reading its peak memory"
                peaks = group.call(HostMethods.rlinfra_run, args=(memory_peak,), action=action).wait()
                kind = "device" if "device" in peaks[0] else "rss"
                measured = [peak.get(kind, peak["rss"]) for peak in peaks]
                self.result.memory[group.name] = self.out.memory(
                    group.name, predicted[group.name], measured, kind
                )

    def _standard_record(self) -> dict[str, Any]:
        """What every iteration's record has: progress, versions, the weight barrier's times."""
        record: dict[str, Any] = {
            "iteration": self.state.iteration,
            "time_s": round(self.state.training_s, 3),
            "learner_version": self.learner_version,
            "served_version": self.served_version,
        } | {key: round(value, 5) for key, value in self.sync_s.items()}
        if self._probe is not None:
            record["logprob_mismatch"] = self.logprob_mismatch
        return record

    def _reached(self, record: dict[str, Any]) -> bool:
        target, value = self.job.target(), record.get(self.job.target_key)
        return target is not None and value is not None and value >= target

    def _end_open_batches(self) -> None:
        """Batches in flight when the run ends are never trained on: each id ends, as dropped."""
        self.in_flight.clear()
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
        the layout, with the run's deadlines; the group already running under ``name`` when the
        loop runs again. ``max_concurrency=2`` lets a receiver stage the next weights while it
        serves. A group of ``WeightReceiver`` workers gets the trainer's weights: its first ones
        (rank 0's ``weights_state()``) now, every later version through ``stage`` and ``commit``."""
        running = next((g for g in self._groups if g.name == name), None)
        if running is not None:
            return running
        with self.console.status(f"starting {name}"):
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
        if issubclass(launched.worker_cls, WeightReceiver):
            if self._receivers is not None:
                raise ContractError(
                    f"{name} and {self._receivers.name} both receive weights; a run has one receiving group"
                )
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
            raise JobConfigError(
                f"{key}: {total} cannot be split evenly over {ranks} {component} workers; "
                f"expected a multiple of {ranks}"
            )
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
        if self.layout is not None:  # the new process ids
            self.out.placed(self.placement, self.layout, self.result, self._groups, self.cluster.logs_dir)

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
