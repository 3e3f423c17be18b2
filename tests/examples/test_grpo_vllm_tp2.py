"""The GRPO job on a user's checkpoint with one vLLM engine at tensor_parallel_size=2
(``examples/grpo_lm/vllm_tp2.yaml``: the engine's process owns two simulated devices, vLLM's two
workers run under it).

The checkpoint is a tiny random-init Qwen3 (q/k norms: not the Llama the job builds itself),
given as ``model.path`` and loaded by the trainer with ``AutoModelForCausalLM``. One of the
engine's two vLLM worker processes (not the engine's actor) is SIGKILLed early: the run sees the
engine fail, replaces it in its bundle and admits it at the served version (the engine has no
peer: from the copy kept at commit), and goes on. Every version is committed in order and the
engine's log-probs of the probe batch equal the trainer's to 1e-3 after every update."""

from __future__ import annotations

import os
import signal

import pytest
import ray

from examples.grpo_lm.job import GRPOJob
from rlinfra.driver.metrics import read_metrics
from tests.engines.tiny_models import make_checkpoint
from tests.examples.job_checks import assert_resources_released, grpo_config, job_config, planned_placements

CFG = job_config("vllm_tp2", example="grpo_lm")
pytestmark = [pytest.mark.timeout(600), pytest.mark.cluster(CFG), pytest.mark.vllm]


def _kill_a_vllm_worker_at_iteration_3(killed: list[int]):
    def on_iteration(record: dict) -> None:
        if record["iteration"] == 3 and not killed:
            workers = ray.get(ray.get_actor("rollout:0").engine_processes.remote(), timeout=30)
            assert len(workers) == 2  # TP = 2: vLLM's two worker processes under the engine
            os.kill(workers[1], signal.SIGKILL)
            killed.append(workers[1])

    return on_iteration


def test_the_job_runs_a_users_qwen3_on_one_tp2_engine_through_a_killed_vllm_worker(cluster, tmp_path) -> None:
    start = make_checkpoint("qwen3", tmp_path / "qwen3")
    # The kill at 3, then two updates on the replaced engine (its first one evaluated at 4);
    # accuracy is not asserted, so 20 held-out prompts do for the evaluations.
    updates, killed = 5, []
    cfg = grpo_config(
        "vllm_tp2",
        tmp_path / "run",
        f"algo.updates={updates}",
        "algo.eval_every=4",
        "algo.eval_size=20",
        "run.plot=false",
        start=start,
    )
    result = GRPOJob.run(cfg, cluster=cluster, on_iteration=_kill_a_vllm_worker_at_iteration_3(killed))

    assert killed and not result.interrupted and result.iterations == updates
    placements = planned_placements("vllm_tp2", example="grpo_lm")
    assert result.placements == placements
    assert len(placements["rollout"]) == 1  # one engine process, two devices: TP = 2
    (recovery,) = result.state.recoveries
    (replaced,) = recovery.restarts
    assert (replaced.component, replaced.rank, replaced.outcome) == ("rollout", 0, "replaced")
    assert recovery.admitted_version is not None
    records = read_metrics(tmp_path / "run")
    mismatches = [r["logprob_mismatch"] for r in records[1:]]
    assert len(mismatches) == updates - 1 and all(m is not None and m <= 1e-3 for m in mismatches), mismatches
    served = result.state.served_versions
    assert served == sorted(set(served)) and len(served) >= updates - 1
    assert_resources_released()
