"""The GRPO job's own config sections, parsed once into typed records before Ray starts.

``algo`` is ``GRPOConfig`` (every hyperparameter of the single-process GRPO, the same fields);
``model`` says where the start checkpoint comes from; ``engine`` what generates; ``run`` where
outputs go and how the job runs. Each is an OmegaConf structured config parsed by
``rlinfra.driver`` (one ``JobConfigError`` per mistake, named by key); ``cluster`` is
rlinfra's. Every other top-level key is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from examples.grpo_lm.lm.config import GRPOConfig
from rlinfra import driver
from rlinfra.driver import JobConfigError, check_sections, parse_section, require

# What only the model the job builds itself uses (with model.path they would be silently ignored).
BUILT_LOCALLY = frozenset(
    {"hidden_size", "num_layers", "num_heads", "intermediate_size", "max_positions"}
    | {f.name for f in dataclasses.fields(GRPOConfig) if f.name.startswith("warmup_")}
)
ENGINE_TRANSPORTS = ("object_store", "broadcast")  # an engine receiver stages in private host memory
ENGINES = ("hf", "vllm")
VLLM_ONLY = ("dtype", "kv_cache_mib")  # what only the vLLM engine reads


@dataclass(frozen=True)
class ModelSettings:
    """``model``: ``path`` empty → the job builds the small Llama-style model and its warm-up
    (supervised) start checkpoint once, cached under ``algo.cache_dir``; else a local Hugging Face
    checkpoint directory (model + tokenizer) to start from."""

    path: str = ""


@dataclass(frozen=True)
class EngineSettings:
    """``engine``: what generates. ``hf`` is the job's own sampler over the Hugging Face model;
    ``vllm`` is vLLM (``rlinfra.engines.vllm``: ``dtype``, ``kv_cache_mib``). With either, after
    every committed version the engines' log-probs of a fixed probe batch of ``probe_size``
    sequences must equal the trainer's within ``probe_tolerance`` (``logprob_mismatch``)."""

    name: str = "hf"
    dtype: str = "float32"
    kv_cache_mib: int = 64
    probe_size: int = 8
    probe_tolerance: float = 1e-3

    def vllm_settings(self) -> dict[str, Any]:
        """What ``VLLMSettings`` takes from this section (the model and seed come from elsewhere)."""
        return {"dtype": self.dtype, "kv_cache_mib": self.kv_cache_mib}


@dataclass(frozen=True)
class RunSettings(driver.RunSettings):
    """``run``: rlinfra's settings, with this job's defaults."""

    entrypoint: str = "examples.grpo_lm.job:main"  # read by ``rlinfra run``, not by the job
    output_dir: str = "outputs/grpo_lm"
    checkpoint_every: int = 10  # updates


@dataclass(frozen=True)
class JobAlgo(GRPOConfig):
    """``algo``: the single-process GRPO's fields, and how far generation may run ahead of
    training: ``max_staleness: 1`` generates the next batch while the actor trains on this one
    (disaggregated); ``0`` is strictly on-policy (colocated: the two take turns on the devices)."""

    max_staleness: int = 1

    def grpo(self) -> GRPOConfig:
        """The fields the workers' GRPO code reads."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(GRPOConfig)}
        return GRPOConfig(**fields)


@dataclass(frozen=True)
class JobConfig:
    name: str
    algo: JobAlgo
    model: ModelSettings
    run: RunSettings
    engine: EngineSettings = EngineSettings()


SECTIONS = ("cluster", "name", "algo", "model", "engine", "run")


def parse_job_config(cfg: Mapping[str, Any]) -> JobConfig:
    """The whole config checked and typed: unknown sections refused, each section parsed."""
    check_sections(cfg, SECTIONS)
    algo = parse_section(JobAlgo, cfg, "algo")
    require(algo.max_staleness in (0, 1), "algo.max_staleness", algo.max_staleness, "0 or 1")
    require(algo.updates >= 1, "algo.updates", algo.updates, "at least 1")
    require(
        algo.group_size >= 2, "algo.group_size", algo.group_size, "at least 2 (the group is the baseline)"
    )
    require(algo.prompts_per_step >= 1, "algo.prompts_per_step", algo.prompts_per_step, "at least 1")
    require(algo.eval_every >= 1, "algo.eval_every", algo.eval_every, "at least 1")
    model = parse_section(ModelSettings, cfg, "model")
    if model.path:
        written = [str(key) for key in (cfg.get("algo") or {}) if str(key) in BUILT_LOCALLY]
        if written:
            raise JobConfigError(
                f"algo.{written[0]}: shapes and warms up the model the job builds itself, but model.path "
                f"({model.path}) gives the start checkpoint; remove one of them"
            )
    run = parse_section(RunSettings, cfg, "run")
    run.check(ENGINE_TRANSPORTS, "the engine stages a version in private host memory")
    return JobConfig(str(cfg.get("name") or ""), algo, model, run, _engine(cfg))


def _engine(cfg: Mapping[str, Any]) -> EngineSettings:
    """The ``engine`` section; ``vllm`` is checked to be installed here, before Ray starts."""
    engine = parse_section(EngineSettings, cfg, "engine")
    require(engine.name in ENGINES, "engine.name", engine.name, f"one of {ENGINES}")
    require(engine.probe_size >= 1, "engine.probe_size", engine.probe_size, "at least 1")
    require(engine.probe_tolerance > 0, "engine.probe_tolerance", engine.probe_tolerance, "a positive number")
    if engine.name == "vllm":
        from rlinfra.engines.vllm import VLLMUnavailableError, require_vllm

        try:
            require_vllm()
        except VLLMUnavailableError as error:
            raise JobConfigError(f"engine.name: vllm: {error}") from None
    else:
        written = [key for key in (cfg.get("engine") or {}) if str(key) in VLLM_ONLY]
        if written:
            raise JobConfigError(
                f"engine.{written[0]}: a setting of the vllm engine, but engine.name is {engine.name!r}"
            )
    return engine


def algo_dict(job: JobConfig) -> dict[str, Any]:
    """What the workers are built from: the GRPO fields, as plain values."""
    return dataclasses.asdict(job.algo.grpo())


def check_engine(job: JobConfig, start_path: str) -> None:
    """The vLLM engine refuses, before Ray starts, a model it cannot serve faithfully."""
    if job.engine.name == "vllm":
        from rlinfra.engines.vllm import VLLMSettings, VLLMSettingsError

        try:
            VLLMSettings(model=start_path, **job.engine.vllm_settings()).check()
        except VLLMSettingsError as error:
            raise JobConfigError(f"engine: {error}") from None
