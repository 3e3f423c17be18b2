"""What a run shows and writes, in one place: the layout before any worker starts, a progress bar
(on a terminal) and the job's line per step, ``metrics.jsonl`` (and TensorBoard, and W&B), every
survived fault (a console line, a metrics event, an entry of ``summary.json``), ``placement.json``,
and at the end the training time to the target, the curve and ``summary.json``. A W&B run
(``run.wandb``) gets the job's config, the placement, each record and event, and the summary."""

import itertools
import json
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rlinfra.driver.metrics import MetricsLog, read_metrics, wandb_run
from rlinfra.placement import ComponentPlacement
from rlinfra.runtime.cluster import Cluster
from rlinfra.runtime.group import WorkerGroup
from rlinfra.runtime.layout import Layout
from rlinfra.runtime.supervision import Restart
from rlinfra.views.node_view import node_loads
from rlinfra.views.plan_view import render_plan

from .entry import plot_curve
from .result import PLACEMENT_FILE, SUMMARY_FILE, RunResult

OVER_PLAN = 1.25  # a measured peak this far above the memory plan's prediction is a warning
CURVE_FILE = "curve.png"


class RunOutputs:
    """The console, the progress bar and the files of the run whose ``result`` it keeps (its job,
    its output folder); ``resume_at``: the iteration the metrics continue from (None: a fresh run);
    ``runs``: whether the run will run at all (a resumed run that has ended opens no W&B run)."""

    def __init__(self, console: Console, result: RunResult, resume_at: int | None, runs: bool = True) -> None:
        self.console, self.result, self.output = console, result, result.output_dir
        job = self.job = result.job
        self.layout: Layout | None = None  # once reserved (``plan``)
        self.log = MetricsLog(self.output, resume_at, tensorboard=job.settings.tensorboard)
        if job.settings.wandb is not None and runs:  # before Ray starts: refused here if it cannot log
            config, resuming = job.config.model_dump(mode="json"), resume_at is not None
            self.log.wandb = wandb_run(self.output, job.settings.wandb, config, resuming)
        self.bar = Progress(
            TextColumn(f"[bold]{job.title}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
            console=console, disable=not console.is_terminal,
        )  # fmt: skip
        self.task = self.bar.add_task("train", total=None, status="")

    def plan(self, cluster: Cluster, placement: ComponentPlacement, layout: Layout) -> None:
        """The same tables, map and layout as ``rlinfra plan``, for the live cluster and the
        placement group just reserved; the relations of the job's components, for the result."""
        self.placement, self.layout, self.logs = placement, layout, cluster.logs_dir
        cpus = [int(node.resources.get("CPU", 0)) for node in cluster.nodes]
        loads = node_loads(layout.plan, cluster.spec.num_nodes, cpus)
        render_plan(self.console, cluster.spec, placement, layout.plan, loads, show_all=False)
        self.console.print()
        pairs = itertools.pairwise(self.job.components)
        self.result.relations = {f"{a}-{b}": layout.plan.relation(a, b) for a, b in pairs}

    def placed(self, groups: list[WorkerGroup]) -> None:
        """``placement.json``, once the layout is reserved: where each component's ranks were
        placed and each one's process id, once they run, and the folder of their logs (for
        ``rlinfra logs``); written again after every recovery (a replaced rank is a new process)."""
        if self.layout is None:
            return
        layout, placement, result = self.layout, self.placement, self.result
        names, info = self.job.components, {group.name: group.worker_info for group in groups}
        placements = {name: placement.get_placements(name) for name in names}
        result.placements = {name: [p.to_dict() for p in ranks] for name, ranks in placements.items()}
        wrong = [(name, row) for name in names for row in layout.bundle_report(name) if not row.matches]
        result.misplaced_bundles = [
            f"{name}:{row.rank} planned on node {row.planned_node_rank}, placed on {row.node_rank}"
            for name, row in wrong
        ]
        processes = {  # each rank's process now (``rlinfra status``, ``rlinfra logs``)
            f"{name}:{p.rank}": {"node": p.cluster_node_rank, "pid": info[name][p.rank].get("pid")}
            for name, ranks in placements.items()
            if name in info
            for p in ranks
        }
        placed = {"components": result.placements, "relations": result.relations, "processes": processes}
        placed["logs"] = self.logs
        (self.output / PLACEMENT_FILE).write_text(json.dumps(placed, indent=1), encoding="utf-8")
        if self.log.wandb is not None:
            self.log.wandb.config.update({"placement": placed}, allow_val_change=True)

    def begin(self, total: int, done: int) -> None:
        """The progress bar, from ``done`` of ``total`` steps."""
        self.bar.update(self.task, total=total, completed=done)
        self.bar.start()

    def step(self, record: dict[str, Any]) -> None:
        """A step's record: logged, on the bar, and as the job's line."""
        self.log.write(record)
        key = self.job.target_key
        status = f"{key} {record[key]:.3f}" if record.get(key) is not None else ""
        self.bar.update(self.task, completed=record["iteration"], status=status)
        line = self.job.line(record)
        if line is not None:
            self.console.print(line, highlight=False, soft_wrap=True)

    def event(self, restart: Restart, iteration: int, served_after_s: float, **extra: Any) -> dict[str, Any]:
        """A survived fault: a console line and a metrics event; returns it for ``summary.json``."""
        event = {
            "event": restart.outcome, "iteration": iteration, "component": restart.component,
            "rank": restart.rank, "node": restart.node_rank, "cause": restart.reason.partition("\n")[0],
            "detail": restart.detail, "served_after_s": round(served_after_s, 3),
        } | {key: value for key, value in extra.items() if value is not None}  # fmt: skip
        self.log.event(event)
        worker, cause = f"{restart.component}:{restart.rank}", event["cause"]
        line = f"{worker}: dropped after {cause}; its node is lost, the run goes on without it"
        if restart.node_rank is not None:
            again = f"serving again {served_after_s:.1f} s later"
            line = f"{worker} on node {restart.node_rank}: {restart.outcome} after {cause}; {again}"
        self.console.print(f"[yellow]recovered[/] {line}", highlight=False, soft_wrap=True)
        return event

    def memory(self, component: str, predicted: int, measured: list[int], kind: str) -> None:
        """A component's measured peaks (``kind``: ``rss`` or ``device``) beside the memory plan's
        prediction: a metrics event, an entry of ``summary.json``, and a warning naming the rank
        more than 25 % over it."""
        record = {"event": "memory", "component": component, "predicted_bytes": predicted, "measured": kind}
        self.result.memory[component] = record | {"measured_bytes": measured}
        self.log.event(self.result.memory[component])
        worst = max(measured)
        if worst > OVER_PLAN * predicted:
            peak = f"{component}:{measured.index(worst)} peaked at {worst / 2**30:.2f} GiB ({kind})"
            over = f"{worst / predicted - 1:.0%} over the plan's {predicted / 2**30:.2f} GiB"
            self.console.print(f"[yellow]warning:[/] {peak}, {over}", highlight=False, soft_wrap=True)

    def end(self, name: str) -> None:
        """However the run ended: the bar stopped; the training time to the target (from every
        record, resumed runs included), the curve towards it, ``summary.json``; the log closed."""
        self.bar.stop()
        job, settings, result = self.job, self.job.settings, self.result
        key, target = job.target_key, job.target()
        if key and target is not None:
            points = [p for p in job.curve(read_metrics(self.output)) if p.get(key) is not None]
            first = next((p for p in points if p[key] >= target), None)  # the first crossing
            if first is not None:
                result.time_to_target_s, result.iterations_to_target = first["time_s"], first.get("iteration")
            if settings.plot:
                title = f"{job.title}: {name or self.output.name}"
                result.plot = plot_curve(points, self.output / CURVE_FILE, key, target, title, job.unit)
        summary = result.summary()
        (self.output / SUMMARY_FILE).write_text(json.dumps(summary, indent=1), encoding="utf-8")
        self.log.close(summary)
