"""The README's "Write your own job" example (``examples/bandit``) on the driver API, and what the
driver promises every job: each way a run ends (target, budget, Ctrl-C, failure) ends every batch
id and writes ``summary.json``; every survived fault (a sampler replaced, the trainer restarted)
is a console line, a metrics event (JSONL and TensorBoard) and an entry of ``summary.json``.
Runs are seconds long; workers are SIGKILLed for real."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from examples.bandit.job import Bandit, Policy, Sampler
from rlinfra import Worker
from rlinfra.cli.main import app
from rlinfra.driver import Batch, JobConfigError, Run, Update, read_events, read_metrics
from rlinfra.driver.checkpoints import CheckpointStore
from rlinfra.placement import PlacementError
from rlinfra.runtime.supervision import SupervisionError
from tests.examples.job_checks import assert_resources_released, job_config, read_tensorboard, sigkill

SHARED = ("cluster.num_nodes=2", "cluster.simulate=2x4", "run.plot=false")  # the PPO tests' Ray
CFG = job_config("bandit", *SHARED, example="bandit")
pytestmark = [pytest.mark.timeout(300), pytest.mark.cluster(CFG)]


def bandit(tmp_path, *overrides: str):
    return job_config("bandit", *SHARED, f"run.output_dir={tmp_path}", *overrides, example="bandit")


def summary_of(tmp_path) -> dict:
    return json.loads((tmp_path / "summary.json").read_text())


def assert_every_batch_ended(summary: dict) -> None:
    batches = summary["batches"]
    assert batches["open"] == 0 and batches["duplicated"] == 0, batches
    ended = batches["trained"] + batches["dropped"] + batches["lost"] + batches["rolled_back"]
    assert ended == batches["issued"] > 0


def test_the_example_learns_and_stops_at_its_target(cluster, tmp_path) -> None:
    result = Bandit.run(bandit(tmp_path), cluster=cluster)
    summary = summary_of(tmp_path)
    assert result.outcome == summary["outcome"] == "target" and result.iterations < 200
    assert read_metrics(tmp_path)[-1]["mean_reward"] >= 0.75
    assert result.state.served_versions == list(range(len(result.state.served_versions)))  # one per iteration
    assert all(len(set(versions)) == 1 for versions in result.state.batch_versions)
    assert_every_batch_ended(summary)  # the pulls in flight at the target were ended too
    assert_resources_released()


def test_the_budget_ends_every_batch(cluster, tmp_path) -> None:
    result = Bandit.run(bandit(tmp_path, "algo.iterations=3", "algo.target=2.0"), cluster=cluster)
    assert result.outcome == summary_of(tmp_path)["outcome"] == "budget" and result.iterations == 3
    assert_every_batch_ended(summary_of(tmp_path))
    assert_resources_released()


def test_ctrl_c_ends_every_batch_and_resume_goes_on(cluster, tmp_path) -> None:
    def ctrl_c(record: dict) -> None:
        if record["iteration"] == 2:
            signal.raise_signal(signal.SIGINT)

    cfg = bandit(tmp_path, "algo.target=2.0", "algo.iterations=4")
    stopped = Bandit.run(cfg, cluster=cluster, on_iteration=ctrl_c)
    assert stopped.interrupted and stopped.iterations == 2
    assert summary_of(tmp_path)["outcome"] == "interrupted"
    assert_every_batch_ended(summary_of(tmp_path))
    resumed = Bandit.run(cfg, cluster=cluster, resume=True)
    assert resumed.resumed_from == 2 and resumed.iterations == 4 and resumed.state.served_versions[0] == 2
    assert_every_batch_ended(summary_of(tmp_path))
    assert_resources_released()


def test_survived_faults_are_shown_logged_and_summarised(cluster, tmp_path) -> None:
    # A sampler killed while it pulls (after iteration 2) is replaced; the trainer killed after
    # iteration 4 is restarted from its checkpoint. Each shows in all three places.
    def kill(record: dict) -> None:
        if record["iteration"] == 3:  # a second terminal's view of the live run
            live.append(CliRunner().invoke(app, ["status", str(tmp_path)], env={"COLUMNS": "200"}).stdout)
            rlinfra = str(Path(sys.executable).with_name("rlinfra"))
            command = [rlinfra, "logs", str(tmp_path), "rollout", "--follow"]
            followers.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True))
        victim = {2: "rollout:1", 4: "actor:0"}.get(record["iteration"])
        if victim is not None and victim not in killed:
            killed_pids.append(sigkill(victim))
            killed.append(victim)

    killed: list[str] = []
    killed_pids: list[int] = []
    live: list[str] = []
    followers: list[subprocess.Popen] = []
    screen = io.StringIO()
    console = Console(file=screen, width=200)
    cfg = bandit(tmp_path, "algo.target=2.0", "algo.iterations=6")
    result = Bandit.run(cfg, cluster=cluster, console=console, on_iteration=kill)

    assert killed == ["rollout:1", "actor:0"] and result.iterations == 6
    shown = [line for line in screen.getvalue().splitlines() if line.startswith("recovered")]
    assert len(shown) == 2, screen.getvalue()
    assert shown[0].startswith("recovered rollout:1 on node 0: replaced after ")
    assert shown[1].startswith("recovered actor:0 on node 0: restarted after ")
    assert "serving again" in shown[0] and "serving again" in shown[1]
    events = read_events(tmp_path)
    assert [(e["event"], e["component"], e["rank"], e["node"]) for e in events] == [
        ("replaced", "rollout", 1, 0),
        ("restarted", "actor", 0, 0),
    ]
    assert events[0]["admitted_version"] is not None and events[1]["restored_iteration"] == 4
    assert all(e["served_after_s"] > 0 and e["cause"] for e in events)
    assert read_tensorboard(tmp_path)["events"][-1][1] == 2
    summary = summary_of(tmp_path)
    assert summary["recoveries"] == events
    assert "survived 2 fault(s)" in result.report()
    assert [r["iteration"] for r in read_metrics(tmp_path)] == list(range(1, 7))  # none repeated
    processes = json.loads((tmp_path / "placement.json").read_text())["processes"]
    pids = {rank: process["pid"] for rank, process in processes.items()}
    assert all(process["node"] == 0 for process in processes.values())
    assert set(pids) == {"actor:0", "rollout:0", "rollout:1"} and all(
        isinstance(p, int) for p in pids.values()
    )
    assert pids["rollout:1"] != killed_pids[0] and pids["actor:0"] != killed_pids[1]  # the new processes
    assert f"{tmp_path}: running (last progress" in live[0] and "iteration 3," in live[0]
    assert "recoveries: 1\n  rollout:1 replaced after" in live[0]
    ended = CliRunner().invoke(app, ["status", str(tmp_path)], env={"COLUMNS": "200"})
    assert ended.exit_code == 0 and f"{tmp_path}: ended: budget" in ended.stdout
    assert "iteration 6," in ended.stdout and "recoveries: 2" in ended.stdout
    assert f"rollout:1: node 0, pid {pids['rollout:1']}" in ended.stdout
    logs = CliRunner().invoke(app, ["logs", str(tmp_path), "rollout:1"])  # the replacement's own log
    assert logs.exit_code == 0 and "rollout:1 | :actor_name:rollout:1" in logs.stdout, logs.output
    assert {line.split(" | ")[0] for line in logs.stdout.splitlines()} == {"rollout:1"}
    followed, _ = followers[0].communicate(timeout=30)  # --follow ends with the run
    assert followers[0].returncode == 0 and "rollout:0 | :actor_name:rollout:0" in followed
    wrong = CliRunner().invoke(app, ["logs", str(tmp_path), "rollouts"])
    assert wrong.exit_code == 2 and "did you mean 'rollout'?" in wrong.stderr
    assert_every_batch_ended(summary)
    assert_resources_released()


def test_a_failed_run_ends_every_batch_and_reports(cluster, tmp_path) -> None:
    def kill(record: dict) -> None:
        if record["iteration"] == 2:
            sigkill("rollout:0")

    cfg = bandit(tmp_path, "algo.target=2.0", "cluster.component_placement.rollout.restart.max=0")
    with pytest.raises(SupervisionError, match="rollout") as failed:
        Bandit.run(cfg, cluster=cluster, on_iteration=kill)
    shown = "\n".join([str(failed.value), *failed.value.__notes__])  # what the CLI prints
    assert shown.count("restart budget spent") == 1, shown  # each fact once
    assert "what was tried: 1\n" in shown and " rollout:0 refused in " in shown
    summary = summary_of(tmp_path)
    assert summary["outcome"] == "failed"
    assert_every_batch_ended(summary)
    report = json.loads((tmp_path / "failure.json").read_text())
    assert report["details"]["batches"]["open"] == 0
    assert_resources_released()


def test_the_trainer_component_is_named_by_the_config(cluster, tmp_path) -> None:
    """A job whose trainer is called ``trainer``: ``run.trainer`` says so, and the run places,
    starts and checkpoints that component; nothing asks for an ``actor`` the user never wrote."""

    class Renamed(Bandit):
        components = ("trainer", "rollout")

    cfg = bandit(tmp_path, "algo.iterations=2", "algo.target=2.0", "run.trainer=trainer")
    placed = cfg.cluster.component_placement
    placed["trainer"] = placed.pop("actor")
    result = Run(Renamed(cfg), cfg, cluster=cluster).execute()
    assert result.outcome == "budget" and set(result.placements) == {"trainer", "rollout"}
    assert CheckpointStore(tmp_path).load_latest().payloads.keys() == {"trainer"}
    assert_resources_released()


def test_a_trainer_the_job_does_not_have_is_refused_when_the_run_is_built(tmp_path) -> None:
    """Refused by ``Run(...)`` itself: ``execute``, which starts Ray and places, is never reached."""
    cfg = bandit(tmp_path, "run.trainer=actr")
    with pytest.raises(JobConfigError, match=r"run.trainer: 'actr' is not a component of the bandit job; "):
        Run(Bandit(cfg), cfg)


class Baseline(Worker):
    """A second trained group: the mean reward (a baseline a critic would learn), one update per
    step, checkpointed and restored as bytes of its own."""

    def setup(self, checkpoint: bytes | None) -> int:
        self.mean, self.updates = (0.0, 0) if checkpoint is None else tuple(json.loads(checkpoint))
        return self.updates

    def train(self, batches: list[Batch]) -> Update:
        rewards = [r for batch in batches for r in batch.payload["rewards"]]
        self.mean += 0.5 * (sum(rewards) / max(len(rewards), 1) - self.mean)
        self.updates += 1
        return Update(self.updates, [batch.id for batch in batches], {"baseline": self.mean})

    def checkpoint(self) -> bytes:
        return json.dumps([self.mean, self.updates]).encode()


class WithCritic(Bandit):
    components = ("actor", "rollout", "critic")

    def loop(self, run: Run) -> None:
        algo = self.config.algo
        policy = run.start_trainer(lambda: Policy.create_group(algo.learning_rate))
        critic = run.start_trainer(lambda: Baseline.create_group(), "critic")
        samplers = run.launch("rollout", Sampler.create_group(), max_concurrency=2)
        pulls = run.batches(samplers, Sampler.pull, (algo.pulls,))
        for step in run.steps(algo.iterations):
            batches = pulls.gather()
            run.commit()
            pulls.issue()
            step.train(policy.train, batches)
            step.train(critic.train, batches)
            step.log(mean_reward=0.0)


def test_two_trained_groups_restart_together_each_from_its_own_checkpoint(cluster, tmp_path) -> None:
    """An actor and a critic: each checkpointed; the critic's rank killed after iteration 3 (a
    checkpoint every other one) brings both back from iteration 2, each from its own payload."""

    def kill(record: dict) -> None:
        if record["iteration"] == 3 and not killed:
            killed.append(sigkill("critic:0"))

    killed: list[int] = []
    cfg = bandit(
        tmp_path, "algo.iterations=5", "run.checkpoint_every=2", "cluster.component_placement.critic=3"
    )
    result = WithCritic.run(cfg, cluster=cluster, on_iteration=kill)
    assert killed and result.iterations == 5
    events = [(e["event"], e["component"], e["restored_iteration"]) for e in read_events(tmp_path)]
    assert events == [("restarted", "actor", 2), ("restarted", "critic", 2)]
    records = read_metrics(tmp_path)
    assert [r["iteration"] for r in records] == [1, 2, 3, 4, 5] and all(
        "critic_baseline" in r for r in records
    )
    saved = CheckpointStore(tmp_path).load_latest()
    assert saved.payloads.keys() == {"actor", "critic"}
    assert json.loads(saved.payloads["critic"])[1] == 5  # its updates: 2 restored, 3 redone after
    assert_every_batch_ended(summary_of(tmp_path))
    assert_resources_released()


def test_a_run_refuses_a_plan_its_memory_declaration_overfills_before_any_worker_starts(cluster, tmp_path):
    cfg = bandit(tmp_path)
    cfg.cluster.accelerator = {"memory_gib": 8}  # a 7B trainer's states alone are 113 GiB
    cfg.cluster.component_placement.actor = {
        "placement": 0,
        "model": "examples/memory/qwen2.5-7b.json",
        "memory": {"role": "trainer"},
    }
    with pytest.raises(PlacementError, match=r"node 0 device 0: phase 'all' needs .* GiB of 8\.0 GiB"):
        Bandit.run(cfg, cluster=cluster)
    assert_resources_released()


def test_each_planned_components_measured_peak_is_reported_beside_the_plan_and_warned_when_over(
    cluster, tmp_path
):
    model = tmp_path / "tiny.json"
    model.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "vocab_size": 8,
                "hidden_size": 8,
                "intermediate_size": 8,
                "num_hidden_layers": 1,
                "num_attention_heads": 1,
            }
        )
    )
    cfg = bandit(tmp_path / "run", "algo.iterations=2", "algo.target=2.0")
    cfg.cluster.accelerator = {"memory_gib": 64}
    # The plan's process overhead is all these processes hold: 10 MiB is less than any Python
    # process with Ray and numpy loaded; 32 GiB is more than this machine would let one take.
    cfg.cluster.component_placement.actor = {
        "placement": 0,
        "model": str(model),
        "memory": {"role": "reference", "overhead_gib": 0.01},
    }
    cfg.cluster.component_placement.rollout.model = str(model)
    cfg.cluster.component_placement.rollout.memory = {"role": "reference", "overhead_gib": 32}
    console = io.StringIO()
    Bandit.run(cfg, cluster=cluster, console=Console(file=console, width=200))
    memory = summary_of(tmp_path / "run")["memory"]
    assert set(memory) == {"actor", "rollout"}
    for component, ranks in (("actor", 1), ("rollout", 2)):
        assert memory[component]["measured"] == "rss" and len(memory[component]["measured_bytes"]) == ranks
        assert all(2**20 < peak < 32 * 2**30 for peak in memory[component]["measured_bytes"])
    assert memory["actor"]["predicted_bytes"] < 2**24 < memory["rollout"]["predicted_bytes"]
    assert [e["component"] for e in read_events(tmp_path / "run") if e["event"] == "memory"] == [
        "actor",
        "rollout",
    ]
    output = console.getvalue()
    assert "warning: actor:0 peaked at" in output and "over the plan's 0.01 GiB" in output
    assert "rollout:" not in output.split("warning:")[-1]


def test_resuming_a_run_that_ended_with_the_same_config_runs_nothing_and_says_so(cluster, tmp_path):
    cfg = bandit(tmp_path, "algo.iterations=2", "algo.target=2.0")
    assert Bandit.run(cfg, cluster=cluster).outcome == "budget"
    metrics = (tmp_path / "metrics.jsonl").read_text()
    again = Bandit.run(cfg, cluster=cluster, resume=True)
    assert again.outcome == "ended" and again.iterations == 2
    assert again.report().startswith("nothing to resume: the run already ended (budget) at iteration 2")
    assert (tmp_path / "metrics.jsonl").read_text() == metrics and summary_of(tmp_path)["outcome"] == "budget"
    longer = Bandit.run(
        bandit(tmp_path, "algo.iterations=3", "algo.target=2.0"), cluster=cluster, resume=True
    )
    assert longer.outcome == "budget" and longer.resumed_from == 2 and longer.iterations == 3
    assert_resources_released()
