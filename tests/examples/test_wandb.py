"""W&B as a metrics sink (``run.wandb``), in offline mode (no network), read back by wandb's own
reader (``wandb leet inspect``): the job's config and the placement, each iteration's record and
each recovery as in ``metrics.jsonl``, the summary as in ``summary.json``; ``--resume`` goes on
under the same W&B run id; what cannot log is refused before Ray starts. Workers are SIGKILLed
for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray

from examples.bandit.job import Bandit
from rlinfra.driver import JobConfigError, Run, read_events, read_metrics
from rlinfra.runtime.supervision import SupervisionError
from tests.examples.job_checks import assert_resources_released, job_config, sigkill

SHARED = ("cluster.num_nodes=2", "cluster.simulate=2x4", "run.plot=false")  # the bandit tests' Ray
CFG = job_config("bandit", *SHARED, example="bandit")
pytestmark = [pytest.mark.timeout(300), pytest.mark.cluster(CFG)]
BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
WORKERS = ("actor:0", "rollout:0", "rollout:1")
OFFLINE = ("run.wandb.project=rlinfra-tests", "run.wandb.name=bandit", "run.wandb.mode=offline")


def bandit(tmp_path: Path, *overrides: str):
    return job_config("bandit", *SHARED, f"run.output_dir={tmp_path}", *overrides, example="bandit")


@pytest.fixture(autouse=True)
def no_wandb_account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No W&B account: no API key, no ~/.netrc (and wandb writes nothing into the real home)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)


def wandb_runs(output: Path) -> list[tuple[dict, list[dict]]]:
    """Each offline run folder under ``output/wandb``, oldest first, as wandb's own reader shows it:
    (its state, config and summary; its history rows, wandb's ``_`` keys left out). Every run's
    charts are drawn against ``iteration``."""

    def inspect(folder: Path, *options: str) -> str:
        command = [str(BIN / "wandb"), "leet", "inspect", "--json", *options, str(folder)]
        return subprocess.run(command, capture_output=True, text=True, check=True, timeout=60).stdout

    runs = []
    for folder in sorted((output / "wandb").glob("offline-run-*")):
        records = [json.loads(line) for line in inspect(folder).splitlines()]
        history = [r["history"]["item"] for r in records if r["type"] == "history"]
        metrics = [r["metric"] for r in records if r["type"] == "metric"]
        assert [(m["glob_name"], m["step_metric"]) for m in metrics] == [("*", "iteration")]
        rows = [{k: v for k, v in item.items() if not k.startswith("_")} for item in history]
        runs.append((json.loads(inspect(folder, "--summary")), rows))
    return runs


def test_an_offline_run_holds_the_config_placement_records_recoveries_and_summary(cluster, tmp_path):
    # A sampler killed after iteration 2 is replaced; the trainer killed after iteration 3 is
    # restarted from its checkpoint of iteration 2 (one every other iteration) and redoes 3.
    def kill(record: dict) -> None:
        has_wandb = lambda worker: "wandb" in sys.modules  # noqa: E731  # run in each worker's process
        imported.update(ray.get(ray.get_actor(name).__ray_call__.remote(has_wandb)) for name in WORKERS)
        victim = {2: "rollout:1", 3: "actor:0"}.get(record["iteration"])
        if victim is not None and victim not in killed:
            sigkill(victim)
            killed.append(victim)

    killed: list[str] = []
    imported: set[bool] = set()
    cfg = bandit(tmp_path, "algo.target=2.0", "algo.iterations=5", "run.checkpoint_every=2", *OFFLINE)
    result = Bandit.run(cfg, cluster=cluster, on_iteration=kill)
    assert killed == ["rollout:1", "actor:0"] and result.iterations == 5
    assert imported == {False}  # no worker imported wandb; the driver logs

    [(run, rows)] = wandb_runs(tmp_path)
    shown = (run["project"], run["name"], run["state"], run["exit_code"])
    assert shown == ("rlinfra-tests", "bandit", "finished", 0)
    summary = json.loads((tmp_path / "summary.json").read_text())
    placement = json.loads((tmp_path / "placement.json").read_text())
    assert run["config"] == summary["config"] | {"placement": placement}  # as written after the recovery
    kept = {key: value for key, value in summary.items() if value is not None}  # W&B drops a null
    assert {key: run["summary"][key] for key in kept} == kept
    events = read_events(tmp_path)
    assert [e["event"] for e in events] == ["replaced", "restarted"] and events[1]["restored_iteration"] == 2
    assert [row for row in rows if "event" in row] == events
    records = [row for row in rows if "event" not in row]
    assert [r["iteration"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4, 5]
    assert [r["iteration"] for r in records] == [1, 2, 3, 3, 4, 5]  # W&B's history keeps the redone 3
    assert [r for r in records if r not in read_metrics(tmp_path)] == [records[2]]  # the 3 that was undone

    longer = Bandit.run(
        bandit(tmp_path, "algo.target=2.0", "algo.iterations=7", *OFFLINE), cluster=cluster, resume=True
    )
    assert longer.resumed_from == 5 and longer.iterations == 7
    (first, _), (resumed, rows) = wandb_runs(tmp_path)
    assert resumed["run_id"] == first["run_id"] and resumed["state"] == "finished"
    assert [row["iteration"] for row in rows] == [6, 7] and rows == read_metrics(tmp_path)[5:]
    assert resumed["summary"]["iterations"] == 7 and resumed["summary"]["outcome"] == "budget"
    again = Bandit.run(
        bandit(tmp_path, "algo.target=2.0", "algo.iterations=7", *OFFLINE), cluster=cluster, resume=True
    )
    assert again.outcome == "ended" and len(wandb_runs(tmp_path)) == 2  # nothing ran: no W&B run opened
    assert_resources_released()


def test_a_failed_run_finishes_its_wandb_run_as_failed_with_its_summary(cluster, tmp_path):
    def kill(record: dict) -> None:
        if record["iteration"] == 2:
            sigkill("rollout:0")

    cfg = bandit(tmp_path, "algo.target=2.0", "cluster.component_placement.rollout.restart.max=0", *OFFLINE)
    with pytest.raises(SupervisionError, match="rollout"):
        Bandit.run(cfg, cluster=cluster, on_iteration=kill)
    [(run, rows)] = wandb_runs(tmp_path)
    assert (run["state"], run["exit_code"], run["summary"]["outcome"]) == ("failed", 1, "failed")
    assert [row["iteration"] for row in rows] == [1, 2]
    assert_resources_released()


@pytest.mark.ray  # `rlinfra run` starts its own Ray in a subprocess
def test_rlinfra_run_logs_to_wandb_given_as_an_override(tmp_path):
    command = [
        str(BIN / "rlinfra"), "run", "examples/bandit/bandit.yaml", "algo.iterations=2", "algo.target=2.0",
        "run.plot=false", f"run.output_dir={tmp_path}", "run.wandb={project: cli, mode: offline}",
    ]  # fmt: skip
    ran = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=ROOT, env=os.environ)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    [(run, rows)] = wandb_runs(tmp_path)
    assert run["project"] == "cli" and run["config"]["run"]["wandb"]["mode"] == "offline"
    assert rows == read_metrics(tmp_path) and [row["iteration"] for row in rows] == [1, 2]
    assert "wandb:" not in ran.stdout + ran.stderr  # silent: the run's own lines only


def test_without_wandb_installed_the_run_is_refused_before_ray_starts(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    cfg = bandit(tmp_path, *OFFLINE)
    with pytest.raises(
        JobConfigError, match=r"^run\.wandb: wandb is not installed: pip install 'rlinfra\[wandb\]'"
    ):
        Run(Bandit(cfg), cfg)


def test_online_without_an_api_key_is_refused_rather_than_asked_for(tmp_path):
    cfg = bandit(tmp_path, "run.wandb.project=x")  # mode: online, the default
    with pytest.raises(
        JobConfigError, match=r"^run\.wandb: no W&B API key: set WANDB_API_KEY or run `wandb login`"
    ):
        Run(Bandit(cfg), cfg)
    assert not (tmp_path / "wandb").exists()


def test_tensorboard_stays_the_default_and_wandb_is_off(tmp_path):
    settings = Bandit(bandit(tmp_path)).settings
    assert settings.tensorboard and settings.wandb is None
