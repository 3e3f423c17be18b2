"""Checkpoints: committed atomically by one rename, checked by sha256, never unpickled."""

from __future__ import annotations

import io
import json
import math
import pickle

import pytest
import torch

from rlinfra.driver.checkpoints import LEGACY_PICKLE, CheckpointError, CheckpointStore


def tensor_bytes(value: float) -> bytes:
    buffer = io.BytesIO()
    torch.save({"w": torch.full((4,), value)}, buffer)
    return buffer.getvalue()


def test_save_then_load_round_trips_and_keeps_two_steps(tmp_path):
    store = CheckpointStore(tmp_path)
    for step in (1, 2, 3):
        store.save(step, {"actor": tensor_bytes(step)}, {"iteration": step, "returns": [1.0, 2.5]})
    loaded = store.load_latest()
    assert loaded is not None and loaded.step == 3 and loaded.state == {"iteration": 3, "returns": [1.0, 2.5]}
    assert torch.load(io.BytesIO(loaded.payloads["actor"]), weights_only=True)["w"].tolist() == [3.0] * 4
    assert sorted(p.name for p in store.root.glob("step-*")) == ["step-00000002", "step-00000003"]


def test_a_crash_before_the_commit_leaves_the_previous_checkpoint(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, {"actor": tensor_bytes(1)}, {"iteration": 1})
    with pytest.raises(ValueError):  # NaN is not JSON: refused before any file of step 2 exists
        store.save(2, {"actor": tensor_bytes(2)}, {"iteration": 2, "loss": math.nan})
    assert not (store.root / "step-00000002").exists()
    assert store.load_latest().step == 1


def test_a_file_that_does_not_match_its_checksum_is_refused(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, {"actor": tensor_bytes(1)}, {"iteration": 1})
    path = store.root / "step-00000001" / "actor.pt"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="does not match its sha256"):
        store.load_latest()


def test_an_unknown_format_is_refused(tmp_path):
    store = CheckpointStore(tmp_path)
    store.root.mkdir(parents=True)
    store.latest_path.write_text(json.dumps({"format": "other"}))
    with pytest.raises(CheckpointError, match="not an rlinfra checkpoint"):
        store.load_latest()


def test_an_old_pickle_checkpoint_is_never_unpickled(tmp_path):
    class Boom:
        def __reduce__(self):
            return (exec, ("raise SystemExit('unpickled!')",))

    (tmp_path / LEGACY_PICKLE).write_bytes(pickle.dumps(Boom()))
    with pytest.raises(CheckpointError, match="never loaded"):
        CheckpointStore(tmp_path).load_latest()
