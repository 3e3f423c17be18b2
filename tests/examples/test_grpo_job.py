"""The GRPO job, disaggregated config, on its own simulated cluster (2 nodes x 2 logical GPUs).

Short runs from a warm-up checkpoint (``tests/fixtures/grpo_start``) check what the full run
relies on: the placement is the one ``rlinfra plan`` shows, every sequence carries the version
that made it (one per batch), batches are at most ``max_staleness`` old, the version barrier
commits each version once, a killed engine is replaced and re-admitted at the served version, a
killed trainer rank restarts the trainer from its checkpoint, Ctrl-C releases everything and
``--resume`` continues (one run has all four), and bad model paths are refused before Ray
starts. That GRPO gains +0.25 held-out accuracy is the one long test here (``-m slow``).
"""

from __future__ import annotations

import contextlib
import io
import json
import signal

import pytest
import torch

from examples.grpo_lm import job as grpo_job
from examples.grpo_lm.job import GRPOJob
from examples.grpo_lm.lm.model import ModelLoadError
from rlinfra.driver.checkpoints import CheckpointStore
from rlinfra.driver.metrics import read_metrics
from tests.examples.job_checks import (
    assert_resources_released,
    assert_reward_improves,
    grpo_config,
    job_config,
    planned_placements,
    read_tensorboard,
    sigkill,
)

CFG = job_config("disaggregated", example="grpo_lm")
pytestmark = [pytest.mark.timeout(600), pytest.mark.cluster(CFG)]
ENGINES = 2  # rollout: 2-3


def short_run(tmp_path, *overrides: str):
    return grpo_config("disaggregated", tmp_path, *overrides)


def summary_of(output_dir) -> dict:
    return json.loads((output_dir / "summary.json").read_text())


def test_short_run_places_stamps_versions_syncs_every_update_and_learns(cluster, tmp_path) -> None:
    updates = 60
    result = GRPOJob.run(
        short_run(tmp_path, f"algo.updates={updates}", "algo.eval_every=30"), cluster=cluster
    )

    assert not result.interrupted and result.iterations == updates
    assert result.placements == planned_placements("disaggregated", example="grpo_lm")
    assert result.relations["actor-rollout"] == "disaggregated"
    records = read_metrics(tmp_path)
    assert [r["iteration"] for r in records] == list(range(1, updates + 1))
    # One committed version per iteration after the first, each one higher than the last.
    assert result.state.served_versions == list(range(updates))
    # Every batch came from one version (stamped on every sequence by the engine) and, generated
    # while the actor trained on the previous one, is exactly one update old from the second on.
    assert [versions[0] for versions in result.state.batch_versions] == [0, *range(updates - 1)]
    assert [r["staleness"] for r in records] == [0] + [1] * (updates - 1)
    assert result.state.dropped_batches == 0
    # The engines' gate closed around each swap, inside the driver's pause window.
    assert all(0 < r["held_s"] < r["pause_s"] for r in records[1:])
    assert all(r["informative_frac"] > 0 for r in records)  # every update had a reward signal
    assert_reward_improves(records)
    assert result.state.warm_accuracy is not None
    assert [point["iteration"] for point in summary_of(tmp_path)["curve"]] == [0, 30, 60]
    board = read_tensorboard(tmp_path)
    assert [step for step, _ in board["accuracy"]] == [30, 60]
    assert [step for step, _ in board["reward_mean"]] == list(range(1, updates + 1))
    assert result.plot is not None and result.plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = result.state.ledger.summary()
    assert summary["trained"] == updates * ENGINES and summary["open"] == 0  # one id per engine per batch
    assert_resources_released()


def test_a_killed_engine_and_trainer_rank_are_recovered_then_ctrl_c_stops_and_resume_continues(
    cluster, tmp_path
) -> None:
    # Three events in one run. After update 1 an engine is SIGKILLed while it generates batch 2:
    # it is replaced and re-admitted at the served version. A checkpoint every other update, and a
    # trainer rank killed after update 3: update 3 is lost with the trainer and redone from the
    # checkpoint of update 2, on the same prompts. After update 4, a Ctrl-C that some code
    # swallows: the run stops all the same, releases everything, and ``resume`` goes on to 6.
    updates, killed = 6, []

    def kill_then_ctrl_c(record: dict) -> None:
        if record["iteration"] == 1 and not killed:
            killed.append(sigkill("rollout:0"))
        if record["iteration"] == 3 and len(killed) == 1:  # the next update finds rank 1 dead
            killed.append(sigkill("actor:1"))
        if record["iteration"] == 4:
            with contextlib.suppress(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)

    overrides = (f"algo.updates={updates}", "algo.eval_every=3", "run.checkpoint_every=2", "run.plot=false")
    stopped = GRPOJob.run(short_run(tmp_path, *overrides), cluster=cluster, on_iteration=kill_then_ctrl_c)

    assert len(killed) == 2 and stopped.interrupted and stopped.iterations == 4
    (recovery,) = stopped.state.recoveries
    (replaced,) = recovery.restarts
    assert (replaced.component, replaced.rank, replaced.outcome) == ("rollout", 0, "replaced")
    assert recovery.admitted_version is not None
    (restart,) = stopped.state.trainer_restarts
    assert (restart.component, restart.outcome) == ("actor", "restarted")
    assert restart.detail == "from the checkpoint of update 2" and "[1]" in restart.reason
    # Every id ended once. The engine's kill lands while batch 2 is generated or just after: lost
    # and made again, or found dead at the next call (the commit); update 3's first batches were
    # rolled back with the trainer; those in flight at the stop were dropped.
    batches = stopped.state.ledger.summary()
    assert batches["duplicated"] == 0 and batches["open"] == 0 and batches["lost"] <= 1
    assert batches["trained"] == 4 * ENGINES and batches["rolled_back"] == ENGINES
    ended = batches["trained"] + batches["dropped"] + batches["lost"] + batches["rolled_back"]
    assert ended == batches["issued"]
    assert_resources_released()

    resumed = GRPOJob.run(short_run(tmp_path, *overrides), cluster=cluster, resume=True)
    assert resumed.resumed_from == 4 and resumed.iterations == updates and not resumed.interrupted
    # Each update once in the record, in order; TensorBoard's redone steps purged the same way.
    records = read_metrics(tmp_path)
    assert [r["iteration"] for r in records] == list(range(1, updates + 1))
    board = read_tensorboard(tmp_path)
    assert board["train_s"] == [(r["iteration"], pytest.approx(r["train_s"])) for r in records]
    # The held-out curve goes on across the restart and the resume: the warm-up point, then one
    # point per evaluation, the redone one once.
    assert [point["iteration"] for point in summary_of(tmp_path)["curve"]] == [0, 3, 6]
    # The trainer applied exactly one update per iteration across the restart and the resume, and
    # the prompt stream was rewound with it: the same prompts as a run without the faults (a lost
    # batch is made again from its own prompts).
    saved = CheckpointStore(tmp_path).load_latest()
    assert saved is not None and saved.step == updates
    actor = torch.load(io.BytesIO(saved.payloads["actor"]), weights_only=True)
    assert actor["updates"] == updates
    assert resumed.job.drawn == updates * resumed.job.algo.prompts_per_step
    # The trainer went on from its restored version instead of starting again, the engines served
    # it, and versions only rise: the restarted trainer's weights were served above the last one.
    versions = [*stopped.state.served_versions, *resumed.state.served_versions]
    assert versions == sorted(set(versions))
    assert records[-1]["learner_version"] == records[3]["learner_version"] + 2
    assert all(r["staleness"] <= 1 for r in records)
    assert resumed.state.ledger.summary()["trained"] == (updates - 4) * ENGINES
    assert_resources_released()


@pytest.mark.slow
def test_a_full_run_gains_the_target_over_its_start_checkpoint(cluster, tmp_path) -> None:
    """The learning claim (held-out exact match + 0.25 over the start), minutes long: run with
    ``pytest -m slow``; ``benchmarks/grpo_lm.py`` measures the same for both layouts."""
    cfg = short_run(
        tmp_path, "algo.stop_at_target=true", "algo.updates=1500", "algo.eval_every=50", "algo.eval_size=500"
    )
    result = GRPOJob.run(cfg, cluster=cluster)
    summary = summary_of(tmp_path)
    assert result.time_to_target_s is not None, summary["curve"]
    assert summary["accuracy"] is not None and summary["warm_accuracy"] is not None
    assert summary["accuracy"] >= summary["warm_accuracy"] + 0.25
    assert_resources_released()


def test_a_model_path_that_cannot_load_is_refused_before_ray_starts(tmp_path, capsys) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelLoadError, match="no-such-model"):
        GRPOJob.run(short_run(tmp_path, f"model.path={missing}"))
    (tmp_path / "empty").mkdir()
    cfg = short_run(tmp_path / "out", f"model.path={tmp_path / 'empty'}")
    assert grpo_job.GRPOJob.main(cfg) == 2
    assert "config.json" in capsys.readouterr().err
