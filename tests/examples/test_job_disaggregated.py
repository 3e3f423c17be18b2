"""The main job, disaggregated config, on its own simulated cluster (2 nodes x 4 logical GPUs).

Short runs (a few PPO iterations) check what the full run relies on: the placement is the one
``rlinfra plan`` shows, every iteration advances the weight version through the barrier, no batch
mixes versions, the return improves, and every Ray resource is released after the run, after a
Ctrl-C, and a resumed run continues where the checkpoint left off.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal

import pytest
import ray

from examples.ppo_cartpole import reporting
from examples.ppo_cartpole.job import run
from rlinfra.runtime.errors import WorkerGroupError
from rlinfra.runtime.group import WorkerGroup
from rlinfra.runtime.supervision import RestartBudgetExhausted
from rlinfra.services.weights import WeightSyncError
from tests.examples.job_checks import assert_resources_released, job_config, planned_placements

pytestmark = pytest.mark.timeout(300)

CFG = job_config("disaggregated")
ITERATIONS = 5


def test_short_run_places_syncs_and_learns(cluster, tmp_path) -> None:
    cfg = job_config("disaggregated", f"algo.iterations={ITERATIONS}", f"run.output_dir={tmp_path}")
    result = run(cfg, cluster=cluster)

    assert not result.interrupted and result.iterations == ITERATIONS
    assert result.placements == planned_placements("disaggregated")
    assert result.misplaced_bundles == []
    # One committed version per iteration after the first (the first rollout runs on version 0
    # while version 1 trains), each exactly one higher: the barrier never skipped or repeated one.
    assert result.served_versions == list(range(ITERATIONS))
    records = reporting.read_metrics(tmp_path)
    assert [r["learner_version"] for r in records] == list(range(1, ITERATIONS + 1))
    # Both data-parallel actor ranks held bit-identical parameters after every update.
    assert all(r["replicas_in_sync"] for r in records)
    # From the second iteration on a version was committed: the rollout workers' gate was closed
    # for a while, inside the driver's pause window.
    assert all(0 < r["held_s"] < r["pause_s"] for r in records[1:])
    # Every env worker's batch came from one version, the same for all workers of an iteration,
    # and never more than max_staleness (1) behind the learner.
    assert all(len(set(versions)) == 1 for versions in result.batch_versions)
    assert [versions[0] for versions in result.batch_versions] == [0, *range(ITERATIONS - 1)]
    assert [r["staleness"] for r in records] == [0] + [1] * (ITERATIONS - 1)
    assert result.dropped_batches == 0
    assert result.mean_return > 1.3 * result.first_mean_return
    assert result.env_steps == ITERATIONS * 16 * 128

    placement_file = json.loads((tmp_path / reporting.PLACEMENT_FILE).read_text())
    assert placement_file["relations"]["actor-rollout"] == "disaggregated"
    assert result.plot is not None and result.plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / reporting.CHECKPOINT_FILE).exists()
    assert_resources_released()


def test_interrupt_releases_everything_and_resume_continues(cluster, tmp_path) -> None:
    def swallowed_ctrl_c_at_two(record: dict) -> None:
        if record["iteration"] == 2:
            # A real SIGINT to this process, whose KeyboardInterrupt some code swallows: the job
            # must stop all the same (at the end of the iteration), not train on.
            with contextlib.suppress(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)

    cfg = job_config("disaggregated", "algo.iterations=10", f"run.output_dir={tmp_path}")
    stopped = run(cfg, cluster=cluster, on_iteration=swallowed_ctrl_c_at_two)
    assert stopped.interrupted and stopped.iterations == 2
    assert_resources_released()
    checkpoint = reporting.load_checkpoint(tmp_path)
    assert checkpoint["driver"]["iteration"] == 2

    cfg = job_config("disaggregated", "algo.iterations=3", f"run.output_dir={tmp_path}")
    resumed = run(cfg, cluster=cluster, resume=True)
    assert resumed.resumed_from == 2 and resumed.iterations == 3 and not resumed.interrupted
    records = reporting.read_metrics(tmp_path)
    assert [r["iteration"] for r in records] == [1, 2, 3]
    # The trainer continued from version 2 (restored), rather than starting again at 0.
    assert records[-1]["learner_version"] == 3
    assert resumed.served_versions[0] == 2
    assert resumed.env_steps == 3 * 16 * 128
    assert_resources_released()


def sigkill(actor_name: str) -> int:
    """SIGKILL the process of a live named rlinfra worker (it tells its pid when asked if ready)."""
    pid = ray.get(ray.get_actor(actor_name).rlinfra_ready.remote(), timeout=30)["pid"]
    os.kill(pid, signal.SIGKILL)
    return pid


def test_killed_rollout_and_env_workers_are_replaced_and_nothing_is_lost(cluster, tmp_path) -> None:
    killed: dict[int, str] = {}

    def kill_mid_collection(record: dict) -> None:
        # With max_staleness 1 the next rollout is being collected while this runs: the kill
        # lands mid-collection.
        victim = {2: "rollout:1", 5: "env:0"}.get(record["iteration"])
        if victim is not None:
            sigkill(victim)
            killed[record["iteration"]] = victim

    def kill_env_one_after_its_rollout(rollouts) -> None:
        # Called between collecting and training: env:1 dies owning the rollout it just made.
        if rollouts.iteration == 3:
            sigkill("env:1")
            killed[3] = "env:1"

    cfg = job_config("disaggregated", "algo.iterations=7", f"run.output_dir={tmp_path}")
    result = run(
        cfg,
        cluster=cluster,
        on_iteration=kill_mid_collection,
        between_rollouts=kill_env_one_after_its_rollout,
    )

    assert result.iterations == 7 and not result.interrupted
    assert killed == {2: "rollout:1", 3: "env:1", 5: "env:0"}
    replaced = [(r.component, r.rank, r.outcome) for rec in result.state.recoveries for r in rec.restarts]
    assert replaced == [("rollout", 1, "replaced"), ("env", 1, "replaced"), ("env", 0, "replaced")]
    # Every batch id ended once: trained, or lost with its worker (and made again under a new id,
    # or, for env:1's finished rollout, the update made on env:0's alone): never half-used.
    batches = result.batches
    assert batches["duplicated"] == 0 and batches["open"] == 0 and batches["lost"] >= 2
    assert batches["trained"] + batches["dropped"] + batches["lost"] == batches["issued"]
    assert batches["trained"] == 7 * 2 - 1  # two env workers, one batch each per iteration
    # The replaced rollout worker served the committed version: every batch is one version, and
    # the versions still advance by one per iteration.
    assert all(len(set(versions)) == 1 for versions in result.batch_versions)
    assert result.served_versions == list(range(7))
    assert_resources_released()


def test_rollout_workers_removed_and_added_back_mid_run(cluster, tmp_path) -> None:
    def scale(rollouts) -> None:
        if rollouts.iteration == 2:
            rollouts.remove([1])
        elif rollouts.iteration == 4:
            rollouts.add([1])

    cfg = job_config("disaggregated", "algo.iterations=6", f"run.output_dir={tmp_path}")
    result = run(cfg, cluster=cluster, between_rollouts=scale)

    records = reporting.read_metrics(tmp_path)
    assert [r["rollout_workers"] for r in records] == [2, 2, 1, 1, 2, 2]
    # The added worker was admitted at the committed version: no batch mixes versions, and the
    # versions advance by one per iteration as in a run without changes.
    assert all(len(set(versions)) == 1 for versions in result.batch_versions)
    assert result.served_versions == list(range(6))
    assert result.batches["trained"] == 12 and result.batches["duplicated"] == 0
    assert result.state.recoveries == []  # nothing died
    assert_resources_released()


def test_a_dead_rollout_worker_past_its_restart_budget_stops_the_run(cluster, tmp_path) -> None:
    def kill_rollout_one(record: dict) -> None:
        if record["iteration"] == 2:
            ray.kill(ray.get_actor("rollout:1"), no_restart=True)

    cfg = job_config(
        "disaggregated",
        "algo.iterations=10",
        f"run.output_dir={tmp_path}",
        "cluster.component_placement.rollout.restart.max=0",
    )
    with pytest.raises((WorkerGroupError, WeightSyncError, RestartBudgetExhausted)) as failure:
        run(cfg, cluster=cluster, on_iteration=kill_rollout_one)
    message = str(failure.value)
    assert "rollout:1" in message and "restart budget spent" in message, message
    # The failure report: printed (the exception's note, which main() prints) and kept as JSON.
    report = json.loads((tmp_path / "failure.json").read_text())
    assert report["error"].startswith("RestartBudgetExhausted: rollout:1 (node 1)")
    assert [(f["component"], f["rank"], f["node_rank"]) for f in report["failed"]] == [("rollout", 1, 1)]
    attempts = [(a["component"], a["rank"], a["outcome"]) for a in report["attempts"]]
    assert attempts == [("rollout", 1, "refused")]
    assert report["checkpoint"]["iteration"] == 2 and report["committed_version"] >= 1
    assert "--resume" in report["resume"] and report["details"]["batches"]["duplicated"] == 0
    notes = "\n".join(failure.value.__notes__)
    assert "what was tried: 1" in notes and "last checkpoint: iteration 2" in notes and "to resume:" in notes
    assert_resources_released()


def test_ctrl_c_during_a_recovery_still_releases_everything(cluster, tmp_path, monkeypatch) -> None:
    replace = WorkerGroup.replace

    def replace_then_ctrl_c(self, rank, reason="", **options):
        restart = replace(self, rank, reason, **options)
        signal.raise_signal(signal.SIGINT)  # a real Ctrl-C, before admission and rewiring
        return restart

    monkeypatch.setattr(WorkerGroup, "replace", replace_then_ctrl_c)

    def kill_rollout_one(record: dict) -> None:
        if record["iteration"] == 2:
            sigkill("rollout:1")

    cfg = job_config("disaggregated", "algo.iterations=10", f"run.output_dir={tmp_path}")
    result = run(cfg, cluster=cluster, on_iteration=kill_rollout_one)
    assert result.interrupted and result.iterations == 2
    assert_resources_released()
