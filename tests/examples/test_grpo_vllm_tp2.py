"""The GRPO job with one vLLM engine at tensor_parallel_size=2 (``examples/grpo_lm/vllm_tp2.yaml``:
the engine's process owns two simulated devices, vLLM's two workers run under it), from the
warm-up checkpoint, for a short fixed number of updates: every version is committed in order and
the engine's log-probs of the probe batch equal the trainer's to 1e-3 after every update."""

from __future__ import annotations

import pytest

from examples.grpo_lm.job import run
from rlinfra.driver.metrics import read_metrics
from tests.examples.job_checks import assert_resources_released, grpo_config, job_config, planned_placements

CFG = job_config("vllm_tp2", example="grpo_lm")
pytestmark = [pytest.mark.timeout(600), pytest.mark.cluster(CFG)]


def test_the_job_runs_one_tp2_engine_and_every_update_is_probed(cluster, tmp_path) -> None:
    updates = 8
    cfg = grpo_config("vllm_tp2", tmp_path, f"algo.updates={updates}", "algo.eval_every=4", "run.plot=false")
    result = run(cfg, cluster=cluster)

    assert not result.interrupted and result.iterations == updates
    placements = planned_placements("vllm_tp2", example="grpo_lm")
    assert result.placements == placements
    assert len(placements["rollout"]) == 1  # one engine process, two devices: TP = 2
    records = read_metrics(tmp_path)
    mismatches = [r["logprob_mismatch"] for r in records[1:]]
    assert len(mismatches) == updates - 1 and all(m is not None and m <= 1e-3 for m in mismatches), mismatches
    served = result.state.served_versions
    assert served == sorted(set(served)) and len(served) >= updates - 1
    assert_resources_released()
