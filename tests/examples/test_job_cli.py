"""The main job from the command line: ``rlinfra run`` with overrides, a real SIGTERM, ``--resume``,
and ``python -m examples.ppo_cartpole`` rejecting a bad Hydra override before anything starts."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from examples.ppo_cartpole.config import JobConfig
from rlinfra.config import parse_config
from rlinfra.config.loading import load_config
from rlinfra.driver import read_metrics, run_module
from tests.examples.job_checks import EXAMPLE, load_checkpoint
from tests.processes import process_alive, process_group_alive

pytestmark = [pytest.mark.timeout(300), pytest.mark.ray]  # `rlinfra run` in a subprocess
ROOT = EXAMPLE.parents[1]
RLINFRA = Path(sys.executable).with_name("rlinfra")


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [str(RLINFRA), "run", str(EXAMPLE / "colocated.yaml"), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: the test can tell what it left behind
    )


def _wait_for_iterations(folder: Path, count: int, process: subprocess.Popen, timeout_s: float) -> None:
    """The driver appends one line per iteration; another process gives no event, so poll."""
    deadline = time.monotonic() + timeout_s
    while len(read_metrics(folder)) < count:
        assert process.poll() is None, process.communicate()[0]
        assert time.monotonic() < deadline, f"no {count} iterations within {timeout_s} s"
        time.sleep(0.2)


def _ray_servers_of(driver_pid: int) -> set[int]:
    """PIDs of the GCS server and raylets a driver started: Ray names its session after the pid of
    the process that started it (``--session-name=session_<date>_<time>_<pid>``)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if args[0].endswith(("/gcs_server", "/raylet")) and any(
                arg.startswith("--session-name=") and arg.endswith(f"_{driver_pid}") for arg in args
            ):
                found.add(int(entry.name))
    return found


def test_sigterm_stops_cleanly_and_leaves_a_checkpoint_to_resume_from(tmp_path) -> None:
    """The real command in its own process: its plan shown first, SIGTERM (``kill``, Slurm's
    ``scancel``) in the middle of a run stops it as Ctrl-C does (the same handler; SIGINT itself is
    raised in-process in ``test_job_faults``): status 130, no traceback (Ray's own driver handler
    would exit with one), everything released (its embedded Ray too), a checkpoint written and the
    way to resume printed. What ``--resume`` then does is tested in-process (``test_job_faults``);
    that the CLI passes the flag, in ``tests/cli/test_run.py``."""
    out = tmp_path / "run"
    process = _start("algo.iterations=50", f"run.output_dir={out}")
    _wait_for_iterations(out, 2, process, timeout_s=180)
    started_by_run = _ray_servers_of(process.pid)
    assert started_by_run, "the run's embedded Ray should be visible"
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=90)
    assert process.returncode == 130, output
    assert "interrupted after iteration" in output and "--resume" in output
    assert "Traceback" not in output
    assert not process_group_alive(process.pid), "the run left processes behind"
    # Ray's servers get their stop signal before the driver exits and take a moment to go.
    deadline = time.monotonic() + 15
    while [pid for pid in started_by_run if process_alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in started_by_run if process_alive(pid)], "the run left its Ray running"
    assert load_checkpoint(out)["driver"]["iteration"] >= 2
    records = read_metrics(out)
    assert [r["iteration"] for r in records] == list(range(1, len(records) + 1))
    assert f"curve: {out / 'curve.png'}" in output
    assert output.index("Node × device map") < output.index("iter ")
    assert json.loads((out / "placement.json").read_text())["relations"]["actor-rollout"] == "colocated"


def test_module_entry_composes_hydra_overrides() -> None:
    cfg = load_config(
        EXAMPLE, "disaggregated", ["algo.iterations=50", "run.output_dir=/tmp/x", "algo.seed=3"]
    )
    job = parse_config(JobConfig, cfg)
    algo, settings = job.algo, job.run
    assert (algo.iterations, algo.seed, settings.output_dir) == (50, 3, "/tmp/x")
    assert cfg.cluster.component_placement.rollout.placement == "4-5"  # the rest is untouched


def test_module_entry_rejects_a_bad_override_before_starting_ray(capsys) -> None:
    job = "examples.ppo_cartpole.job:PPOJob"
    assert run_module(EXAMPLE, job, ["--config-name", "colocated", "algo.no_such_key=1"]) == 2
    assert "no_such_key" in capsys.readouterr().err


def test_rlinfra_run_names_an_unknown_algo_key(tmp_path) -> None:
    result = subprocess.run(
        [str(RLINFRA), "run", str(EXAMPLE / "colocated.yaml"), "algo.lerning_rate=0.1"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    assert "algo: unknown key 'lerning_rate'" in result.stderr and "learning_rate" in result.stderr


@pytest.mark.parametrize(
    ("override", "message"),
    [("algo.env_id=CartPol-v1", "algo.env_id:"), ("algo.env_id=Pendulum-v1", "expected discrete actions")],
)
def test_a_bad_env_id_is_named_before_ray_starts(override: str, message: str) -> None:
    result = subprocess.run(
        [str(RLINFRA), "run", str(EXAMPLE / "colocated.yaml"), override],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Node × device map" not in result.stdout  # nothing was placed or started


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("+run.checkpoint_every=0", "run.checkpoint_every: got 0; expected at least 1"),
        ("run.transport=carrier_pigeon", "run.transport: got 'carrier_pigeon'"),
        ("algo.max_staleness=-1", "algo.max_staleness: got -1"),
        ("algo.iterations=1.5", "algo.iterations: expected int, got 1.5"),
    ],
)
def test_bad_job_settings_are_named_before_ray_starts(override: str, message: str) -> None:
    from examples.ppo_cartpole.config import JobConfigError

    cfg = load_config(EXAMPLE, "colocated", [override])
    with pytest.raises(JobConfigError, match=message.replace("(", r"\(")):
        parse_config(JobConfig, cfg)


def test_a_job_kept_beside_its_config_runs_from_any_directory(tmp_path):
    job = tmp_path / "jobs"
    job.mkdir()
    (job / "mybandit.py").write_text((ROOT / "examples" / "bandit" / "job.py").read_text())
    config = (ROOT / "examples" / "bandit" / "bandit.yaml").read_text()
    config = config.replace("examples.bandit.job:Bandit", "mybandit:Bandit")
    config = config.replace("outputs/bandit", str(tmp_path / "out"))
    (job / "mybandit.yaml").write_text(config)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(
        [
            str(RLINFRA),
            "run",
            str(job / "mybandit.yaml"),
            "algo.iterations=2",
            "algo.target=2.0",
            "run.plot=false",
        ],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert [r["iteration"] for r in read_metrics(tmp_path / "out")] == [1, 2]  # its workers imported it too
