"""The job's config refusals, without Ray: every key a user writes is used or refused by name."""

from __future__ import annotations

from typing import get_args

import pytest
import ray
from pydantic import Field

from examples.ppo_cartpole.config import JobConfig, JobConfigError
from examples.ppo_cartpole.job import PPOJob
from rlinfra.config import Section, parse, parse_config
from rlinfra.driver import RunSettings
from rlinfra.driver.entry import USAGE_ERROR
from rlinfra.services.weights.barrier import TRANSPORTS
from tests.examples.job_checks import job_config


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algoo.iterations=3", "unknown section 'algoo'; did you mean 'algo'?"),
        ("clusterr.num_nodes=1", "unknown section 'clusterr'; did you mean 'cluster'?"),
        ("nmae=x", "unknown section 'nmae'; did you mean 'name'?"),
    ],
)
def test_an_unknown_top_level_section_is_named_with_the_nearest(override: str, message: str) -> None:
    with pytest.raises(JobConfigError, match=message):
        parse_config(JobConfig, job_config("colocated", override))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algo.lerning_rate=0.1", "algo: unknown key 'lerning_rate'; did you mean 'learning_rate'?"),
        ("run.transprt=broadcast", "run: unknown key 'transprt'; did you mean 'transport'?"),
        # Removed: CPUs come from each component's num_cpus in the cluster section.
        ("run.num_cpus=2", "run: unknown key 'num_cpus'\n  expected: one of 'entrypoint', 'output_dir'"),
    ],
)
def test_an_unknown_algo_or_run_key_is_named(override: str, message: str) -> None:
    with pytest.raises(JobConfigError, match=message):
        parse_config(JobConfig, job_config("colocated", override))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algo.seed=abc", "algo.seed: expected int, got 'abc'"),
        ("algo.learning_rate=fast", "algo.learning_rate: expected float, got 'fast'"),
        ("run.plot=maybe", "run.plot: expected true or false, got 'maybe'"),
        ("run.plot=2", "run.plot: expected true or false, got 2"),  # OmegaConf alone reads true
        ("algo=3", "algo: expected a mapping, got 3"),
    ],
)
def test_a_value_of_the_wrong_type_is_named(override: str, message: str) -> None:
    with pytest.raises(JobConfigError, match=message):
        parse_config(JobConfig, job_config("colocated", override))


def test_values_are_typed_by_the_schema() -> None:
    job = parse_config(JobConfig, job_config("colocated", "algo.iterations='7'", "run.call_timeout_s=5"))
    assert (job.algo.iterations, job.run.call_timeout_s) == (7, 5.0)
    assert isinstance(job.run.call_timeout_s, float)


def test_main_refuses_a_bad_config_with_status_2_before_ray_starts(capsys) -> None:
    assert PPOJob.main(job_config("colocated", "algoo.iterations=3")) == USAGE_ERROR
    err = capsys.readouterr().err
    assert "unknown section 'algoo'" in err and "Traceback" not in err
    assert not ray.is_initialized()


class Optimiser(Section):
    lr: float = Field(0.1, gt=0)
    nesterov: bool = False


class NestedAlgo(Section):
    optimiser: Optimiser = Optimiser()


def test_a_nested_sections_keys_types_and_ranges_are_checked() -> None:
    def parse_algo(algo: dict) -> NestedAlgo:
        return parse(NestedAlgo, algo, "algo", JobConfigError)

    with pytest.raises(JobConfigError, match=r"algo\.optimiser: unknown key 'lrr'; did you mean 'lr'\?"):
        parse_algo({"optimiser": {"lrr": 1.0}})
    with pytest.raises(JobConfigError, match=r"algo\.optimiser\.lr: expected float, got 'fast'"):
        parse_algo({"optimiser": {"lr": "fast"}})
    with pytest.raises(JobConfigError, match=r"algo\.optimiser\.nesterov: expected true or false, got 2"):
        parse_algo({"optimiser": {"nesterov": 2}})
    with pytest.raises(JobConfigError, match=r"algo\.optimiser\.lr: got 0\.0; expected above 0"):
        parse_algo({"optimiser": {"lr": 0.0}})
    assert parse_algo({"optimiser": {"lr": 1.0}}).optimiser.lr == 1.0


def test_the_run_sections_transports_are_the_weight_barriers() -> None:
    assert get_args(RunSettings.model_fields["transport"].annotation) == TRANSPORTS
