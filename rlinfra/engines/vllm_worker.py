"""What rlinfra adds to every vLLM worker process: loading a version with the model's own loader,
and checking every parameter of the worker's shard against that version.

vLLM imports this module in each of its workers (``LLM(worker_extension_cls=...)``): the worker
in the engine's own process at ``tensor_parallel_size=1``, one spawned process per rank above
it. The engine calls the methods by name (``collective_rpc("rlinfra_load", ...)``), so no
function is pickled and nothing but a ``Payload`` (file paths and the bucket layout) crosses the
pipe: the worker maps the version's buckets where the engine staged them (``MappableBuffers``)
and hands the tensors, as views, to the model's ``load_weights``. That loader knows each
architecture's fused parameters (``qkv_proj``, ``gate_up_proj``), padded vocabulary and
tensor-parallel sharding, so rlinfra keeps no name map of its own.

``rlinfra_check`` is the verify step on the engine's own memory. The expected shard is made by
the same loader from the same payload, into zeroed memory of the parameters' shapes (host memory,
so a GPU holds no second copy): a parameter the load missed or left stale, a rank that loaded
another version or nothing, and padding that is not zero all differ from it. The payload itself
is the trainer's bytes: the engine hashed every bucket as it landed, and verify compares those
hashes with the sender's checksums before it asks for this check. Digests are vLLM's own
(``compute_tensor_digests``, what its ``compute_weight_checksums`` returns: a sha256 per
parameter of this rank).

On CPU, vLLM 0.32 hands linear weights to oneDNN and leaves empty parameters unless
``_supports_onednn`` is off before the model loads, in every worker process: importing this
module turns it off, which is why the engine names it as the extension of every worker.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from vllm import _custom_ops
from vllm.distributed import get_tensor_model_parallel_rank
from vllm.model_executor.model_loader.weight_checksum import compute_tensor_digests

from rlinfra.services.weights import buckets
from rlinfra.services.weights.buckets import Manifest
from rlinfra.services.weights.buffers import BucketFile

_custom_ops._supports_onednn = False


@dataclass(frozen=True)
class Payload:
    """One version as the engine staged it: where each bucket lies and what it holds."""

    manifest: Manifest
    files: tuple[BucketFile, ...]

    def tensors(self) -> Iterator[tuple[str, Any]]:
        """(name, read-only torch view) of every tensor, mapped from the engine's memory files."""
        for spec, file in zip(self.manifest.buckets, self.files, strict=True):
            with open(file.path, "rb") as handle:
                mapped = mmap.mmap(handle.fileno(), max(file.nbytes, 1), prot=mmap.PROT_READ)
            array = np.frombuffer(mapped, dtype=np.uint8, count=spec.nbytes)
            yield from buckets.unpack(array, spec, as_torch=True).items()


@dataclass(frozen=True)
class ShardCheck:
    """One worker's answer: its tensor-parallel rank, the version it last loaded, and the
    parameters whose bytes differ from that version loaded afresh."""

    tp_rank: int
    version: int | None
    differing: tuple[str, ...]


class WeightLoading:
    """Mixed into vLLM's worker class (``worker_extension_cls``): the engine's calls by name."""

    def rlinfra_load(self, version: int, payload: Payload) -> None:
        """Load ``payload`` with the model's own ``load_weights``; this rank now serves ``version``."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        self._rlinfra_version: int | None = None  # a load that raises leaves no version claimed
        with torch.no_grad():
            model.load_weights(weights=payload.tensors())
        self._rlinfra_version = version

    def rlinfra_check(self, payload: Payload) -> ShardCheck:
        """Compare every parameter of this rank with ``payload`` loaded afresh (module docstring)."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        served = compute_tensor_digests(model)
        parameters = list(model.parameters())
        held = [parameter.data for parameter in parameters]
        try:
            for parameter in parameters:
                parameter.data = torch.zeros(parameter.shape, dtype=parameter.dtype, device="cpu")
            with torch.no_grad():
                model.load_weights(weights=payload.tensors())
            expected = compute_tensor_digests(model)
        finally:
            for parameter, data in zip(parameters, held, strict=True):
                parameter.data = data
        differing = tuple(sorted(name for name, digest in served.items() if expected.get(name) != digest))
        return ShardCheck(
            get_tensor_model_parallel_rank(), getattr(self, "_rlinfra_version", None), differing
        )
