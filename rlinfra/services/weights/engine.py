"""Engine-style receivers: the version is loaded into the engine's own parameters and verified there.

A real inference engine (vLLM, SGLang, a Hugging Face model serving ``generate``) cannot keep a
second device copy of a large model, and what it serves is its own parameters, not a buffer the
update filled. An ``EngineReceiver`` therefore works like this:

    prepare (generation goes on)  the version is staged in host memory (one private copy, the
                                   object_store or broadcast transport), hashed as it lands
    pause → swap                   bucket by bucket, the staged tensors are loaded into the engine
                                   (``load_weights``: an in-place copy by default) and the bytes
                                   the engine held go back into the staging memory, which becomes
                                   the host copy of the previous version
    verify                         the engine's parameters as they are now (``engine_state``) are
                                   hashed in the version's bucket layout and compared with the
                                   trainer's checksums: a load that went wrong is caught, not only
                                   a transfer that did
    rollback                       the same exchange again: the previous host copy is reloaded
    resume                         ``weights_loaded`` has dropped every cache made with the old
                                   weights (KV cache, prefix cache) before the gate opens

Memory beyond the engine's own parameters: one host copy of the model (the staging memory, which
the next update reuses) and a scratch buffer as large as the largest bucket, for the exchange. The
pause does the loading and one hash of the engine's parameters: on a GPU engine that is a
host-to-device copy and a device-to-host read per bucket, which is what a swap verified on what
the engine serves costs.

The engine implements two methods (and may override the others):

    engine_state()           {trainer's name: tensor} — views of the parameters the engine serves
                             (no copies), under the names the trainer's state dict uses
    load_weights(named)      put each (name, host tensor) into the engine; default: ``copy_`` in
                             place into ``engine_state()[name]``
    weights_loaded(version)  drop caches computed with other weights; default: nothing
    engine_logprobs(seqs)    the engine's log-probs of given tokens, for the log-prob probe
                             (``rlinfra.services.weights.probe``)

Staging needs private host memory: ``object_store_shared`` (read-only shared memory) and
``cuda_ipc`` (device memory) are refused at the first update, naming the receiver.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rlinfra.runtime.served_asleep import served_asleep
from rlinfra.services.weights import buckets
from rlinfra.services.weights.admission import Snapshot
from rlinfra.services.weights.buckets import Manifest
from rlinfra.services.weights.buffers import Buffers, DoubleBuffers, Expected, check_holds
from rlinfra.services.weights.roles import WeightReceiver


class EngineStagingError(ValueError):
    """An engine receiver was asked to stage a version somewhere it cannot exchange with its engine."""


class EngineWeights(Buffers):
    """The version an engine serves: its own parameters (``tensors``), in the version's bucket
    layout. Holds no bytes of its own (never allocated, its views never built); ``digest`` hashes
    what the engine holds now."""

    def digest(self, index: int) -> int:
        spec = self.manifest.buckets[index]
        return buckets.arrays_checksum(buckets.bucket_views(self.tensors, spec))


class EngineReceiver(WeightReceiver):
    """Mixin for a rollout worker whose engine serves from its own parameters (module docstring).

    ``set_initial_weights(tensors)`` loads ``tensors`` into the engine; ``set_initial_weights()``
    (no tensors) adopts what the engine holds already (e.g. a model loaded from a checkpoint).
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

    # ------------------------------------------------------------------ the receiver's steps
    def set_initial_weights(self, tensors: Mapping[str, Any] | None = None, version: int = 0) -> None:
        """Serve ``version`` before the first update: ``tensors`` loaded into the engine, or (none
        given) the parameters the engine holds now."""
        if tensors:
            self.load_weights(tensors.items())
        state = self.engine_state()
        manifest = Manifest(version, buckets.plan_buckets(state))
        self._rlinfra_weights = DoubleBuffers(EngineWeights(version, manifest, tensors=state))
        self.weights_loaded(version)

    def weights_begin(self, manifest: Manifest, kind: type[Buffers] = Buffers) -> None:
        if kind is not Buffers:
            raise EngineStagingError(
                f"{getattr(self, '_worker_name', type(self).__name__)} is an engine receiver: it stages "
                f"a version in private host memory and exchanges it with its engine, but this transport "
                f"stages in {kind.__name__}; use transport='object_store' or 'broadcast'"
            )
        super().weights_begin(manifest, kind)

    def weights_stage_done(self, version: int) -> None:
        self._weights_shadow(version).build_views(as_torch=True)  # load_weights takes torch tensors

    def weights_swap(self, owner: str, version: int) -> None:
        """Load the staged version into the engine (the gate is closed: nothing generates); the
        staging memory then holds the previous version, for rollback."""
        with self._weights() as state:
            self._load(state, state.staged(owner, version), checksums={})

    def weights_verify(self, expected: Expected) -> None:
        """Hash the parameters the engine holds now, in the version's bucket layout, and check
        them against the trainer's checksums (versions only, with ``checksums=False``)."""
        with self._weights() as state:
            current = state.current
            current.checksums = {index: current.digest(index) for index in expected.checksums}
            state.verify(expected)

    def weights_rollback(self, version: int) -> None:
        """Undo a swap to ``version`` by loading the previous host copy back into the engine (the
        staging memory then holds the rejected bytes, and is reused by the next update)."""
        with self._weights() as state:
            state.shadow = None
            previous = state.previous
            held = previous is not None and previous.version >= 0 and bool(previous.tensors)
            if state.current.version == version and previous is not None and held:
                self._load(state, previous, checksums=dict(previous.checksums))
                previous.version, previous.checksums = -1, {}  # a spare: its bytes are the rejected ones

    def weights_admit(self, source: list[Any], expected: Expected) -> None:
        """Take a peer's snapshot, verified (``AdmissionReceiver``), load it into the engine and
        verify the engine's parameters against the same checksums; keep the copy as staging
        memory for the next update."""
        super().weights_admit(source, expected)
        taken = self._weights().current
        del self._rlinfra_weights  # serves nothing until the engine's parameters verify
        self.load_weights(taken.tensors.items())
        serving = EngineWeights(taken.version, taken.manifest, tensors=self.engine_state())
        serving.checksums = {index: serving.digest(index) for index in taken.checksums}
        loading = f"admission (loading version {taken.version} into the engine)"
        check_holds(loading, serving, Expected(taken.version, taken.checksums))
        taken.version = -1
        state = DoubleBuffers(serving)
        state.previous = taken
        self._rlinfra_weights = state
        self.weights_loaded(serving.version)

    def weights_snapshot(self) -> Snapshot:
        """The serving version packed under the gate's lock: the engine's parameters change in
        place on a swap, so they are read whole or not at all."""
        with self._weights():
            return super().weights_snapshot()

    # -------------------------------------------------------------------------- the exchange
    def _load(self, state: DoubleBuffers, host: Buffers, checksums: dict[int, int]) -> None:
        """Exchange ``host`` with the engine: the engine then serves ``host``'s version (known to
        hash to ``checksums``) and ``host``, as the previous version, holds what the engine served."""
        serving, version = state.current, host.version
        self._exchange(host)
        host.version, host.checksums = serving.version, dict(serving.checksums)
        state.current = EngineWeights(
            version, host.manifest, checksums=checksums, tensors=self.engine_state()
        )
        state.previous, state.shadow = host, None
        self.weights_loaded(version)

    def _exchange(self, host: Buffers) -> None:
        """Bucket by bucket: the engine's bytes to a scratch buffer, ``host``'s tensors into the
        engine (one ``load_weights`` call per bucket), the scratch into ``host``'s memory.
        Afterwards the engine holds what ``host`` held and ``host`` what the engine held. The
        scratch, as large as the largest bucket, is kept for the next exchange: a fresh temporary
        each time would leave freed memory resident (glibc keeps it in the heap), so the
        receiver's footprint would creep above one copy."""
        engine = self.engine_state()
        largest = max((spec.nbytes for spec in host.manifest.buckets), default=0)
        scratch = getattr(self, "_rlinfra_exchange_scratch", None)
        if scratch is None or scratch.nbytes < largest:
            scratch = self._rlinfra_exchange_scratch = np.empty(largest, dtype=np.uint8)
        for spec, bucket in zip(host.manifest.buckets, host.buckets, strict=True):
            held, _ = buckets.pack(engine, spec, out=scratch[: spec.nbytes], hashed=False)
            self.load_weights([(entry.name, host.tensors[entry.name]) for entry in spec.entries])
            np.copyto(bucket, held)
