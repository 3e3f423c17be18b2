"""What rlinfra adds to every vLLM worker process: a weight-transfer backend for vLLM's own RL
weight API, and a check of every parameter of the worker's shard against a version.

vLLM imports this module in each of its workers (``LLM(worker_extension_cls=...)``): the worker
in the engine's own process at ``tensor_parallel_size=1``, one spawned process per rank above
it. Importing it registers ``SharedMemoryTransfer`` with vLLM's ``WeightTransferEngineFactory``
as ``rlinfra_shared_memory`` (vLLM 0.32's own backends need NCCL, CUDA or its Ray executor), so
the engine updates its weights with vLLM's sequence: ``start_weight_update`` →
``update_weights`` → ``finish_weight_update``, then the engine's weight version. The update
carries a ``Payload`` (file paths and the bucket layout; no function is pickled): each worker
maps the version's buckets where the engine staged them (``MappableBuffers``) and hands the
tensors, as views, to the model's ``load_weights``. That loader knows each architecture's fused
parameters (``qkv_proj``, ``gate_up_proj``), padded vocabulary and tensor-parallel sharding, so
rlinfra keeps no name map of its own. On GPUs the same load copies from host memory to the device.

``rlinfra_check`` is the verify step on the engine's own memory. The expected shard is made by
the same loader from the same payload, into zeroed memory of the parameters' shapes (host memory,
so a GPU holds no second copy): a parameter the load missed or left stale, a rank that loaded
another version or nothing, and padding that is not zero all differ from it. The payload itself
is the trainer's bytes: the engine hashed every bucket as it landed, and verify compares those
hashes with the sender's checksums before it asks for this check. The shard is compared with it
byte for byte, parameter by parameter (what vLLM's ``compute_weight_checksums`` would hash:
each parameter's bytes, on the host), which is exact where equal digests are only likely, and
reads each copy once instead of hashing both.

On CPU, vLLM 0.32 hands linear weights to oneDNN and leaves empty parameters unless
``_supports_onednn`` is off before the model loads, in every worker process: importing this
module turns it off, which is why the engine names it as the extension of every worker.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from vllm import _custom_ops
from vllm.distributed import get_tensor_model_parallel_rank
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

from rlinfra.engines.vllm import WEIGHT_BACKEND, Payload

_custom_ops._supports_onednn = False


@dataclass(frozen=True)
class ShardCheck:
    """One worker's answer: its tensor-parallel rank, the version it last loaded, and the
    parameters whose bytes differ from that version loaded afresh."""

    tp_rank: int
    version: int | None
    differing: tuple[str, ...]


@dataclass
class NoConnection(WeightTransferInitInfo):
    """The shared-memory backend connects to nothing: the payload names its files."""


@dataclass
class SharedMemoryUpdate(WeightTransferUpdateInfo):
    version: int
    payload: Payload


class SharedMemoryTransfer(WeightTransferEngine[NoConnection, SharedMemoryUpdate]):
    """vLLM's weight-transfer backend for a version staged in the engine's mappable host memory;
    it remembers the version this rank last loaded whole (``None`` after a load that raised)."""

    init_info_cls = NoConnection
    update_info_cls = SharedMemoryUpdate
    supports_draft_weight_update = False
    version: int | None = None

    def tensors(self, payload: Payload) -> Iterator[tuple[str, Any]]:
        """What the model's loader is given for ``payload`` (the tests' faulty backend overrides it)."""
        return payload.tensors()

    def receive_weights(self, update_info: SharedMemoryUpdate) -> None:
        self.version = None
        with torch.no_grad():
            self.model.load_weights(weights=self.tensors(update_info.payload))
        self.version = update_info.version

    def init_transfer_engine(self, init_info: NoConnection) -> None:
        """Nothing to connect: each update's payload names the files to map."""

    def start_weight_update(self) -> None:
        """Nothing to prepare: the load is in place, vLLM's layerwise reload is not needed."""

    def finish_weight_update(self) -> None:
        """Nothing to finalize (in-place load, see ``start_weight_update``)."""

    def shutdown(self) -> None:
        """Nothing to release: the mapped files belong to the engine's ``MappableBuffers``."""


WeightTransferEngineFactory.register_engine(WEIGHT_BACKEND, SharedMemoryTransfer)


class WeightLoading:
    """Mixed into vLLM's worker class (``worker_extension_cls``): the engine's calls by name."""

    def rlinfra_abandon_update(self) -> None:
        """End a weight update that failed on another rank, so the next one can start here."""
        if getattr(self, "_weight_update_active", False):
            self.finish_weight_update()  # type: ignore[attr-defined]

    def rlinfra_check(self, payload: Payload) -> ShardCheck:
        """Compare every parameter of this rank with ``payload`` loaded afresh (module docstring)."""
        transfer: SharedMemoryTransfer = self.weight_transfer_engine  # type: ignore[attr-defined]
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        named = list(model.named_parameters())
        served = [parameter.data for _, parameter in named]
        try:
            for _, parameter in named:
                parameter.data = torch.zeros(parameter.shape, dtype=parameter.dtype, device="cpu")
            with torch.no_grad():
                model.load_weights(weights=transfer.tensors(payload))
            expected = [parameter.data for _, parameter in named]
        finally:
            for (_, parameter), data in zip(named, served, strict=True):
                parameter.data = data
        pairs = zip(named, served, expected, strict=True)
        differing = tuple(sorted(name for (name, _), now, fresh in pairs if not _same_bytes(now, fresh)))
        return ShardCheck(get_tensor_model_parallel_rank(), transfer.version, differing)


def _same_bytes(served: torch.Tensor, expected: torch.Tensor) -> bool:
    """Bit for bit (NaNs and signed zeros included), wherever ``served`` lives; by numpy, in one
    thread (torch's threads would contend with the other TP ranks' on the same cores)."""
    now, fresh = (t.detach().cpu().contiguous().view(-1).view(torch.uint8) for t in (served, expected))
    return bool(np.array_equal(now.numpy(), fresh.numpy()))
