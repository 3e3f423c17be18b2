"""The GRPO job's own config sections, parsed once into typed records before Ray starts.

``algo`` is ``GRPOConfig`` (every hyperparameter of the single-process GRPO, the same fields and
ranges); ``model`` says where the start checkpoint comes from; ``engine`` what generates; ``run``
where outputs go and how the job runs. ``rlinfra.driver.parse_config`` parses them (one
``JobConfigError`` per mistake, named by key; every other top-level key but ``cluster`` and
``name`` refused); this module refuses what the sections say to each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from examples.grpo_lm.lm.config import GRPOConfig
from rlinfra import driver
from rlinfra.driver import JobConfigError, Section, parse_config
from rlinfra.engines.vllm import VLLMUnavailableError, require_vllm

# What only the model the job builds itself uses (with model.path they would be silently ignored).
BUILT_LOCALLY = frozenset(
    {"hidden_size", "num_layers", "num_heads", "intermediate_size", "max_positions"}
    | {name for name in GRPOConfig.model_fields if name.startswith("warmup_")}
)
VLLM_ONLY = ("dtype", "kv_cache_mib")  # what only the vLLM engine reads


class ModelSettings(Section):
    """``model``: ``path`` empty → the job builds the small Llama-style model and its warm-up
    (supervised) start checkpoint once, cached under ``algo.cache_dir``; else a local Hugging Face
    checkpoint directory (model + tokenizer) to start from."""

    path: str = ""


class EngineSettings(Section):
    """``engine``: what generates. ``hf`` is the job's own sampler over the Hugging Face model;
    ``vllm`` is vLLM (``rlinfra.engines.vllm``: ``dtype``, ``kv_cache_mib``). With either, after
    every committed version the engines' log-probs of a fixed probe batch of ``probe_size``
    sequences must equal the trainer's within ``probe_tolerance`` (``logprob_mismatch``)."""

    name: Literal["hf", "vllm"] = "hf"
    dtype: str = "float32"
    kv_cache_mib: int = 64
    probe_size: int = Field(8, ge=1)
    probe_tolerance: float = Field(1e-3, gt=0)

    def vllm_settings(self) -> dict[str, Any]:
        """What ``VLLMSettings`` takes from this section (the model and seed come from elsewhere)."""
        return {"dtype": self.dtype, "kv_cache_mib": self.kv_cache_mib}


class RunSettings(driver.RunSettings):
    """``run``: rlinfra's settings, with this job's defaults and the transports that can fill an
    engine receiver's private host memory."""

    output_dir: str = "outputs/grpo_lm"
    checkpoint_every: int = Field(10, ge=1)  # updates
    transport: Literal["object_store", "broadcast"] = Field(
        "object_store", description="the engine stages a version in private host memory"
    )


class JobAlgo(GRPOConfig):
    """``algo``: the single-process GRPO's fields, and how far generation may run ahead of
    training: ``max_staleness: 1`` generates the next batch while the actor trains on this one
    (disaggregated); ``0`` is strictly on-policy (colocated: the two take turns on the devices)."""

    max_staleness: Literal[0, 1] = 1


class JobConfig(driver.JobConfig):
    algo: JobAlgo
    model: ModelSettings
    engine: EngineSettings
    run: RunSettings


def parse_job_config(cfg: Mapping[str, Any]) -> JobConfig:
    """The whole config checked and typed; ``vllm`` is checked to be installed here, before Ray starts."""
    return check_job_config(parse_config(JobConfig, cfg), cfg)


def check_job_config(job: JobConfig, cfg: Mapping[str, Any]) -> JobConfig:
    """What no one section can check alone: keys that contradict each other, and vLLM installed."""
    built = [str(key) for key in (cfg.get("algo") or {}) if str(key) in BUILT_LOCALLY]
    if job.model.path and built:
        raise JobConfigError(
            f"algo.{built[0]}: shapes and warms up the model the job builds itself, but model.path "
            f"({job.model.path}) gives the start checkpoint; remove one of them"
        )
    placed = (cfg.get("cluster") or {}).get("component_placement") or {}
    for key, entry in placed.items():
        named = entry.get("model") if isinstance(entry, Mapping) else None
        if named and named != job.model.path:
            raise JobConfigError(
                f"cluster.component_placement.{key}.model: {named!r}, but the job loads model.path "
                f"({job.model.path or 'empty: the model it builds itself'}); write ${{model.path}} there"
            )
    vllm_only = [str(key) for key in (cfg.get("engine") or {}) if str(key) in VLLM_ONLY]
    if job.engine.name != "vllm" and vllm_only:
        raise JobConfigError(
            f"engine.{vllm_only[0]}: a setting of the vllm engine, but engine.name is {job.engine.name!r}"
        )
    if job.engine.name == "vllm":
        try:
            require_vllm()
        except VLLMUnavailableError as error:
            raise JobConfigError(f"engine.name: vllm: {error}") from None
    return job
