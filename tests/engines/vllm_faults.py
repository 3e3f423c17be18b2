"""Wrong loads on purpose, inside vLLM's workers: rlinfra's worker extension with a fault switch.

An engine of the tests names ``FaultyLoading`` as its worker extension and ``FaultyTransfer`` (this
module registers it with vLLM) as its weight backend; ``set_fault`` (through ``collective_rpc``)
makes the given tensor-parallel rank load wrong:

    "perturb"  the next load (one: the rollback's is right) puts the payload's first layer tensor
               in with 1.0 added, as a broken transfer into the worker would
    "skip"     the next load leaves that tensor out (its parameter keeps the old version)
    "raise"    the next load raises on that rank (the other ranks load)
    "loader"   every load, and the check's fresh load too, adds 1.0 to that tensor, as a
               loader that is wrong for the model would: the shard check agrees with itself, and
               only the log-prob probe can tell
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from vllm.distributed import get_tensor_model_parallel_rank
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

from rlinfra.engines.vllm_worker import Payload, SharedMemoryTransfer, WeightLoading


class _Faulty:
    """``payload`` with its first layer tensor (the first named ``*.layers.*``: sharded with real
    rows on every TP rank, unlike the embeddings, whose padding may fill a rank) loaded wrong."""

    def __init__(self, payload: Payload, kind: str) -> None:
        self.payload, self.kind = payload, kind

    def tensors(self) -> Iterator[tuple[str, Any]]:
        hit = False
        for name, tensor in self.payload.tensors():
            if hit or ".layers." not in name:
                yield name, tensor
                continue
            hit = True
            if self.kind != "skip":
                yield name, tensor + 1.0


class FaultyTransfer(SharedMemoryTransfer):
    """rlinfra's backend, loading wrong while ``fault`` is set (module docstring)."""

    fault: str | None = None

    def tensors(self, payload: Payload) -> Iterator[tuple[str, Any]]:
        kind = self.fault
        if kind in ("perturb", "skip", "raise"):
            self.fault = None
        if kind == "raise":
            raise RuntimeError("the test's fault: this rank's load failed")
        return payload.tensors() if kind is None else _Faulty(payload, kind).tensors()


BACKEND = "rlinfra_faulty_shared_memory"
WeightTransferEngineFactory.register_engine(BACKEND, FaultyTransfer)


class FaultyLoading(WeightLoading):
    def set_fault(self, kind: str | None, tp_rank: int) -> None:
        transfer: FaultyTransfer = self.weight_transfer_engine  # type: ignore[attr-defined]
        transfer.fault = kind if get_tensor_model_parallel_rank() == tp_rank else None
