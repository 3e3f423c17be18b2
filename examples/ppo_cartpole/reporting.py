"""What the job leaves in its output folder: metrics (JSONL and TensorBoard), the learning curve
(PNG), checkpoints.

Only the driver writes here. Workers send their state as bytes, so on a real cluster the folder
lives on the driver's machine and no shared filesystem is needed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlinfra.services.checkpoints import CheckpointError, CheckpointStore
from rlinfra.services.metrics import METRICS_FILE, TENSORBOARD_DIR, MetricsLog, read_metrics

PLOT_FILE = "learning_curve.png"
CHECKPOINT_FILE = "checkpoints/latest.json"  # the commit point; tensors beside it
LEGACY_PICKLE = "checkpoint.pkl"  # what older versions wrote: refused, never unpickled
PLACEMENT_FILE = "placement.json"
__all__ = ["METRICS_FILE", "TENSORBOARD_DIR", "MetricsLog", "read_metrics"]  # the job's metrics, from rlinfra


def plot_learning_curve(records: Sequence[dict[str, Any]], path: Path, target: float, title: str) -> Path:
    """Mean episode return against environment steps and against training time."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a cluster or in CI
    from matplotlib import pyplot as plt

    points = [r for r in records if r.get("mean_return") is not None]
    figure, (by_steps, by_time) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for axes, key, label in ((by_steps, "env_steps", "environment steps"), (by_time, "time_s", "seconds")):
        axes.plot([r[key] for r in points], [r["mean_return"] for r in points], marker=".", linewidth=1.5)
        axes.axhline(target, color="tab:green", linestyle="--", linewidth=1, label=f"target {target:g}")
        axes.set_xlabel(label)
        axes.set_ylabel("mean episode return")
        axes.grid(alpha=0.3)
        axes.legend(loc="lower right")
    figure.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def save_checkpoint(folder: Path, actor_state: bytes, driver_state: dict[str, Any]) -> Path:
    """The trainer's ``torch.save`` bytes and the driver's state (JSON), committed atomically
    (``rlinfra.services.checkpoints``): a crash mid-write leaves the previous checkpoint whole."""
    return CheckpointStore(folder).save(int(driver_state["iteration"]), {"actor": actor_state}, driver_state)


def load_checkpoint(folder: Path) -> dict[str, Any]:
    """``{"actor": bytes, "driver": state}`` from the last checkpoint in ``folder``, checked against
    its checksums. Nothing is unpickled: the trainer loads its bytes with ``weights_only``."""
    checkpoint = CheckpointStore(folder).load_latest()
    if checkpoint is None:
        if (folder / LEGACY_PICKLE).exists():
            raise CheckpointError(
                f"--resume: {folder / LEGACY_PICKLE} is a pickle from an older version, which is never "
                "loaded (unpickling runs code); run again without --resume"
            )
        raise FileNotFoundError(
            f"--resume: no checkpoint at {folder / CHECKPOINT_FILE}; run once without --resume first"
        )
    return {"actor": checkpoint.payloads["actor"], "driver": checkpoint.state}


def write_placement(folder: Path, placement: dict[str, Any]) -> Path:
    path = folder / PLACEMENT_FILE
    path.write_text(json.dumps(placement, indent=1), encoding="utf-8")
    return path
