"""Checkpoints in a folder, written atomically, in formats that cannot run code when loaded.

    checkpoints/
      step-00000012/actor.pt        a worker's tensors, as ``torch.save`` bytes (load with
                                    ``torch.load(..., weights_only=True)``: tensors and plain data only)
      latest.json                   the commit point: step, driver state (JSON), each file's sha256

A save writes the step's files first (each through a temporary name, fsynced), then replaces
``latest.json`` in one rename; older steps are deleted only after that. A crash at any moment
leaves the previous checkpoint whole. Loading checks every file against its recorded sha256 and
never unpickles: the driver reads JSON and bytes, and the worker that owns the tensors loads them
with ``weights_only``. Workers hand their state over as bytes, so the folder lives on the driver's
machine and no shared filesystem is needed.
"""

import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FOLDER = "checkpoints"
LATEST = "latest.json"
FORMAT = "rlinfra-checkpoint/1"
KEEP = 2  # steps kept on disk: the latest and the one before


LEGACY_PICKLE = "checkpoint.pkl"  # what older versions of the PPO job wrote


class CheckpointError(RuntimeError):
    """A checkpoint is missing, of an unknown format, or its files do not match their checksums."""


@dataclass(frozen=True)
class Checkpoint:
    """One loaded checkpoint: its step, the driver's JSON state, each worker payload's bytes."""

    step: int
    state: dict[str, Any]
    payloads: dict[str, bytes]
    path: Path


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)


class CheckpointStore:
    """``save`` and ``load_latest`` under ``folder/checkpoints``."""

    def __init__(self, folder: Path) -> None:
        self.root = Path(folder) / FOLDER
        self.latest_path = self.root / LATEST

    def save(self, step: int, payloads: Mapping[str, bytes], state: Mapping[str, Any]) -> None:
        """Write step ``step``: each payload (``name`` → bytes) and the driver's ``state`` (must be
        JSON: a value JSON cannot hold is refused before anything is written)."""
        state_json = json.dumps(dict(state), allow_nan=False)  # fails before any file is touched
        step_dir = self.root / f"step-{step:08d}"
        step_dir.mkdir(parents=True, exist_ok=True)
        files = {}
        for name, data in payloads.items():
            if not name.isidentifier():
                raise ValueError(f"checkpoint payload name {name!r}: expected an identifier")
            _write_atomically(step_dir / f"{name}.pt", data)
            files[name] = {"path": f"{step_dir.name}/{name}.pt", "sha256": hashlib.sha256(data).hexdigest()}
        latest = {"format": FORMAT, "step": step, "files": files, "state": json.loads(state_json)}
        _write_atomically(self.latest_path, json.dumps(latest, indent=1).encode())
        steps = sorted(p for p in self.root.glob("step-*") if p.is_dir())
        for old in steps[:-KEEP]:  # only now: the previous checkpoint stays whole until this one is
            if old != step_dir:
                shutil.rmtree(old, ignore_errors=True)

    def load_latest(self) -> Checkpoint | None:
        """The last committed checkpoint, checked; None when there is none. A pickle that older
        versions wrote beside it is refused, never unpickled (unpickling runs code)."""
        if not self.latest_path.exists():
            legacy = self.root.parent / LEGACY_PICKLE
            if legacy.exists():
                raise CheckpointError(f"{legacy}: an older version's pickle, never loaded; start again")
            return None
        try:
            latest = json.loads(self.latest_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as error:
            raise CheckpointError(f"{self.latest_path}: unreadable ({error})") from None
        if not isinstance(latest, dict) or latest.get("format") != FORMAT:
            raise CheckpointError(f"{self.latest_path}: not an rlinfra checkpoint (expected format {FORMAT})")
        payloads = {}
        for name, entry in latest["files"].items():
            path = self.root / entry["path"]
            try:
                data = path.read_bytes()
            except OSError as error:
                raise CheckpointError(f"checkpoint step {latest['step']}: {path}: {error.strerror}") from None
            if hashlib.sha256(data).hexdigest() != entry["sha256"]:
                raise CheckpointError(f"checkpoint step {latest['step']}: {path} does not match its sha256")
            payloads[name] = data
        return Checkpoint(int(latest["step"]), dict(latest["state"]), payloads, self.latest_path)
