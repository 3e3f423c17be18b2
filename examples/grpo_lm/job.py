"""The second main job: GRPO on a small Hugging Face transformer, placed by a YAML config on Ray.

``main`` is what ``rlinfra run`` calls (``run.entrypoint: examples.grpo_lm.job:main``); ``run`` is
the job's life: parse the config, make (or load) the start checkpoint, place, launch, train
(``loop.TrainingLoop``), and release everything it started, however it ends.

    rlinfra run examples/grpo_lm/disaggregated.yaml [algo.updates=200 ...] [--resume]
    rlinfra run examples/grpo_lm/colocated.yaml

Outputs (``run.output_dir``): ``metrics.jsonl``, TensorBoard event files (``tensorboard/``),
``accuracy_curve.png``, ``summary.json``, ``placement.json``, ``checkpoints/`` (``--resume``
continues from the last), and ``failure.json`` if the run failed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from examples.grpo_lm.config import JobConfig, JobConfigError, parse_job_config
from examples.grpo_lm.launch import PLACED, Components, check_shape, launch, placements
from examples.grpo_lm.lm.model import ModelLoadError, load_pretrained
from examples.grpo_lm.lm.warmup import warm_start
from examples.grpo_lm.loop import DriverState, TrainingLoop
from rlinfra import Cluster, ComponentPlacement
from rlinfra.placement import PlacementError
from rlinfra.runtime.errors import ClusterError, WorkerGroupError
from rlinfra.runtime.layout import Layout
from rlinfra.runtime.supervision import SupervisionError
from rlinfra.runtime.timesharing import TimeSharingError
from rlinfra.services.checkpoints import CheckpointError, CheckpointStore
from rlinfra.services.failure_report import FailureReport
from rlinfra.services.metrics import METRICS_FILE, TENSORBOARD_DIR, MetricsLog
from rlinfra.services.signals import CtrlC, sigint_ignored
from rlinfra.services.supervisor import UnsupervisedLoss
from rlinfra.services.weights import WeightSyncError
from rlinfra.services.weights.probe import LogprobMismatchError

USAGE_ERROR, FAILED, INTERRUPTED = 2, 1, 130
# What ends a launched run (with a failure report), as opposed to a refused config.
RUN_FAILURES = (WorkerGroupError, WeightSyncError, SupervisionError, UnsupervisedLoss, LogprobMismatchError)
PLOT_FILE = "accuracy_curve.png"
PLACEMENT_FILE = "placement.json"
SUMMARY_FILE = "summary.json"  # the run's outcome: warm-up and held-out curve, time to target, switches


@dataclass
class JobResult:
    """What a run did; the CLI prints it, the tests and the benchmark check it."""

    job: JobConfig
    state: DriverState
    output_dir: Path
    start_checkpoint: str = ""
    resumed_from: int = 0
    interrupted: bool = False
    reached_target: bool = False
    wall_s: float = 0.0
    plot: Path | None = None
    placements: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    relation: str = ""  # actor-rollout: "colocated" or "disaggregated"
    switches: dict[str, float] = field(default_factory=dict)  # colocated: the time-sharing summary
    phases: list[tuple[str, str]] = field(default_factory=list)  # colocated: (component, sleep/wake) in order

    @property
    def iterations(self) -> int:
        return self.state.iteration

    @property
    def warm_accuracy(self) -> float | None:
        return self.state.warm_accuracy

    @property
    def accuracy(self) -> float | None:
        return self.state.accuracy

    @property
    def time_to_target_s(self) -> float | None:
        """Training seconds until held-out accuracy first reached warm-up + ``target_gain``."""
        warm = self.state.warm_accuracy
        if warm is None:
            return None
        target = warm + self.job.algo.target_gain
        return next((t for _, t, accuracy in self.state.curve if accuracy >= target), None)

    def summary(self) -> dict[str, Any]:
        """What ``summary.json`` keeps (the benchmark reads it)."""
        return {
            "iterations": self.iterations,
            "interrupted": self.interrupted,
            "relation": self.relation,
            "warm_accuracy": self.warm_accuracy,
            "accuracy": self.accuracy,
            "target_gain": self.job.algo.target_gain,
            "time_to_target_s": self.time_to_target_s,
            "training_s": round(self.state.training_s, 3),
            "wall_s": round(self.wall_s, 3),
            "curve": [{"iteration": i, "time_s": t, "accuracy": a} for i, t, a in self.state.curve],
            "switches": self.switches,
            "batches": self.state.ledger.summary(),
        }


def main(cfg: Mapping[str, Any], *, resume: bool = False) -> int:
    """Run, then say what happened and where the outputs are. Returns the process exit status."""
    console, errors = Console(), Console(stderr=True)
    try:
        result = run(cfg, resume=resume, console=console)
    except (
        JobConfigError,
        PlacementError,
        ClusterError,
        FileNotFoundError,
        CheckpointError,
        ModelLoadError,
        TimeSharingError,
    ) as error:
        errors.print(Text.assemble(("error: ", "bold red"), str(error)), highlight=False)
        return USAGE_ERROR
    except (
        WorkerGroupError,
        WeightSyncError,
        SupervisionError,
        UnsupervisedLoss,
        LogprobMismatchError,
    ) as error:
        notes = "\n".join(getattr(error, "__notes__", []))
        errors.print(Text.assemble(("run failed: ", "bold red"), str(error), "\n", notes), highlight=False)
        return FAILED
    console.print(summary(result), highlight=False)
    return INTERRUPTED if result.interrupted else 0


def run(
    cfg: Mapping[str, Any],
    *,
    resume: bool = False,
    console: Console | None = None,
    cluster: Cluster | None = None,
    on_iteration: Callable[[dict[str, Any]], None] | None = None,
) -> JobResult:
    """Place, launch and train; always release what was started. ``cluster``: an existing cluster
    to use (and leave running); ``on_iteration`` sees each metrics record as it is written.
    Ctrl-C ends the run after cleanup with ``interrupted=True``; ``resume`` continues from the last
    checkpoint in ``run.output_dir``."""
    started = time.perf_counter()
    console = console or Console()
    job = parse_job_config(cfg)
    output = Path(job.run.output_dir)
    store = CheckpointStore(output)
    checkpoint = store.load_latest() if resume else None
    if resume and checkpoint is None:
        raise FileNotFoundError(f"--resume: no checkpoint in {output}; run once without --resume first")
    start_path = _start_checkpoint(job, console)  # a model that cannot load fails here, before Ray
    _check_engine(job, start_path)
    state = DriverState.restore(checkpoint.state if checkpoint else None)
    result = JobResult(job, state, output, start_path, resumed_from=state.iteration)
    log = MetricsLog(output, resume=resume, tensorboard=job.run.tensorboard)
    if checkpoint is not None:
        log.rewind(state.iteration)  # iterations logged after the checkpoint are redone
    own_cluster, live, sync = cluster is None, None, None
    ctrl_c = CtrlC()
    try:
        cluster = cluster or Cluster(cfg["cluster"])
        placement = ComponentPlacement(cfg, cluster)
        check_shape(placement, job)
        with console.status("reserving the layout"):
            live = Components(Layout(cluster, placement, PLACED))
        result.relation = live.layout.plan.relation("actor", "rollout")
        _check_time_sharing(job, cluster, result.relation)
        with console.status("starting workers"):
            actor_bytes = checkpoint.payloads["actor"] if checkpoint else None
            sync = launch(live, cluster, placement, job, start_path, actor_bytes)
        result.placements = placements(placement)
        placed = {"components": result.placements, "relations": {"actor-rollout": result.relation}}
        (output / PLACEMENT_FILE).write_text(json.dumps(placed, indent=1), encoding="utf-8")

        def save(actor_state: bytes, driver_state: dict[str, Any]) -> None:
            store.save(int(driver_state["iteration"]), {"actor": actor_state}, driver_state)

        resumed_from = (checkpoint.payloads["actor"], checkpoint.state) if checkpoint else None
        loop = TrainingLoop(live, sync, job, state, log, save, resumed_from)
        with ctrl_c.watching(), _progress(console, job.algo.updates, state.iteration) as show:
            for record in loop.iterations():
                show(record)
                if on_iteration is not None:
                    on_iteration(record)
                if ctrl_c.pressed:
                    raise KeyboardInterrupt
        result.reached_target = result.time_to_target_s is not None
    except KeyboardInterrupt:
        result.interrupted = True
        state.ledger.dropped(state.ledger.open_ids)  # in flight at the stop: a resumed run makes its own
    except Exception as error:
        if live is not None and live.supervisor is not None:  # launched: the run failed, report it
            FailureReport.of_run(error, output, live.supervisor, state.trainer_restarts, sync, state.ledger)
        raise
    finally:
        with sigint_ignored():  # a second Ctrl-C must not cut the cleanup short
            log.close()
            if live is not None:
                if live.turns is not None:
                    result.switches = live.turns.summary()
                    result.phases = [(p.component, p.action) for p in live.turns.phases]
                live.shutdown()
            if own_cluster and cluster is not None:
                cluster.shutdown()
            result.plot = _plot(job, output, state)
            result.wall_s = time.perf_counter() - started
            (output / SUMMARY_FILE).write_text(json.dumps(result.summary(), indent=1), encoding="utf-8")
    return result


def _start_checkpoint(job: JobConfig, console: Console) -> str:
    """``model.path`` checked by loading it, or the warm-up checkpoint (made once, then cached)."""
    if job.model.path:
        load_pretrained(job.model.path)  # ModelLoadError names the path and what is wrong
        return str(Path(job.model.path).resolve())
    with console.status("supervised warm-up (once; cached under algo.cache_dir)"):
        path = warm_start(job.algo.cache_dir, job.algo.grpo(), log=lambda line: console.print(line))
    return str(Path(path).resolve())


def _check_engine(job: JobConfig, start_path: str) -> None:
    """The vLLM engine refuses, before Ray starts, a model it cannot serve faithfully."""
    if job.engine.name != "vllm":
        return
    from rlinfra.engines.vllm import VLLMSettings, VLLMSettingsError

    try:
        VLLMSettings(model=start_path, **job.engine.vllm_settings()).check()
    except VLLMSettingsError as error:
        raise JobConfigError(f"engine: {error}") from None


def _check_time_sharing(job: JobConfig, cluster: Cluster, relation: str) -> None:
    """vLLM has sleep mode on GPUs only: colocated with the actor on simulated GPUs (a CPU
    machine), the engines could never give the devices back. Refused before anything starts;
    on a real CPU cluster the engine's own ``sleep`` refuses, naming the platform."""
    if job.engine.name == "vllm" and relation == "colocated" and cluster.config.simulate is not None:
        raise JobConfigError(
            "engine.name: vllm with actor and rollout colocated needs vLLM's sleep mode, which vLLM has "
            "on GPUs only; this cluster simulates its GPUs on a CPU machine (cluster.simulate): use a "
            "disaggregated layout (examples/grpo_lm/vllm.yaml), or engine.name: hf"
        )


def _progress(console: Console, total: int, done: int) -> Any:
    """A progress bar with the last record's accuracy, reward and weight version."""
    import contextlib

    @contextlib.contextmanager
    def shown() -> Any:
        columns = (
            TextColumn("[bold]GRPO"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[status]}"),
        )
        with Progress(*columns, console=console, transient=False) as progress:
            task = progress.add_task("updates", total=total, completed=done, status="")
            last: dict[str, Any] = {"accuracy": None}

            def show(record: dict[str, Any]) -> None:
                if record.get("accuracy") is not None:
                    last["accuracy"] = record["accuracy"]
                accuracy = "—" if last["accuracy"] is None else f"{last['accuracy']:.3f}"
                status = (
                    f"held-out {accuracy} | reward {record.get('reward_mean', 0):.3f} | "
                    f"serving v{record['served_version']} | {record['tokens_per_s']:.0f} tok/s"
                )
                progress.update(task, completed=record["iteration"], status=status)

            yield show

    return shown()


def summary(result: JobResult) -> str:
    """What the CLI prints at the end of a run."""
    algo, warm, accuracy = result.job.algo, result.warm_accuracy, result.accuracy
    reached = result.time_to_target_s
    head = (
        f"interrupted after update {result.iterations}; continue with --resume"
        if result.interrupted
        else f"{result.iterations} updates: held-out exact match {_num(warm)} (warm-up) → {_num(accuracy)}"
    )
    lines = [
        head,
        f"target warm-up + {algo.target_gain:g}: "
        + (f"reached after {reached:.1f} s of training" if reached is not None else "not reached")
        + f" ({result.wall_s:.1f} s wall, including the warm-up check, Ray start and launch)",
        f"metrics: {result.output_dir / METRICS_FILE}",
    ]
    if result.job.run.tensorboard:
        lines.append(f"tensorboard: tensorboard --logdir {result.output_dir / TENSORBOARD_DIR}")
    if result.plot is not None:
        lines.append(f"accuracy curve: {result.plot}")
    if result.switches:
        switches, p50 = result.switches["switches"], result.switches["total_p50_s"]
        lines.append(f"time-sharing: {switches:.0f} switches between actor and rollout, p50 {p50:.3f} s")
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _plot(job: JobConfig, output: Path, state: DriverState) -> Path | None:
    """Held-out accuracy against updates and training time, with the target line."""
    if not (job.run.plot and state.curve):
        return None
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, (by_update, by_time) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    iterations, seconds, accuracy = zip(*state.curve, strict=True)
    target = (state.warm_accuracy or 0.0) + job.algo.target_gain
    for axes, xs, label in ((by_update, iterations, "updates"), (by_time, seconds, "training seconds")):
        axes.plot(xs, accuracy, marker=".", linewidth=1.5)
        axes.axhline(
            target,
            color="tab:green",
            linestyle="--",
            linewidth=1,
            label=f"warm-up + {job.algo.target_gain:g}",
        )
        axes.set_xlabel(label)
        axes.set_ylabel("held-out exact match")
        axes.grid(alpha=0.3)
        axes.legend(loc="lower right")
    figure.suptitle(f"GRPO on 2-digit addition: {job.name or output.name}")
    path = output / PLOT_FILE
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


__all__ = ["JobResult", "main", "run"]
