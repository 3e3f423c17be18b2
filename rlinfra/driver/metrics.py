"""A run's metrics: one JSON line per step, the same scalars as TensorBoard event files and, with
``run.wandb``, the same records in a W&B run.

``metrics.jsonl`` is the record a script reads back (plots, benchmarks, tests); TensorBoard is
where RL users look while a run goes on (``tensorboard --logdir OUTPUT/tensorboard``). Both are
appended and flushed as each step finishes, so a killed run keeps every finished step; a resumed
run continues both; ``rewind(step)`` forgets the steps after ``step`` in both (a trainer restarted
from that checkpoint redoes them), TensorBoard by its own ``purge_step``.

Only the driver writes here (and only the driver imports wandb): workers return their metrics, so
on a real cluster the folder lives on the driver's machine and no shared filesystem is needed.
"""

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlinfra.config import JobConfigError

from .settings import WandbSettings

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
STEP = "iteration"  # the record key TensorBoard's x axis is


class MetricsLog:
    """Appends one record per step to ``folder/metrics.jsonl`` and, with ``tensorboard``, each of
    its finite numbers as a scalar (tag = key, x = the record's ``iteration``) to
    ``folder/tensorboard``. ``resume_at`` (a step) continues both from that step, the later ones
    forgotten (they are redone), instead of starting them again. Given a W&B run (``wandb``, see
    ``wandb_run``), every record and event is logged to it too."""

    def __init__(self, folder: Path, resume_at: int | None = None, *, tensorboard: bool = True):
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / METRICS_FILE
        self.tensorboard_dir = folder / TENSORBOARD_DIR if tensorboard else None
        if resume_at is None and self.tensorboard_dir is not None:
            for old in self.tensorboard_dir.glob("events.out.tfevents.*"):
                old.unlink()  # a fresh run's curves must not be drawn over the last run's
        self._events = len(read_events(folder)) if resume_at is not None else 0
        self._open(resume_at)
        self.wandb: Any = None  # a W&B run, once given

    def write(self, record: Mapping[str, Any]) -> None:
        finite = _finite(record)
        self._file.write(json.dumps(finite) + "\n")
        self._file.flush()
        if self._board is not None:
            step = int(finite[STEP])
            for key, value in finite.items():
                if key != STEP and isinstance(value, int | float) and not isinstance(value, bool):
                    self._board.add_scalar(key, value, global_step=step)
            self._board.flush()
        if self.wandb is not None:
            self.wandb.log(finite)

    def event(self, event: Mapping[str, Any]) -> None:
        """Something that happened (a worker replaced, the trainer restarted): a line with an
        ``event`` key in ``metrics.jsonl`` (``read_events``), and in TensorBoard a text entry and
        the running count ``events``. Rewinding keeps events: they did happen."""
        finite = _finite(event)
        self._file.write(json.dumps(finite) + "\n")
        self._file.flush()
        self._events += 1
        if self.wandb is not None:
            self.wandb.log(finite)
        if self._board is not None:
            step = int(event.get(STEP) or 0)
            self._board.add_text("events", json.dumps(dict(event)), global_step=step)
            self._board.add_scalar("events", self._events, global_step=step)
            self._board.flush()

    def rewind(self, step: int) -> None:
        """Forget every record after ``step`` (the trainer was restarted from that checkpoint and
        redoes them): both files keep each step once (W&B's history only grows: it logs them again)."""
        self._close_files()
        self._open(step)

    def close(self, summary: Mapping[str, Any] | None = None) -> None:
        """Both files closed; the W&B run given ``summary`` and finished (failed, if it says so)."""
        self._close_files()
        if self.wandb is not None:
            self.wandb.summary.update(dict(summary or {}))
            self.wandb.finish(exit_code=int((summary or {}).get("outcome") == "failed"))

    def _close_files(self) -> None:
        self._file.close()
        if self._board is not None:
            self._board.close()

    def _open(self, step: int | None) -> None:
        """Both logs, keeping the events and every record up to ``step`` (None: no record); later
        steps' TensorBoard events are dropped by its ``purge_step``."""
        records = _read_lines(self.path.parent) if step is not None else []
        kept = [r for r in records if "event" in r or r[STEP] <= step]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
        self._file = self.path.open("a", encoding="utf-8")
        self._board = None if self.tensorboard_dir is None else _board(self.tensorboard_dir, step)


def _board(folder: Path, purge_after: int | None) -> Any:
    """A TensorBoard writer; with ``purge_after``, events of later steps are dropped."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as error:
        missing = "run.tensorboard is on but TensorBoard is not installed: pip install tensorboard"
        raise ImportError(f"{missing} (or set run.tensorboard=false)") from error
    purge_step = None if purge_after is None else int(purge_after) + 1
    return SummaryWriter(log_dir=str(folder), purge_step=purge_step, flush_secs=5)


def wandb_run(folder: Path, settings: WandbSettings, config: Mapping[str, Any], resuming: bool) -> Any:
    """A W&B run with ``config``, writing under ``folder/wandb``, its charts against ``iteration``;
    ``resuming``: the last run there goes on (its id ends the name of wandb's ``latest-run`` link).
    Refused (a ``JobConfigError``) when wandb is not installed or, online, has no API key: it
    would ask for one."""
    try:
        import wandb
    except ImportError as error:
        installed = "wandb is not installed: pip install 'rlinfra[wandb]'"
        raise JobConfigError(installed, where="run.wandb") from error
    if settings.mode == "online" and not wandb.login(prompt=False, verify=False):
        no_key = "no W&B API key: set WANDB_API_KEY or run `wandb login` (or set mode: offline)"
        raise JobConfigError(no_key, where="run.wandb")
    latest = folder / "wandb" / "latest-run"
    run_id = latest.resolve().name.rsplit("-", 1)[1] if resuming and latest.exists() else None
    run = wandb.init(
        project=settings.project, name=settings.name, mode=settings.mode, dir=folder, config=dict(config),
        id=run_id, resume="allow", settings=wandb.Settings(silent=True),
    )  # fmt: skip
    run.define_metric("*", step_metric=STEP)
    return run


def read_metrics(folder: Path) -> list[dict[str, Any]]:
    """Every step's record in ``folder/metrics.jsonl``, in order (events aside)."""
    return [record for record in _read_lines(folder) if "event" not in record]


def read_events(folder: Path) -> list[dict[str, Any]]:
    """Every event in ``folder/metrics.jsonl`` (see ``MetricsLog.event``), in order."""
    return [record for record in _read_lines(folder) if "event" in record]


def _read_lines(folder: Path) -> list[dict[str, Any]]:
    path = folder / METRICS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _finite(record: Mapping[str, Any]) -> dict[str, Any]:
    """JSON has no NaN: a value not yet defined (a mean over no episodes) is written as null."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
