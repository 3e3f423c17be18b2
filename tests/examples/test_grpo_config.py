"""The GRPO job's own config: every key used or refused, before Ray starts (no cluster here)."""

from __future__ import annotations

import pytest

from examples.grpo_lm.config import parse_job_config
from rlinfra.services.job_config import JobConfigError
from tests.examples.job_checks import job_config


def test_the_bundled_configs_parse() -> None:
    disaggregated = parse_job_config(job_config("disaggregated", example="grpo_lm"))
    colocated = parse_job_config(job_config("colocated", example="grpo_lm"))
    assert disaggregated.algo.max_staleness == 1 and colocated.algo.max_staleness == 0
    assert disaggregated.run.entrypoint == "examples.grpo_lm.job:main"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algo.updatse=3", "algo.updatse: unknown key; did you mean 'updates'?"),
        ("modell.path=/x", "modell: unknown section; did you mean 'model'?"),
        ("algo.max_staleness=2", "algo.max_staleness: got 2; expected 0 or 1"),
        ("algo.group_size=1", "algo.group_size: got 1; expected at least 2"),
        ("algo.stop_at_target=2", "algo.stop_at_target: expected true or false, got 2"),
        ("run.transport=object_store_shared", "run.transport: got 'object_store_shared'; expected one of"),
        ("run.transport=cuda_ipc", "the engine stages a version in private host memory"),
        ("run.tensorboard=2", "run.tensorboard: expected true or false, got 2"),
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
