"""A job's ``main``: run it, print how it ended, return the process's exit status; and the
learning curve every job draws.

A refused config or placement is the user's to fix (exit 2, one line naming the key); a launched
run that failed prints what failed and where, with the failure report (exit 1); Ctrl-C ends with
130 after cleanup, as a shell expects.
"""

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from rlinfra.config import ConfigError
from rlinfra.driver.batches import BatchLedgerError
from rlinfra.driver.checkpoints import CheckpointError
from rlinfra.driver.supervisor import UnsupervisedLoss
from rlinfra.runtime.errors import ClusterError, WorkerGroupError
from rlinfra.runtime.supervision import SupervisionError
from rlinfra.runtime.timeshared import TimeSharingError
from rlinfra.services.weights import WeightSyncError
from rlinfra.services.weights.probe import LogprobMismatchError

from .records import ContractError
from .result import RunResult

USAGE_ERROR, FAILED, INTERRUPTED = 2, 1, 130
USAGE_ERRORS = (
    ConfigError, ContractError, ClusterError, FileNotFoundError, CheckpointError, TimeSharingError
)  # fmt: skip
RUN_FAILURES = (
    WorkerGroupError, WeightSyncError, SupervisionError, UnsupervisedLoss,
    BatchLedgerError, LogprobMismatchError,
)  # fmt: skip


def job_main(
    run: Callable[..., RunResult],
    cfg: Mapping[str, Any],
    *,
    resume: bool = False,
    usage_errors: tuple[type[BaseException], ...] = (),
) -> int:
    """``run(cfg, resume=..., console=...)``, then its report; the exit status (see the module)."""
    console, errors = Console(), Console(stderr=True)
    refused: tuple[type[BaseException], ...] = (*USAGE_ERRORS, *usage_errors)
    try:
        result = run(cfg, resume=resume, console=console)
    except refused as error:
        errors.print(Text.assemble(("error: ", "bold red"), str(error)), highlight=False)
        return USAGE_ERROR
    except RUN_FAILURES as error:
        notes = "\n".join(getattr(error, "__notes__", []))
        errors.print(Text.assemble(("the run failed: ", "bold red"), f"{error}\n{notes}"), highlight=False)
        return FAILED
    console.print(result.report(), highlight=False, soft_wrap=True)
    return INTERRUPTED if result.interrupted else 0


def plot_curve(
    points: Sequence[Mapping[str, Any]], path: Path, key: str, target: float, title: str, unit: str
) -> Path | None:
    """``key`` against the ``iteration`` (called ``unit``) and ``time_s`` of each point, one panel
    each, with a dashed line at ``target``, as a PNG at ``path``; None when no point has a ``key``."""
    drawn = [point for point in points if point.get(key) is not None]
    if not drawn:
        return None
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a cluster or in CI
    from matplotlib import pyplot as plt

    xs = (("iteration", f"{unit}s"), ("time_s", "training seconds"))
    figure, panels = plt.subplots(1, len(xs), figsize=(5 * len(xs), 4), constrained_layout=True)
    for axes, (x, label) in zip(panels, xs, strict=True):
        axes.plot([p[x] for p in drawn], [p[key] for p in drawn], marker=".", linewidth=1.5)
        axes.axhline(target, color="tab:green", linestyle="--", linewidth=1, label="target")
        axes.set(xlabel=label, ylabel=key.replace("_", " "))
        axes.grid(alpha=0.3)
        axes.legend(loc="lower right")
    figure.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
