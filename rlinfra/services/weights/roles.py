"""The two sides of a weight update, as mixins for ``Worker`` classes.

``WeightSender`` (the trainer) packs its state dict into checksummed buckets; ``WeightReceiver``
(a rollout worker) keeps two buffers — *current*, which generation reads, and *shadow*, which an
update fills while generation goes on — and a gate that generation passes through:

    class Rollout(WeightReceiver, Worker):
        def generate(self, prompts):
            with self.serving() as weights:            # blocks only while paused for a swap
                return [Sample(weights.version, ...)]  # every sample carries its version

The gate is a lock with an owner and a lease: a driver that dies while the workers are paused
cannot leave them paused for ever — the pause ends on its own when the lease runs out.
Launch receivers with ``max_concurrency >= 2`` so that staging runs beside generation.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlinfra.services.weights.buckets import (
    BucketSpec,
    Manifest,
    bucket_arrays,
    checksum,
    pack,
    plan_buckets,
    unpack,
)

DEFAULT_SERVE_TIMEOUT_S = 60.0


class WeightsPausedError(TimeoutError):
    """Generation waited longer than its deadline for a paused update to finish."""


@dataclass(frozen=True)
class WeightsView:
    """The weights a piece of generation uses: its version and tensors (read-only views)."""

    version: int
    tensors: Mapping[str, Any]


@dataclass
class _Buffers:
    version: int
    manifest: Manifest | None = None
    buckets: list[np.ndarray] = field(default_factory=list)
    checksums: dict[int, int] = field(default_factory=dict)
    tensors: Mapping[str, Any] = field(default_factory=dict)


class _ReceiverState:
    def __init__(self, initial_version: int, tensors: Mapping[str, Any]) -> None:
        self.lock = threading.Condition()
        self.current = _Buffers(initial_version, tensors=dict(tensors))
        self.shadow: _Buffers | None = None
        self.previous: _Buffers | None = None
        self.paused_by: str | None = None
        self.pause_until = 0.0
        self.in_flight = 0
        self.served: dict[int, int] = {}  # version -> generation calls served with it


class WeightReceiver:
    """Mixin for workers that serve generation from weights the trainer publishes."""

    weights_as_torch = False  # unpack into torch tensors instead of numpy arrays

    # ------------------------------------------------------------------------ generation side
    def _weights(self) -> _ReceiverState:
        state = getattr(self, "_rlinfra_weights", None)
        if state is None:
            state = _ReceiverState(0, {})
            self._rlinfra_weights = state
        return state

    def set_initial_weights(self, tensors: Mapping[str, Any], version: int = 0) -> None:
        """Weights to serve before the first update (e.g. loaded from a checkpoint)."""
        self._rlinfra_weights = _ReceiverState(version, tensors)

    @property
    def weight_version(self) -> int:
        return self._weights().current.version

    @contextmanager
    def serving(self, timeout_s: float = DEFAULT_SERVE_TIMEOUT_S) -> Iterator[WeightsView]:
        """Use the current weights for one piece of generation. Waits (at most ``timeout_s``)
        while an update holds the gate; the version cannot change until the block exits."""
        state = self._weights()
        deadline = time.monotonic() + timeout_s
        with state.lock:
            while state.paused_by is not None:
                now = time.monotonic()
                if now >= state.pause_until:  # the owner's lease ran out: reopen the gate
                    state.paused_by = None
                    state.lock.notify_all()
                    break
                if now >= deadline:
                    raise WeightsPausedError(
                        f"generation waited {timeout_s:g} s for a weight update ({state.paused_by}) to finish"
                    )
                state.lock.wait(min(deadline, state.pause_until) - now)
            state.in_flight += 1
            view = WeightsView(state.current.version, state.current.tensors)
            state.served[view.version] = state.served.get(view.version, 0) + 1
        try:
            yield view
        finally:
            with state.lock:
                state.in_flight -= 1
                state.lock.notify_all()

    # -------------------------------------------------------------------------- update side
    def _weights_begin(self, manifest: Manifest) -> None:
        """Allocate (or reuse) shadow buffers for ``manifest``; generation keeps going."""
        state = self._weights()
        with state.lock:
            reusable = state.previous if state.previous is not None else None
            state.previous = None
        shadow = _Buffers(manifest.version, manifest)
        if (
            reusable is not None
            and reusable.manifest is not None
            and _same_layout(reusable.manifest, manifest)
        ):
            shadow.buckets = reusable.buckets  # double buffering: the last-but-one weights' memory
        else:
            shadow.buckets = [np.empty(bucket.nbytes, dtype=np.uint8) for bucket in manifest.buckets]
        state.shadow = shadow

    def _weights_receive(self, version: int, index: int, payload: list[np.ndarray]) -> int:
        """Copy one bucket's tensors (zero-copy views of the object store) into the shadow
        buffer, then checksum what landed there."""
        shadow = self._require_shadow(version)
        target = shadow.buckets[index]
        entries = shadow.manifest.buckets[index].entries
        if len(payload) != len(entries):
            raise ValueError(f"bucket {index}: got {len(payload)} tensors, expected {len(entries)}")
        for entry, array in zip(entries, payload, strict=True):
            if array.nbytes != entry.nbytes:
                raise ValueError(f"{entry.name}: got {array.nbytes} bytes, expected {entry.nbytes}")
            np.copyto(target[entry.offset : entry.offset + entry.nbytes], array)
        shadow.checksums[index] = checksum(target)
        return shadow.checksums[index]

    def _weights_receive_broadcast(self, version: int, group_name: str, src: int = 0) -> dict[int, int]:
        """Receive every bucket from a cross-component process group, in bucket order."""
        import torch

        from rlinfra.runtime.rendezvous import cross_group

        shadow = self._require_shadow(version)
        group = cross_group(group_name)
        for index, buffer in enumerate(shadow.buckets):
            group.broadcast(torch.from_numpy(buffer), src=src)
            shadow.checksums[index] = checksum(buffer)
        return dict(shadow.checksums)

    def _weights_stage_done(self, version: int) -> None:
        """Build the tensor views of the shadow now, so that the swap itself is O(1)."""
        shadow = self._require_shadow(version)
        tensors: dict[str, Any] = {}
        for spec, buffer in zip(shadow.manifest.buckets, shadow.buckets, strict=True):
            tensors.update(unpack(buffer, spec, as_torch=self.weights_as_torch))
        shadow.tensors = tensors

    def _weights_pause(self, owner: str, lease_s: float, drain_timeout_s: float) -> int:
        """Close the gate (owner + lease) and wait for in-flight generation to drain."""
        state = self._weights()
        deadline = time.monotonic() + drain_timeout_s
        with state.lock:
            if state.paused_by is not None and time.monotonic() < state.pause_until:
                raise RuntimeError(f"already paused by {state.paused_by}")
            state.paused_by, state.pause_until = owner, time.monotonic() + lease_s
            while state.in_flight:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"{state.in_flight} generation call(s) still running after {drain_timeout_s:g} s"
                    )
                state.lock.wait(remaining)
            return state.served.get(state.current.version, 0)

    def _weights_swap(self, owner: str, version: int) -> int:
        """Make the shadow current (O(1)); keep the old current for rollback. Returns the old version."""
        state = self._weights()
        with state.lock:
            self._check_owner(state, owner)
            shadow = self._require_shadow(version)
            if not shadow.tensors:
                raise RuntimeError(f"version {version} is not fully staged")
            state.previous, state.current, state.shadow = state.current, shadow, None
            return state.previous.version

    def _weights_verify(self, version: int, expected: Mapping[int, int]) -> dict[str, Any]:
        """The version serving now and the checksum of every bucket as received."""
        state = self._weights()
        with state.lock:
            current = state.current
            mismatched = sorted(i for i, value in expected.items() if current.checksums.get(i) != value)
            if current.version != version or mismatched:
                raise ValueError(
                    f"verify failed: serving version {current.version} (expected {version}); "
                    f"checksum mismatch in bucket(s) {mismatched[:8]}"
                )
            return {"version": current.version, "buckets": len(current.checksums)}

    def _weights_rollback(self, owner: str, version: int) -> int:
        """Undo a swap to ``version`` (no-op if it did not happen); drop any staged shadow."""
        state = self._weights()
        with state.lock:
            state.shadow = None
            if state.current.version == version and state.previous is not None:
                state.current, state.previous = state.previous, state.current
            return state.current.version

    def _weights_resume(self, owner: str) -> int:
        """Reopen the gate (only its owner may). Returns the version now serving."""
        state = self._weights()
        with state.lock:
            if state.paused_by == owner:
                state.paused_by = None
                state.lock.notify_all()
            return state.current.version

    def _weights_stats(self) -> dict[str, Any]:
        state = self._weights()
        with state.lock:
            return {"version": state.current.version, "served": dict(state.served), "paused": state.paused_by}

    def _require_shadow(self, version: int) -> _Buffers:
        shadow = self._weights().shadow
        if shadow is None or shadow.version != version:
            raise RuntimeError(f"no staged weights for version {version}")
        return shadow

    @staticmethod
    def _check_owner(state: _ReceiverState, owner: str) -> None:
        if state.paused_by != owner:
            raise RuntimeError(f"the update gate is held by {state.paused_by!r}, not {owner!r}")


def _same_layout(first: Manifest, second: Manifest) -> bool:
    return [b.nbytes for b in first.buckets] == [b.nbytes for b in second.buckets]


class WeightSender:
    """Mixin for the trainer: ``weights_state()`` returns the state dict to publish."""

    def weights_state(self) -> Mapping[str, Any]:
        raise NotImplementedError("a WeightSender must implement weights_state() -> {name: tensor}")

    def _weights_open(self, version: int, bucket_bytes: int) -> Manifest:
        """Fix the state to send (a reference, no copy) and its bucket layout."""
        state = self.weights_state()
        self._rlinfra_sending = (version, state, plan_buckets(state, bucket_bytes))
        return Manifest(version, self._rlinfra_sending[2])

    def _weights_put(self, version: int, index: int) -> tuple[int, list[Any]]:
        """Put bucket ``index``'s tensors into the object store as they are (one copy, no packing);
        returns the checksum of their bytes and ``[ref]``."""
        import ray

        state, spec = self._sending(version, index)
        arrays, digest = bucket_arrays(state, spec)
        return digest, [ray.put(arrays)]

    def _weights_broadcast(self, version: int, group_name: str) -> dict[int, int]:
        """Send every bucket through a cross-component process group (this rank is its src)."""
        import torch

        from rlinfra.runtime.rendezvous import cross_group

        group = cross_group(group_name)
        digests: dict[int, int] = {}
        buffer: np.ndarray | None = None
        for spec in self._rlinfra_sending[2]:
            state, spec = self._sending(version, spec.index)
            if buffer is None or buffer.nbytes < spec.nbytes:
                buffer = np.empty(spec.nbytes, dtype=np.uint8)
            view, digests[spec.index] = pack(state, spec, buffer[: spec.nbytes])
            group.broadcast(torch.from_numpy(view), src=group.rank)
        return digests

    def _weights_close(self, version: int) -> None:
        if getattr(self, "_rlinfra_sending", (None,))[0] == version:
            self._rlinfra_sending = None

    def _sending(self, version: int, index: int) -> tuple[Mapping[str, Any], BucketSpec]:
        sending = getattr(self, "_rlinfra_sending", None)
        if sending is None or sending[0] != version:
            raise RuntimeError(f"no open weight export for version {version}")
        return sending[1], sending[2][index]
