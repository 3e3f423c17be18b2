"""``rlinfra slurm``: the sbatch script it renders, run under a real Slurm (22.05: munged,
slurmctld and two slurmd with fake GPUs on this host, ``tests/slurm_cluster.py``), and the
rendering itself.

Both Slurm nodes are this host, so each Ray node gets its own temp dir and ports (the script's
``RLINFRA_SLURM_*`` overrides); everything else is what a user's allocation runs: ``sbatch``,
``srun`` steps, ``scancel``. The tests check that a driver sees both nodes' ranks, GPUs and the
CPUs Slurm allocated, and the job ends COMPLETED; that a node whose Ray dies ends the job non-zero,
naming it; that ``scancel`` stops Ray by SIGTERM and the script inside Slurm's KillWait, without a
traceback; that the PPO main job runs on a 2-node allocation, placed as ``rlinfra plan`` says; and
that nothing is left running after any of them. Without Slurm (not root, or not installed) these
are skipped, saying why; ``make test`` installs it where it can.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlinfra.cli.main import app
from rlinfra.ops.slurm import SlurmError, SlurmJob, job_from_config, node_address, render_sbatch
from tests import slurm_cluster
from tests.ports import free_ports

pytestmark = pytest.mark.ray_fixtures("slurm")  # rendering needs no Slurm and no Ray

ROOT = Path(__file__).resolve().parents[2]
DRIVER = """\
import os, sys
import ray
from rlinfra.runtime.discovery import rank_nodes

ray.init(address=os.environ["RAY_ADDRESS"], logging_level="error")
nodes = rank_nodes(ray.nodes())
print("ranks", [(node.rank, node.labels.get("rlinfra-node-rank")) for node in nodes], flush=True)
print("resources", {key: ray.cluster_resources().get(key) for key in ("CPU", "GPU")}, flush=True)
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""
WAITING_DRIVER = """\
import sys, time
from rlinfra import Cluster
from rlinfra.driver.signals import CtrlC

cluster = Cluster({"num_nodes": 2})
open(sys.argv[1], "w").close()
try:
    with CtrlC().watching():
        time.sleep(300)
except KeyboardInterrupt:
    print("driver: stopped by SIGTERM", flush=True)
finally:
    cluster.shutdown()
"""
CONFIG = """\
cluster:
  num_nodes: {nodes}
  simulate: {nodes}x{gpus}
  component_placement:
    actor: all
"""


@pytest.fixture(scope="module")
def slurm() -> Iterator[slurm_cluster.SlurmCluster]:
    why = slurm_cluster.missing()
    if why is not None:
        pytest.skip(why)
    started = time.monotonic()
    cluster = slurm_cluster.start()
    print(f"\nSlurm up in {time.monotonic() - started:.1f} s ({cluster.root})")
    yield cluster
    cluster.stop()


@dataclass
class Job:
    id: str
    output: Path
    temp_dir: str

    def text(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""


def _leftovers(marker: str) -> dict[int, str]:
    """pid → command line of every live process whose command line mentions ``marker`` (the
    job's Ray temp dir)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace").replace("\0", " ")
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if marker in cmdline and state != "Z":
                found[int(entry.name)] = cmdline
    return found


def _assert_nothing_left(job: Job, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (left := _leftovers(job.temp_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:  # a failed test must not leave them running
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shown = [f"{pid} {cmdline[:120]}" for pid, cmdline in left.items()]
    assert not left, f"left running: {shown}\n{job.text()[-3000:]}"


@pytest.fixture
def submit(slurm, tmp_path: Path) -> Iterator:
    """``rlinfra slurm submit`` CONFIG's script for ``driver`` (rendered, then sbatch'ed); the
    job's Ray nodes get their own temp dir (short: Ray's socket paths must fit in 107 bytes) and
    ports, through the environment sbatch passes on."""
    jobs: list[Job] = []

    def start(driver: list[str], *render: str, nodes: int = 2, config: Path | None = None, **env: str) -> Job:
        if config is None:
            config = tmp_path / "conf.yaml"
            config.write_text(CONFIG.format(nodes=nodes, gpus=slurm_cluster.GPUS_PER_NODE))
        script, output = tmp_path / "job.sbatch", tmp_path / "job.out"
        temp_dir = tempfile.mkdtemp(prefix="rljs")
        os.chmod(temp_dir, 0o755)
        gcs, client, head_agent, worker_agent = free_ports(4)
        variables = {key: value for key, value in slurm.env.items() if not key.startswith("RAY_")}
        variables.update(
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{variables.get('PATH', '')}",
            PYTHONPATH=str(ROOT),
            RLINFRA_SLURM_TEMP_DIR=temp_dir,
            RLINFRA_SLURM_PORT=str(gcs),
            RLINFRA_SLURM_HEAD_ARGS=(
                f"--include-dashboard=false --ray-client-server-port={client} "
                f"--dashboard-agent-listen-port={head_agent}"
            ),
            RLINFRA_SLURM_WORKER_ARGS=f"--dashboard-agent-listen-port={worker_agent}",
            RLINFRA_SLURM_NODE_TIMEOUT="90",
        )
        variables.update(env)
        command = ["slurm", "submit", str(config), "-o", str(script), "--sbatch", f"output={output}", *render]
        submitted = CliRunner().invoke(app, [*command, "--", *driver], env=variables)
        assert submitted.exit_code == 0, submitted.output
        found = re.search(r"submitted job (\d+) \(\d+ node\(s\)\); log: (\S+)", submitted.stdout)
        assert found is not None and found.group(2) == str(output), submitted.stdout
        job = Job(found.group(1), output, temp_dir)
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        slurm.run("scancel", job.id, check=False)
        with contextlib.suppress(AssertionError):
            _assert_nothing_left(job, timeout_s=20)
        shutil.rmtree(job.temp_dir, ignore_errors=True)


def _assert_ray_got_sigterm(job: Job) -> None:
    """Both nodes' raylets and the GCS logged SIGTERM: they stopped on their own, not by SIGKILL."""
    logs = {path: path.read_text(errors="replace") for path in Path(job.temp_dir).rglob("*.out")}
    raylets = [
        path for path, text in logs.items() if path.name == "raylet.out" and "received SIGTERM" in text
    ]
    assert len(raylets) == 2, f"raylets that logged SIGTERM: {raylets}"
    assert any("GCS server received SIGTERM" in text for text in logs.values())


def _script(tmp_path: Path, text: str, *args: str) -> list[str]:
    """A driver command running ``text`` from a file (a command line is one line)."""
    path = tmp_path / f"driver{len(list(tmp_path.glob('driver*.py')))}.py"
    path.write_text(text)
    return [sys.executable, str(path), *args]


def _wait_for(path: Path, job: Job, slurm, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert slurm.job_state(job.id) in ("PENDING", "RUNNING", "CONFIGURING"), job.text()[-3000:]
        assert time.monotonic() < deadline, job.text()[-3000:]
        time.sleep(0.2)


# --- the script, under real Slurm ------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_a_two_node_job_sees_both_nodes_then_completes(slurm, submit, tmp_path: Path) -> None:
    submitted = time.monotonic()
    job = submit(_script(tmp_path, DRIVER), "--cpus-per-node", "3")
    assert slurm.wait_job(job.id, 150) == "COMPLETED", job.text()[-3000:]
    print(f"\nthe 2-node job: submitted to COMPLETED in {time.monotonic() - submitted:.1f} s")
    assert slurm.exit_code(job.id) == "0:0"
    text = job.text()
    assert "ranks [(0, '0'), (1, '1')]" in text
    # The GPUs the config simulates on each node, and the CPUs the job asked Slurm for.
    assert "resources {'CPU': 6.0, 'GPU': 8.0}" in text
    assert "the driver exited with status 0" in text
    status = CliRunner().invoke(app, ["slurm", "status", job.id], env=slurm.env)
    assert status.exit_code == 0, status.output
    assert f"job {job.id}: COMPLETED on n[1-2]; log: {job.output}" in status.stdout
    assert "all 2 node(s) are in" in status.stdout and "the driver exited with status 0" in status.stdout
    assert not re.search(r"head: \S+ \(127\.", text), "the head's address must not be loopback"
    _assert_nothing_left(job)
    _assert_ray_got_sigterm(job)  # the teardown reached Ray through Slurm, not srun's SIGKILL


@pytest.mark.timeout(180)
def test_without_cpus_per_node_ray_takes_the_cpus_slurm_allocated(slurm, submit, tmp_path: Path) -> None:
    job = submit(_script(tmp_path, DRIVER, "3"))
    assert slurm.wait_job(job.id, 150) == "FAILED", job.text()[-3000:]
    assert slurm.exit_code(job.id) == "3:0"  # the driver's status is the job's
    # One CPU per node by default, not the host's: Ray advertises what Slurm gave.
    assert "resources {'CPU': 2.0, 'GPU': 8.0}" in job.text()
    _assert_nothing_left(job)


@pytest.mark.timeout(180)
def test_a_node_whose_ray_dies_ends_the_job_naming_it(slurm, submit, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    job = submit(_script(tmp_path, WAITING_DRIVER, str(ready)))
    _wait_for(ready, job, slurm, 150)
    running = _leftovers(job.temp_dir)
    raylets = [pid for pid, cmdline in running.items() if "/raylet " in cmdline and "/node1/" in cmdline]
    assert len(raylets) == 1, running
    os.kill(raylets[0], signal.SIGKILL)  # node 1's Ray is gone
    assert slurm.wait_job(job.id, 90) == "FAILED", job.text()[-3000:]
    assert "node 1 (n2): Ray exited" in job.text()
    _assert_nothing_left(job)


@pytest.mark.timeout(180)
def test_scancel_stops_ray_by_sigterm_within_killwait_quietly(slurm, submit, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    job = submit(_script(tmp_path, WAITING_DRIVER, str(ready)))
    _wait_for(ready, job, slurm, 150)
    cancelled = time.monotonic()
    slurm.run("scancel", job.id)
    assert slurm.wait_job(job.id, 60) == "CANCELLED"
    _assert_nothing_left(job, timeout_s=slurm_cluster.KILL_WAIT_S)
    took = time.monotonic() - cancelled
    print(f"\nscancel -> the job and all its processes gone in {took:.1f} s")
    text = job.text()
    assert took < slurm_cluster.KILL_WAIT_S, f"{took:.1f} s: Slurm had to SIGKILL\n{text[-3000:]}"
    assert slurm.exit_code(job.id) != "0:9", text[-3000:]  # the script was not SIGKILLed
    assert "driver: stopped by SIGTERM" in text and "[rlinfra-slurm" in text and "terminated" in text
    assert "Traceback" not in text and "Aborted" not in text and "SIGTERM received" not in text, text[-3000:]
    _assert_ray_got_sigterm(job)


@pytest.mark.timeout(400)
def test_the_ppo_job_runs_on_a_two_node_allocation_as_planned(slurm, submit, tmp_path: Path) -> None:
    config = ROOT / "examples" / "ppo_cartpole" / "disaggregated.yaml"
    out = tmp_path / "ppo"
    rlinfra = str(Path(sys.executable).with_name("rlinfra"))
    job = submit(
        [rlinfra, "run", str(config), f"run.output_dir={out}"], "--cpus-per-node", "4", config=config
    )
    assert slurm.wait_job(job.id, 360) == "COMPLETED", job.text()[-3000:]
    text = job.text()
    assert "using that cluster (cluster.simulate is its shape)" in text
    assert "reached mean return 475" in text, text[-3000:]
    planned = CliRunner().invoke(app, ["plan", str(config), "--json"])
    plan = json.loads(planned.output)["components"]
    placed = json.loads((out / "placement.json").read_text())["components"]
    assert placed == {name: plan[name]["placements"] for name in placed}  # rank → node and devices
    _assert_nothing_left(job)


@pytest.mark.timeout(120)
def test_a_head_that_cannot_start_fails_fast(slurm, submit) -> None:
    job = submit(["true"], nodes=1, RLINFRA_SLURM_HEAD_ARGS="--no-such-option")
    assert slurm.wait_job(job.id, 90) == "FAILED"
    assert "node 0 (n1, head): Ray exited" in job.text()
    _assert_nothing_left(job)


def test_the_head_address_is_never_loopback_when_another_is_known() -> None:
    """The resolver, with the answers a Debian host gives (hostname → 127.0.1.1)."""
    debian = [lambda: ["127.0.1.1"], lambda: ["127.0.1.1", "10.2.3.4"]]
    assert node_address(debian) == "10.2.3.4"
    assert node_address([lambda: ["10.9.9.9"], lambda: ["127.0.1.1"]]) == "10.9.9.9"
    assert node_address([lambda: [], lambda: ["127.0.1.1"]]) is None
    nodes_need_one = subprocess.run(
        [sys.executable, "-c", "from rlinfra.ops.slurm import print_node_address as p; p(['2'])"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert nodes_need_one.returncode == 0 and not nodes_need_one.stdout.startswith("127.")


# --- rendering -------------------------------------------------------------------------------------


def test_render_directives_and_driver_quoting() -> None:
    job = SlurmJob(
        num_nodes=4,
        driver=("python", "main.py", "--name", "it's"),
        job_name="ppo",
        gpus_per_node=8,
        cpus_per_node=64,
        partition="gpu",
        time="2-00:00:00",
        sbatch_options=("account=rl", "--exclusive"),
        setup=("source .venv/bin/activate",),
    )
    script = render_sbatch(job)
    for line in (
        "#SBATCH --job-name=ppo",
        "#SBATCH --nodes=4",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --cpus-per-task=64",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=2-00:00:00",
        "#SBATCH --account=rl",
        "#SBATCH --exclusive",
        "source .venv/bin/activate",
        "num_nodes=4",
        "gpus_per_node=8",
        "cpus_per_node=64",
        """driver=(python main.py --name 'it'"'"'s')""",
    ):
        assert line in script.splitlines(), line
    assert "@@" not in script
    assert subprocess.run(["bash", "-n"], input=script, text=True, check=False).returncode == 0


def test_gpus_per_node_come_from_the_option_or_cluster_simulate() -> None:
    assert job_from_config({"num_nodes": 2, "simulate": "2x8"}, ["d"]).gpus_per_node == 8
    assert job_from_config({"num_nodes": 2, "simulate": "2x8"}, ["d"], gpus_per_node=4).gpus_per_node == 4
    unknown = job_from_config({"num_nodes": 2}, ["d"])
    assert unknown.gpus_per_node is None
    assert "#SBATCH --gpus-per-node" not in render_sbatch(unknown)
    assert "gpus_per_node=auto" in render_sbatch(unknown)
    with pytest.raises(SlurmError, match="different GPU counts"):
        job_from_config({"num_nodes": 2, "simulate": "8,4"}, ["d"])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"driver": ()}, "no driver command"),
        ({"time": "soon"}, "--time 'soon'"),
        ({"job_name": "a b"}, "job name"),
        ({"partition": "gpu\n#SBATCH --x"}, "line break"),
        ({"num_nodes": 0}, "at least 1"),
        ({"cpus_per_node": 0}, "--cpus-per-node 0"),
    ],
)
def test_render_refuses_what_would_break_the_script(options: dict, message: str) -> None:
    fields = {"num_nodes": 2, "driver": ("python", "main.py"), **options}
    with pytest.raises(SlurmError, match=message):
        SlurmJob(**fields)


def test_cli_writes_an_executable_script_and_reports_errors(tmp_path: Path) -> None:
    config = tmp_path / "ppo.yaml"
    config.write_text(CONFIG.format(nodes=2, gpus=1))
    out = tmp_path / "job.sbatch"
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "slurm",
            "render",
            str(config),
            "-o",
            str(out),
            "-p",
            "gpu",
            "-t",
            "4:00:00",
            "--",
            "python",
            "m.py",
        ],
    )
    assert result.exit_code == 0, result.output
    assert out.stat().st_mode & stat.S_IXUSR
    text = out.read_text()
    assert "#SBATCH --job-name=ppo" in text and "#SBATCH --gpus-per-node=1" in text
    printed = runner.invoke(app, ["slurm", "render", str(config), "--", "python", "m.py"])
    assert printed.exit_code == 0 and printed.stdout.startswith("#!/bin/bash")

    bad_time = runner.invoke(app, ["slurm", "render", str(config), "-t", "later", "--", "python"])
    assert bad_time.exit_code == 2 and "--time 'later'" in bad_time.stderr
    assert "Traceback" not in bad_time.output
    missing = runner.invoke(app, ["slurm", "render", str(tmp_path / "none.yaml"), "--", "python"])
    assert missing.exit_code == 2 and "no such file" in missing.stderr


def test_status_of_an_unknown_job_is_a_clear_error(slurm) -> None:
    shown = CliRunner().invoke(app, ["slurm", "status", "999999"], env=slurm.env)
    assert shown.exit_code == 2 and "scontrol show job 999999 failed" in shown.stderr
    assert "Traceback" not in shown.output
