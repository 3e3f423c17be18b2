"""What the engine test modules share: a trainer whose versions are fixed perturbations of its
start, and a vLLM engine whose workers can be told to load wrong (``vllm_faults.py``) and asked
what every shard serves."""

from __future__ import annotations

import torch

from rlinfra import Worker
from rlinfra.engines.vllm import VLLMEngine, worker_payload
from rlinfra.services.weights import WeightSender


class PerturbedTrainer(WeightSender, Worker):
    """A Hugging Face model (``self.model``, set by the subclass, then ``keep_start()``); version v
    is its start plus seeded noise of 0.05 v per element."""

    def keep_start(self) -> None:
        self.start = {name: tensor.clone() for name, tensor in self.model.state_dict().items()}

    def weights_state(self):
        return self.model.state_dict()

    def train_to(self, version: int) -> None:
        generator = torch.Generator().manual_seed(version)
        with torch.no_grad():
            for name, tensor in self.model.state_dict().items():
                noise = torch.randn(tensor.shape, generator=generator) * 0.05 * version
                tensor.copy_(self.start[name] + noise)


class CheckedEngine(VLLMEngine):
    """rlinfra's engine as a job would subclass it, plus what the tests look at."""

    worker_extension = "tests.engines.vllm_faults.FaultyLoading"
    weight_backend = "rlinfra_faulty_shared_memory"

    def fault(self, kind: str | None, tp_rank: int = 0) -> None:
        self.llm.collective_rpc("set_fault", args=(kind, tp_rank))

    def served(self) -> tuple[str, list[tuple[int, int | None, tuple[str, ...]]]]:
        """The engine's weight version, and each TP rank's last loaded version and the parameters
        that differ from the serving version loaded afresh."""
        checks = self.llm.collective_rpc("rlinfra_check", args=(worker_payload(self._weights().current),))
        return self.llm.llm_engine.get_weight_version(), [(c.tp_rank, c.version, c.differing) for c in checks]
