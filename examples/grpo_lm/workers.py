"""The GRPO job's worker processes that hold the model: the policy (actor + reference, fused) and
the engine (the reward workers, which do not, are in ``reward.py``).

    policy    ``fuse(actor=ActorRole, ref=RefRole)``: 2 data-parallel ranks (DDP over gloo). The
              reference model lives in the same process as a second role, and the actor's update
              reads its log-probs in memory (no transfer); rank 0 publishes the weights.
    rollout   the generation engine (``EngineReceiver``): batched sampling with a KV cache, G
              samples per prompt, every completion stamped with the version that made it; new
              weights are staged on the host while it generates and loaded into its own
              parameters during the pause, verified there

``engine: {name: vllm}`` replaces ``RolloutWorker`` with ``vllm_rollout.VLLMRolloutWorker``.

In the colocated layout the actor and the engine share devices and take turns
(``rlinfra.runtime.timesharing``): ``sleep`` releases what a component holds on the device,
``wake`` brings it back.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from examples.grpo_lm.lm.config import GRPOConfig
from examples.grpo_lm.lm.engine import GenerationEngine
from examples.grpo_lm.lm.grpo import sequence_logprobs
from examples.grpo_lm.lm.learner import Learner, frozen_copy
from examples.grpo_lm.lm.model import load_pretrained
from examples.grpo_lm.lm.rollout import evaluate
from rlinfra import EngineReceiver, TimeShared, WeightSender, Worker, fuse
from rlinfra.driver import Batch, Update


def _device(worker: Worker) -> str:
    """Where the worker's model lives: its GPU when torch can use one (a simulated GPU is a label
    on a CPU machine: the model stays on the CPU)."""
    return "cuda" if worker.torch_device_type == "cuda" and torch.cuda.is_available() else "cpu"


class RefRole(Worker):
    """The frozen reference model of the KL penalty: the start checkpoint, never updated."""

    def __init__(self, algo: GRPOConfig, start_path: str) -> None:
        torch.set_num_threads(algo.num_threads)
        model, _ = load_pretrained(start_path)
        self.model = frozen_copy(model)

    def describe(self) -> dict[str, Any]:
        return {"parameters": sum(p.numel() for p in self.model.parameters()), "worker": self._worker_name}


class ActorRole(Worker):
    """The trainer rank: policy, optimiser and weight version (``Learner``), built by ``setup``
    once the process group is up (DDP needs it)."""

    def __init__(self, algo: GRPOConfig, start_path: str) -> None:
        self.config = algo
        torch.set_num_threads(self.config.num_threads)
        torch.manual_seed(self.config.seed)
        self.policy, _ = load_pretrained(start_path)
        self.learner: Learner | None = None

    def setup(self, reference: torch.nn.Module, checkpoint: bytes | None) -> int:
        self.learner = Learner(self.policy, self.config, reference=reference)
        if checkpoint is not None:
            saved = torch.load(io.BytesIO(checkpoint), weights_only=True)
            self.policy.load_state_dict(saved["policy"])
            self.learner.optimizer.load_state_dict(saved["optimizer"])
            self.learner.weight_version, self.learner.updates = int(saved["version"]), int(saved["updates"])
        return self.learner.weight_version

    def update(self, batches: Sequence[Batch], rewards: Sequence[float]) -> Update:
        """One GRPO update from every batch's completions, in order, with ``rewards`` one per
        completion (each rank trains on its strided shard)."""
        completions = [c for batch in batches for c in batch.payload["completions"]]
        metrics = self._learner().update(completions, rewards)
        return Update(int(metrics.pop("weight_version")), [batch.id for batch in batches], metrics)

    def weights(self) -> dict[str, torch.Tensor]:
        return dict(self.policy.state_dict())

    def probe_logprobs(self, sequences: Sequence[tuple[list[int], list[int]]]) -> list[list[float]]:
        """The policy's log-probs of the probe's tokens (``rlinfra.services.weights.probe``)."""
        return sequence_logprobs(self.policy, sequences, int(self.policy.config.pad_token_id))

    def checkpoint(self) -> bytes:
        """Policy, optimiser, version and update count as ``torch.save`` bytes (loaded back with
        ``weights_only``: nothing is unpickled)."""
        learner = self._learner()
        buffer = io.BytesIO()
        torch.save(
            {
                "policy": self.policy.state_dict(),
                "optimizer": learner.optimizer.state_dict(),
                "version": learner.weight_version,
                "updates": learner.updates,
            },
            buffer,
        )
        return buffer.getvalue()

    def parameters_digest(self) -> str:
        import hashlib

        digest = hashlib.sha256()
        for tensor in self.policy.state_dict().values():
            digest.update(tensor.detach().contiguous().numpy().tobytes())
        return digest.hexdigest()

    def sleep(self) -> None:
        """Give the shared device to the engine: gradients freed, the policy and the optimiser's
        state moved to the host (on a CPU run the device is this process's memory: they stay)."""
        for parameter in self.policy.parameters():
            parameter.grad = None
        self.policy.to("cpu")

    def wake(self) -> None:
        """The policy back on its device (on a CPU run it never left)."""
        self.policy.to(_device(self))

    def _learner(self) -> Learner:
        if self.learner is None:
            raise RuntimeError(f"{self._worker_name}: setup() was not called")
        return self.learner


class Policy(WeightSender, TimeShared, fuse(actor=ActorRole, ref=RefRole)):  # type: ignore[misc]
    """The trainer's processes: the actor and reference roles in one process per rank. The weight
    sender and the time-sharing hooks are the process's (they act for the actor role)."""

    collect_cycles_on_sleep = False  # sleep() frees by reference count; a collection costs ~0.2 s

    def setup(self, checkpoint: bytes | None) -> int:
        """The actor's learner, with the reference role's model as its KL reference (in memory)."""
        actor, ref = self._actor(), self.role_instance("ref")
        assert isinstance(ref, RefRole)
        return actor.setup(ref.model, checkpoint)

    def weights_state(self) -> Mapping[str, torch.Tensor]:
        return self._actor().weights()

    def probe_logprobs(self, sequences: Sequence[tuple[list[int], list[int]]]) -> list[list[float]]:
        return self._actor().probe_logprobs(sequences)

    def checkpoint(self) -> bytes:
        return self._actor().checkpoint()

    def sleep(self) -> None:
        self._actor().sleep()

    def wake(self) -> None:
        self._actor().wake()

    def _actor(self) -> ActorRole:
        actor = self.role_instance("actor")
        assert isinstance(actor, ActorRole)
        return actor


class RolloutWorker(EngineReceiver, TimeShared):
    """The generation engine. Its parameters are what it serves: updates are loaded into them in
    the pause and hashed there (``EngineReceiver``)."""

    collect_cycles_on_sleep = False

    def __init__(self, algo: GRPOConfig, start_path: str) -> None:
        self.config = algo
        torch.set_num_threads(self.config.num_threads)
        model, tokenizer = load_pretrained(start_path)
        self.engine = GenerationEngine(model, tokenizer)
        # One generation at a time: the second thread stages weights, but an evaluation may
        # arrive while a batch is still being generated (disaggregated: they overlap).
        self.engine_lock = threading.Lock()

    # ---------------------------------------------------------------- EngineReceiver's hooks
    def engine_state(self) -> Mapping[str, torch.Tensor]:
        return self.engine.model.state_dict()

    def weights_loaded(self, version: int) -> None:
        """The engine's caches are per generate call, and no call runs during a swap; check it."""
        if self.engine.cache_alive:
            raise RuntimeError(f"{self._worker_name}: a KV cache outlived the swap to version {version}")
        self.engine.weight_version = version

    def engine_logprobs(self, sequences: Sequence[tuple[list[int], list[int]]]) -> list[list[float]]:
        with self.engine_lock, self.serving():
            return sequence_logprobs(self.engine.model, sequences, self.engine.pad_id)

    # ------------------------------------------------------------------------- generation
    def generate(self, batch_id: str, prompts: Sequence[str], seed: int) -> Batch:
        """G completions per prompt, each stamped with the version that made it (one per call)."""
        cfg = self.config
        started = time.perf_counter()
        with self.engine_lock, self.serving() as weights:
            completions = self.engine.generate(
                prompts, cfg.group_size, cfg.max_new_tokens, temperature=cfg.temperature, seed=seed
            )
            cache_dropped = not self.engine.cache_alive
        for completion in completions:
            completion.weight_version = weights.version
        tokens = sum(len(c.completion_ids) for c in completions)
        made = {"completions": completions, "tokens": tokens, "cache_dropped": cache_dropped}
        return Batch(batch_id, weights.version, made | {"seconds": time.perf_counter() - started})

    def evaluate(self, prompts: Sequence[str]) -> tuple[int, float]:
        """Greedy held-out exact match at the serving version: (version, accuracy)."""
        with self.engine_lock, self.serving() as weights:
            return weights.version, evaluate(self.engine, prompts, self.config.max_new_tokens)

    def sleep(self) -> None:
        """Give the shared device to the trainer: the engine's weights move to the host (a GPU
        engine would also free its KV cache pool; this one's cache lives only inside a call)."""
        self.engine.model.to("cpu")

    def wake(self) -> None:
        """The engine's weights back on its device (on a CPU run they never left)."""
        self.engine.model.to(self.device)

    @property
    def device(self) -> str:
        return _device(self)
