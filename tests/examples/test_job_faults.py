"""The main job under real faults, on one simulated 3-node cluster shared by every test.

    node 0   actor:0-1 (GPUs 0-1), env:0          node 1   rollout:0 (GPU 2), env:1
    node 2   rollout:1 (GPU 4): lost in the last test, so its rank cannot be replaced

Workers are SIGKILLed by pid (``sigkill``), mid-collection, between collecting and training, and
during weight updates; trainer ranks too; the budgets in the YAML are overridden per test. Short
rollouts (``algo.num_steps=64``) and no plot keep each run to seconds: the behaviour checked does
not depend on how much each rollout holds.
"""

from __future__ import annotations

import contextlib
import io
import json
import signal

import pytest
import ray
import torch

from examples.ppo_cartpole.job import PPOJob
from rlinfra.driver import read_metrics
from rlinfra.runtime.errors import WorkerGroupError
from rlinfra.runtime.group import WorkerGroup
from rlinfra.runtime.supervision import RestartBudgetExhausted
from rlinfra.services.weights import WeightSyncError
from tests.examples.job_checks import (
    assert_resources_released,
    job_config,
    load_checkpoint,
    read_tensorboard,
    sigkill,
)

LAYOUT = (
    "cluster.num_nodes=3",
    "cluster.simulate=3x2",
    "cluster.component_placement.actor.placement=0-1",
    "cluster.component_placement.rollout.placement='2,4'",
    "algo.num_steps=64",
    "run.plot=false",  # the learning curve is the other tests' (a second of matplotlib per run)
)
CFG = job_config("disaggregated", *LAYOUT)
pytestmark = [pytest.mark.timeout(300), pytest.mark.cluster(CFG)]


def faulty(*overrides: str):
    """The shared layout's config with this test's overrides."""
    return job_config("disaggregated", *LAYOUT, *overrides)


def test_killed_workers_are_replaced_and_a_killed_trainer_rank_restarts_from_its_checkpoint(
    cluster, tmp_path
) -> None:
    # Four faults in one run: rollout:1 and env:0 killed mid-collection (iterations 2 and 5),
    # env:1 between collecting and training (3), and trainer rank actor:1 after iteration 7 with
    # a checkpoint every other iteration: iteration 8's update is lost with the trainer and redone
    # (its batches rolled back) from the checkpoint of 6.
    iterations, checkpoint_every = 8, 2
    killed: dict[int, str] = {}

    def kill_mid_collection(record: dict) -> None:
        # With max_staleness 1 the next rollout is being collected while this runs: the kill lands
        # mid-collection; actor:1 dies before the next update is issued, and rank 0 waits in the
        # gradient all-reduce with it until the group is torn down.
        victim = {2: "rollout:1", 5: "env:0", 7: "actor:1"}.get(record["iteration"])
        if victim is not None and record["iteration"] not in killed:
            sigkill(victim)
            killed[record["iteration"]] = victim

    def kill_env_one_after_its_rollout(run) -> None:
        # Called between collecting and training: env:1 dies owning the rollout it just made.
        if run.state.iteration == 3 and 3 not in killed:
            sigkill("env:1")
            killed[3] = "env:1"

    cfg = faulty(
        f"algo.iterations={iterations}",
        f"run.checkpoint_every={checkpoint_every}",
        f"run.output_dir={tmp_path}",
    )
    result = PPOJob.run(
        cfg,
        cluster=cluster,
        on_iteration=kill_mid_collection,
        between_batches=kill_env_one_after_its_rollout,
    )

    assert result.iterations == iterations and not result.interrupted
    assert killed == {2: "rollout:1", 3: "env:1", 5: "env:0", 7: "actor:1"}
    replaced = [(r.component, r.rank, r.outcome) for rec in result.state.recoveries for r in rec.restarts]
    assert replaced == [("rollout", 1, "replaced"), ("env", 1, "replaced"), ("env", 0, "replaced")]
    (restart,) = result.state.trainer_restarts
    assert (restart.component, restart.outcome) == ("actor", "restarted")
    assert restart.detail == "from the checkpoint of iteration 6" and "[1]" in restart.reason
    # Each iteration once in the record, in order: nothing repeated, nothing skipped; TensorBoard
    # shows the same (the redone iteration's first attempt was purged).
    records = read_metrics(tmp_path)
    assert [r["iteration"] for r in records] == list(range(1, iterations + 1))
    board = read_tensorboard(tmp_path)
    assert board["train_s"] == [(r["iteration"], pytest.approx(r["train_s"])) for r in records]
    # The trainer applied exactly one update per iteration, across the restart.
    checkpoint = load_checkpoint(tmp_path)
    actor = torch.load(io.BytesIO(checkpoint["actor"]), weights_only=True)
    assert actor["updates"] == checkpoint["driver"]["iteration"] == iterations
    # Every batch id ended once: trained, lost with its worker (and made again under a new id, or,
    # for env:1's finished rollout, the update made on env:0's alone), or rolled back with the
    # trainer: never half-used.
    batches = result.batches
    assert batches["duplicated"] == 0 and batches["open"] == 0 and batches["lost"] >= 2
    assert batches["trained"] == iterations * 2 - 1  # two env workers, one batch each per iteration
    assert batches["rolled_back"] == 2  # iteration 8's first attempt
    ended = batches["trained"] + batches["dropped"] + batches["lost"] + batches["rolled_back"]
    assert ended == batches["issued"]
    # The replaced rollout worker served the committed version: every batch is one version, the
    # versions advance by one per iteration up to the trainer's loss, and they only ever rise (the
    # restored weights were re-published above the last one served).
    assert all(len(set(versions)) == 1 for versions in result.state.batch_versions)
    assert result.state.served_versions[:7] == list(range(7))
    assert result.state.served_versions == sorted(set(result.state.served_versions))
    assert_resources_released()


def test_a_dead_rollout_worker_past_its_restart_budget_stops_the_run(cluster, tmp_path) -> None:
    def kill_rollout_one(record: dict) -> None:
        if record["iteration"] == 2:
            ray.kill(ray.get_actor("rollout:1"), no_restart=True)

    cfg = faulty(
        "algo.iterations=10",
        f"run.output_dir={tmp_path}",
        "cluster.component_placement.rollout.restart.max=0",
    )
    with pytest.raises((WorkerGroupError, WeightSyncError, RestartBudgetExhausted)) as failure:
        PPOJob.run(cfg, cluster=cluster, on_iteration=kill_rollout_one)
    message = str(failure.value)
    assert "rollout:1" in message and "restart budget spent" in message, message
    # The failure report: printed (the exception's note, which main() prints) and kept as JSON.
    report = json.loads((tmp_path / "failure.json").read_text())
    assert report["error"].startswith("RestartBudgetExhausted: rollout:1 (node 2)")
    assert [(f["component"], f["rank"], f["node_rank"]) for f in report["failed"]] == [("rollout", 1, 2)]
    attempts = [(a["component"], a["rank"], a["outcome"]) for a in report["attempts"]]
    assert attempts == [("rollout", 1, "refused")]
    assert report["checkpoint"]["iteration"] == 2 and report["committed_version"] >= 1
    assert "--resume" in report["resume"] and report["details"]["batches"]["duplicated"] == 0
    notes = "\n".join(failure.value.__notes__)
    assert "what was tried: 1" in notes and "last checkpoint: iteration 2" in notes and "to resume:" in notes
    assert_resources_released()


def test_ctrl_c_during_a_recovery_releases_everything_and_resume_continues(
    cluster, tmp_path, monkeypatch
) -> None:
    replace = WorkerGroup.replace

    def replace_then_ctrl_c(self, rank, reason="", **options):
        restart = replace(self, rank, reason, **options)
        signal.raise_signal(signal.SIGINT)  # a real Ctrl-C, before admission and rewiring
        return restart

    monkeypatch.setattr(WorkerGroup, "replace", replace_then_ctrl_c)

    def kill_rollout_one(record: dict) -> None:
        if record["iteration"] == 2:
            sigkill("rollout:1")

    cfg = faulty("algo.iterations=10", f"run.output_dir={tmp_path}")
    stopped = PPOJob.run(cfg, cluster=cluster, on_iteration=kill_rollout_one)
    assert stopped.interrupted and stopped.iterations == 2
    # Every batch id ended, those in flight at the stop too (dropped: the resumed run makes its own).
    assert stopped.batches["open"] == 0 and stopped.batches["duplicated"] == 0
    assert_resources_released()
    assert load_checkpoint(tmp_path)["driver"]["iteration"] == 2

    def swallowed_ctrl_c_at_four(record: dict) -> None:
        if record["iteration"] == 4:
            # A real SIGINT whose KeyboardInterrupt some code swallows: the job must stop all the
            # same (at the end of the iteration), not train on.
            with contextlib.suppress(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)

    cfg = faulty("algo.iterations=10", f"run.output_dir={tmp_path}")
    resumed = PPOJob.run(cfg, cluster=cluster, resume=True, on_iteration=swallowed_ctrl_c_at_four)
    assert resumed.resumed_from == 2 and resumed.iterations == 4 and resumed.interrupted
    records = read_metrics(tmp_path)
    assert [r["iteration"] for r in records] == [1, 2, 3, 4]
    # The trainer continued from version 2 (restored), rather than starting again at 0, and both
    # rollout workers of the resumed run served it.
    assert records[-1]["learner_version"] == 4 and records[-1]["rollout_workers"] == 2
    assert resumed.state.served_versions[0] == 2
    assert resumed.state.env_steps == 4 * 16 * 64
    assert load_checkpoint(tmp_path)["driver"]["iteration"] == 4
    assert resumed.batches["open"] == 0 and resumed.batches["trained"] == 2 * 2
    assert_resources_released()


def test_trainer_past_its_restart_budget_stops_the_run(cluster, tmp_path):
    def kill_trainer(record: dict) -> None:
        if record["iteration"] == 1:
            sigkill("actor:0")

    cfg = faulty(
        "algo.iterations=5",
        f"run.output_dir={tmp_path}",
        "cluster.component_placement.actor.restart.max=0",
    )
    with pytest.raises(RestartBudgetExhausted, match=r"actor:0 .*restart budget spent"):
        PPOJob.run(cfg, cluster=cluster, on_iteration=kill_trainer)
    report = json.loads((tmp_path / "failure.json").read_text())
    assert [(a["component"], a["outcome"]) for a in report["attempts"]] == [("actor", "refused")]
    assert report["checkpoint"]["iteration"] == 1
    assert_resources_released()


def test_rollout_workers_removed_and_added_back_then_a_lost_node_leaves_its_worker_out(
    cluster, tmp_path
) -> None:
    # Last in this module: node 2 stays lost. Rollout worker 1 is removed after iteration 2 and
    # added back after 4 (elastic rollout); its node is lost after iteration 6, and the run goes
    # on without it (a lost node's rank cannot be replaced).
    iterations = 8

    def scale(run) -> None:
        if run.state.iteration == 2:
            run.resize("rollout", remove=[1])
        elif run.state.iteration == 4:
            run.resize("rollout", add=[1])

    def lose_node_two(record: dict) -> None:
        if record["iteration"] == 6:
            cluster.kill_node(2)

    cfg = faulty(f"algo.iterations={iterations}", f"run.output_dir={tmp_path}")
    result = PPOJob.run(cfg, cluster=cluster, between_batches=scale, on_iteration=lose_node_two)

    assert result.iterations == iterations and not result.interrupted
    records = read_metrics(tmp_path)
    workers = [r["rollout_workers"] for r in records]
    assert workers[:6] == [2, 2, 1, 1, 2, 2] and workers[-1] == 1, workers
    # Removing and adding killed nothing; the lost node is the one recovery: its rank dropped.
    (recovery,) = result.state.recoveries
    assert recovery.dropped == [("rollout", 1)]
    assert [(r.component, r.rank, r.node_rank, r.outcome) for r in recovery.restarts] == []
    # The added worker was admitted at the committed version: no batch mixes versions, and the
    # versions advance by one per iteration as in a run without changes.
    assert all(len(set(versions)) == 1 for versions in result.state.batch_versions)
    assert result.state.served_versions[:6] == list(range(6))
    assert result.state.served_versions == sorted(set(result.state.served_versions))
    batches = result.batches
    assert batches["duplicated"] == 0 and batches["open"] == 0
    ended = batches["trained"] + batches["dropped"] + batches["lost"] + batches["rolled_back"]
    assert ended == batches["issued"]
