"""What the driver shows: the plan before any worker starts, a line per iteration, the summary.

Everything printed goes through here, so the driver loop says what happens, not how it looks.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from examples.ppo_cartpole import reporting
from examples.ppo_cartpole.state import JobResult
from rlinfra import Cluster, ComponentPlacement
from rlinfra.runtime.bundles import LayoutPlan


def show_plan(console: Console, cluster: Cluster, placement: ComponentPlacement, layout: LayoutPlan) -> None:
    """The same tables, map and layout as ``rlinfra plan``, for the live cluster and the placement
    group just reserved (and what each node holds of its CPUs), before any worker starts."""
    from rlinfra.cli.node_view import node_loads
    from rlinfra.cli.plan_view import render_plan

    cpus = [int(node.resources.get("CPU", 0)) for node in cluster.nodes]
    loads = node_loads(layout, cluster.spec.num_nodes, cpus)
    render_plan(console, cluster.spec, placement, layout, loads, show_all=False)
    console.print()


@contextlib.contextmanager
def iteration_display(console: Console, total: int, done: int) -> Iterator[Callable[[dict[str, Any]], None]]:
    """A progress bar (on a terminal) and a function that shows one iteration's record."""
    columns = (
        TextColumn("[bold]PPO"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
    )
    # Without a terminal (CI, a pipe) the per-iteration lines say it all; a bar would only be
    # printed once, at the end, cut to 80 columns.
    with Progress(*columns, console=console, transient=False, disable=not console.is_terminal) as progress:
        task = progress.add_task("train", total=total, completed=done, status="starting")

        def show(record: dict[str, Any]) -> None:
            progress.update(task, completed=record["iteration"], status=_status(record))
            console.print(_line(record), highlight=False, soft_wrap=True)

        yield show


def summary(result: JobResult) -> str:
    """The closing lines: outcome, time-to-target, throughput and where the files are."""
    algo = result.job.algo
    target = f"{algo.target_return:g}"
    if result.interrupted:
        head = (
            f"interrupted after iteration {result.iterations}; workers and placement groups released; "
            f"continue with --resume (checkpoint in {result.output_dir})"
        )
    elif result.solved:
        head = f"reached mean return {target} (last {algo.return_window} episodes: {result.mean_return:.1f})"
    else:
        head = (
            f"did NOT reach mean return {target} in {result.iterations} iterations ({result.mean_return:.1f})"
        )
    reached = result.state.time_to_target_s
    ttt = f"{reached:.1f} s" if reached is not None else "—"
    lines = [
        head,
        f"time-to-{target}: {ttt} training ({result.wall_s:.1f} s wall, including Ray start and launch) | "
        f"{result.iterations} iterations | {result.env_steps} env steps | {result.steps_per_s:.0f} steps/s",
        f"metrics: {result.output_dir / reporting.METRICS_FILE}",
    ]
    if result.job.run.tensorboard:
        lines.append(f"tensorboard: tensorboard --logdir {result.output_dir / reporting.TENSORBOARD_DIR}")
    if result.plot is not None:
        lines.append(f"learning curve: {result.plot}")
    return "\n".join(lines)


def _status(record: dict[str, Any]) -> str:
    return (
        f"return {_num(record['mean_return'])} | weights v{record['served_version']} | "
        f"sync {record['sync_s'] * 1e3:.0f} ms | {record['steps_per_s']:.0f} steps/s"
    )


def _line(record: dict[str, Any]) -> str:
    return (
        f"iter {record['iteration']:3d} | steps {record['env_steps']:6d} | return "
        f"{_num(record['mean_return'])} | batch v{record['batch_version']} → learner "
        f"v{record['learner_version']} | serving v{record['served_version']} | collect "
        f"{record['collect_s']:.2f} s train {record['train_s']:.2f} s sync {record['sync_s'] * 1e3:.0f} ms"
    )


def _num(value: float) -> str:
    return "   n/a" if value is None or math.isnan(value) else f"{value:6.1f}"
