"""Engine-style receivers: the version is loaded into the engine's own parameters and checked there.

A real inference engine cannot keep a second device copy of a large model, and what it serves is
its own parameters, not a buffer the update filled. An ``EngineReceiver`` stages each version in
private host memory (hashed as it lands), loads it into the engine at the swap (``engine_load``),
verifies the engine's parameters against it (``engine_check``), loads the previous host copy on
rollback, and drops the engine's caches (``weights_loaded``) before generation resumes. The
engine implements ``engine_state`` (views of what it serves, under the trainer's names) and may
override the other hooks. See docs/engines.md#engine-style-receivers.
"""

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rlinfra.runtime.served_asleep import served_asleep
from rlinfra.services.weights import buckets
from rlinfra.services.weights.buffers import Buffers, Expected, WeightsSwapError, check_holds
from rlinfra.services.weights.roles import WeightReceiver


class EngineStagingError(ValueError):
    """An engine receiver was asked to stage a version somewhere it cannot exchange with its engine."""


class EngineReceiver(WeightReceiver):
    """Mixin for a rollout worker whose engine serves from its own parameters (module docstring).

    ``set_initial_weights(tensors)`` loads ``tensors`` into the engine; ``set_initial_weights()``
    (no tensors) serves what the engine starts from (``engine_start_state``: by default what it
    holds already, e.g. a model loaded from a checkpoint).
    """

    weights_as_torch = True

    # -------------------------------------------------------------------- the engine's hooks
    @served_asleep
    def engine_state(self) -> Mapping[str, Any]:
        raise NotImplementedError(
            "an EngineReceiver must implement engine_state() -> {name: tensor}: views of the "
            "parameters its engine serves, under the trainer's names"
        )

    @served_asleep
    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Put each (name, tensor) into the engine: by default an in-place copy into the tensor
        ``engine_state()`` names (host to device on a GPU engine)."""
        import torch

        state = self.engine_state()
        with torch.no_grad():
            for name, tensor in named_tensors:
                target = state.get(name)
                if target is None:
                    known = ", ".join(list(state)[:4])
                    raise ValueError(f"the engine has no parameter {name!r} (engine_state() has {known} ...)")
                target.copy_(tensor)

    @served_asleep
    def weights_loaded(self, version: int) -> None:
        """The engine now serves ``version``: drop every cache computed with other weights."""

    def engine_logprobs(self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[list[float]]:
        """For each (prompt ids, completion ids): the engine's log-probs of the completion's
        tokens given what precedes them, at temperature 1 (``rlinfra.services.weights.probe``)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not implement engine_logprobs(sequences): the log-prob probe "
            "compares it with the trainer's"
        )

    @served_asleep
    def engine_load(self, host: Buffers) -> None:
        """The engine serves ``host``'s version: its tensors loaded, caches dropped."""
        self.load_weights(host.tensors.items())
        self.weights_loaded(host.version)

    @served_asleep
    def engine_check(self, host: Buffers) -> None:
        """The engine's parameters, hashed in ``host``'s bucket layout, against ``host``'s bytes."""
        engine = self.engine_state()
        held = Buffers(host.version, host.manifest)
        for spec in host.manifest.buckets:
            held.checksums[spec.index] = buckets.arrays_checksum(buckets.bucket_views(engine, spec))
        expected = host.checksums or {spec.index: host.digest(spec.index) for spec in host.manifest.buckets}
        check_holds(f"engine check of version {host.version}", held, Expected(host.version, expected))

    @served_asleep
    def engine_start_state(self) -> Mapping[str, Any]:
        """What ``set_initial_weights()`` serves when given nothing: what the engine holds now."""
        return self.engine_state()

    # ------------------------------------------------------------------ the receiver's steps
    def set_initial_weights(self, tensors: Mapping[str, Any] | None = None, version: int = 0) -> None:
        """Serve ``version`` before the first update: ``tensors``, or (none given) what the engine
        starts from; kept as the host copy, loaded and checked like any version."""
        state = self.engine_start_state() if tensors is None else tensors
        host = self.private_buffers(version, buckets.Manifest(version, buckets.plan_buckets(state)))
        host.fill(state)
        host.build_views(as_torch=True)
        self._weights_serve(host)

    def _weights_serve(self, first: Buffers) -> None:
        """Load and check ``first`` in the engine before it is served: initial weights, or a peer's
        version (verified as it was copied); the engine serves nothing new until it passes."""
        self.engine_load(first)
        self.engine_check(first)
        super()._weights_serve(first)

    def weights_begin(self, manifest: buckets.Manifest, kind: type[Buffers] = Buffers) -> None:
        if kind is not Buffers:
            raise EngineStagingError(
                f"{getattr(self, '_worker_name', type(self).__name__)} is an engine receiver: it stages "
                f"a version in private host memory and loads it into its engine, but this transport "
                f"stages in {kind.__name__}; use transport='object_store' or 'broadcast'"
            )
        super().weights_begin(manifest, kind)

    def weights_swap(self, owner: str, version: int) -> None:
        """Load the staged version into the engine (the gate is closed: nothing generates)."""
        with self._weights() as state:
            staged = state.staged(owner, version)
            try:
                self.engine_load(staged)
            except BaseException as error:
                with contextlib.suppress(Exception):  # the failed load is the error to report
                    self.engine_load(state.current)
                if isinstance(error, Exception):
                    raise WeightsSwapError(
                        f"loading version {version} into the engine failed: {error}"
                    ) from error
                raise
            state.swap(owner, version)

    def weights_verify(self, expected: Expected) -> None:
        """The host copy as it landed (version, checksums), then what the engine holds."""
        with self._weights() as state:
            state.verify(expected)
            self.engine_check(state.current)

    def weights_rollback(self, version: int) -> None:
        """Undo a swap to ``version``: the previous host copy is loaded again."""
        with self._weights() as state:
            swapped = state.current.version == version and state.previous is not None
            state.rollback(version)
            if swapped:
                self.engine_load(state.current)

    def weights_snapshot(self) -> Buffers:
        """Packed under the gate's lock: the next update reuses the previous version's memory."""
        with self._weights():
            return super().weights_snapshot()
