"""The main job: PPO on CartPole, its three components placed by a YAML config and launched on Ray.

``main`` is what ``rlinfra run`` calls (``run.entrypoint: examples.ppo_cartpole.job:main``) and
``python -m examples.ppo_cartpole`` too; ``run`` is the job's life: parse the config, place,
launch, train (``loop.train``), and release everything it started, however it ends.

Entry points: ``rlinfra run examples/ppo_cartpole/disaggregated.yaml`` and
``python -m examples.ppo_cartpole --config-name disaggregated algo.iterations=50``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from examples.ppo_cartpole import reporting
from examples.ppo_cartpole.config import JobConfig, JobConfigError, env_spaces, parse_job_config
from examples.ppo_cartpole.console import show_plan, summary
from examples.ppo_cartpole.launch import (
    COMPONENTS,
    Components,
    launch,
    misplaced_bundles,
    placements,
    relations,
    split_envs,
)
from examples.ppo_cartpole.loop import RolloutScaling, train
from examples.ppo_cartpole.state import DriverState, JobResult
from rlinfra import Cluster, ComponentPlacement
from rlinfra.placement import PlacementError
from rlinfra.runtime.errors import ClusterError, WorkerGroupError
from rlinfra.runtime.layout import Layout
from rlinfra.runtime.supervision import SupervisionError
from rlinfra.services.batches import BatchLedgerError
from rlinfra.services.checkpoints import CheckpointError
from rlinfra.services.failure_report import FailureReport
from rlinfra.services.signals import sigint_ignored
from rlinfra.services.supervisor import UnsupervisedLoss
from rlinfra.services.weights import WeightSyncError

USAGE_ERROR, FAILED, INTERRUPTED = 2, 1, 130


def main(cfg: Mapping[str, Any], *, resume: bool = False) -> int:
    """Run, then say what happened and where the outputs are. Returns the process exit status."""
    console = Console()
    errors = Console(stderr=True)
    try:
        result = run(cfg, resume=resume, console=console)
    except (JobConfigError, PlacementError, ClusterError, FileNotFoundError, CheckpointError) as error:
        errors.print(Text.assemble(("error: ", "bold red"), str(error)), highlight=False)
        return USAGE_ERROR
    except (WorkerGroupError, WeightSyncError, SupervisionError, UnsupervisedLoss, BatchLedgerError) as error:
        notes = "\n".join(getattr(error, "__notes__", []))
        errors.print(Text.assemble(("the job failed: ", "bold red"), str(error)), highlight=False)
        if notes:
            errors.print(notes, highlight=False)
        return FAILED
    console.print(summary(result), highlight=False, soft_wrap=True)
    return INTERRUPTED if result.interrupted else 0


def run(
    cfg: Mapping[str, Any],
    *,
    resume: bool = False,
    cluster: Cluster | None = None,
    console: Console | None = None,
    on_iteration: Callable[[dict[str, Any]], None] | None = None,
    between_rollouts: Callable[[RolloutScaling], None] | None = None,
) -> JobResult:
    """Place, launch and train; always release what was started. ``cluster``: an existing cluster
    to use (and leave running); ``on_iteration`` sees each metrics record as it is written;
    ``between_rollouts`` may remove or add rollout workers once per iteration (elastic rollout).
    Ctrl-C ends the run after cleanup with ``interrupted=True``; ``resume`` continues from the last
    checkpoint in ``run.output_dir``."""
    started = time.perf_counter()
    console = console or Console()
    job = parse_job_config(cfg)
    spaces = env_spaces(job.algo.env_id)  # a wrong env id fails here, before Ray starts
    output = Path(job.run.output_dir)
    checkpoint = reporting.load_checkpoint(output) if resume else None
    state = DriverState.restore(checkpoint["driver"] if checkpoint else None, job.algo.return_window)
    result = JobResult(job, state, output, resumed_from=state.iteration)
    log = reporting.MetricsLog(output, resume=resume, tensorboard=job.run.tensorboard)
    own_cluster, live, sync = cluster is None, None, None
    try:
        cluster = cluster or Cluster(cfg["cluster"])
        placement = ComponentPlacement(cfg, cluster)
        envs_per_worker = split_envs(placement, job.algo)
        with console.status("reserving the layout"):
            live = Components(Layout(cluster, placement, COMPONENTS))
        show_plan(console, cluster, placement, live.layout.plan)  # what was reserved, before any worker
        with console.status("starting workers"):
            actor_checkpoint = checkpoint["actor"] if checkpoint else None
            sync = launch(live, cluster, placement, job, spaces, envs_per_worker, actor_checkpoint)
        placed = {"components": placements(placement), "relations": relations(live.layout)}
        reporting.write_placement(output, placed)
        result.placements, result.misplaced_bundles = placed["components"], misplaced_bundles(live.layout)
        resumed_from = (checkpoint["actor"], checkpoint["driver"]) if checkpoint else None
        result.solved = train(
            live, sync, job, state, log, console, on_iteration, between_rollouts, resumed_from
        )
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
                live.shutdown()
            if own_cluster and cluster is not None:
                cluster.shutdown()
            result.plot = _plot(job, output)
            result.wall_s = time.perf_counter() - started
    return result


def _plot(job: JobConfig, output: Path) -> Path | None:
    """The learning curve from every metrics line in ``output`` (resumed runs included), if asked."""
    records = reporting.read_metrics(output)
    if not (job.run.plot and records):
        return None
    title = f"PPO {job.algo.env_id}: {job.name or output.name}"
    return reporting.plot_learning_curve(records, output / reporting.PLOT_FILE, job.algo.target_return, title)
