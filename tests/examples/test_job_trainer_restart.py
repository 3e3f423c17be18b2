"""The trainer killed for real mid-run: its whole group is brought back from the last checkpoint,
the iterations since are redone once, and the run finishes; past the budget, the run stops."""

from __future__ import annotations

import io
import json
import os
import signal

import pytest
import ray
import torch

from examples.ppo_cartpole import reporting
from examples.ppo_cartpole.job import run
from rlinfra.runtime.supervision import RestartBudgetExhausted
from tests.examples.job_checks import assert_resources_released, job_config

pytestmark = pytest.mark.timeout(300)

CFG = job_config("disaggregated")


def sigkill(actor_name: str) -> None:
    """SIGKILL the process of a live named rlinfra worker (it tells its pid when asked if ready)."""
    os.kill(ray.get(ray.get_actor(actor_name).rlinfra_ready.remote(), timeout=30)["pid"], signal.SIGKILL)


def test_trainer_rank_killed_restarts_from_checkpoint_without_repeating_or_skipping(cluster, tmp_path):
    # A checkpoint every other iteration, the kill one iteration after one: iteration 3's update
    # is lost with the trainer and redone (its batches rolled back), from the checkpoint of 2.
    checkpoint_every, kill_after, rolled_back = 2, 3, 2
    killed = []

    def kill_trainer_rank_one(record: dict) -> None:
        # The next update comes next: rank 1 is dead when it is issued, and rank 0 waits in the
        # gradient all-reduce with it until the group is torn down.
        if record["iteration"] == kill_after and not killed:
            sigkill("actor:1")
            killed.append(record["iteration"])

    cfg = job_config(
        "disaggregated",
        "algo.iterations=6",
        f"run.checkpoint_every={checkpoint_every}",
        f"run.output_dir={tmp_path}",
    )
    result = run(cfg, cluster=cluster, on_iteration=kill_trainer_rank_one)

    assert result.iterations == 6 and killed == [kill_after]
    (restart,) = result.state.trainer_restarts
    assert (restart.component, restart.outcome) == ("actor", "restarted")
    assert restart.detail == "from the checkpoint of iteration 2" and "[1]" in restart.reason
    # Each iteration once in the record, in order: nothing repeated, nothing skipped.
    records = reporting.read_metrics(tmp_path)
    assert [r["iteration"] for r in records] == [1, 2, 3, 4, 5, 6]
    # The trainer applied exactly one update per iteration, across the restart.
    checkpoint = reporting.load_checkpoint(tmp_path)
    actor = torch.load(io.BytesIO(checkpoint["actor"]), weights_only=True)
    assert actor["updates"] == checkpoint["driver"]["iteration"] == 6
    # Versions only rise: the restored weights were re-published above the last one served.
    assert result.served_versions == sorted(set(result.served_versions))
    batches = result.batches
    assert batches["duplicated"] == 0 and batches["open"] == 0
    assert batches["trained"] == 6 * 2 and batches["rolled_back"] == rolled_back
    ended = batches["trained"] + batches["dropped"] + batches["lost"] + batches["rolled_back"]
    assert ended == batches["issued"]
    assert_resources_released()


def test_trainer_past_its_restart_budget_stops_the_run(cluster, tmp_path):
    def kill_trainer(record: dict) -> None:
        if record["iteration"] == 1:
            sigkill("actor:0")

    cfg = job_config(
        "disaggregated",
        "algo.iterations=5",
        f"run.output_dir={tmp_path}",
        "cluster.component_placement.actor.restart.max=0",
    )
    with pytest.raises(RestartBudgetExhausted, match=r"actor:0 .*restart budget spent"):
        run(cfg, cluster=cluster, on_iteration=kill_trainer)
    report = json.loads((tmp_path / "failure.json").read_text())
    assert [(a["component"], a["outcome"]) for a in report["attempts"]] == [("actor", "refused")]
    assert report["checkpoint"]["iteration"] == 1
    assert_resources_released()
