"""``rlinfra slurm render`` and the sbatch script it writes, run for real on this machine.

The script runs with stub ``srun`` and ``scontrol`` on PATH: ``scontrol show hostnames`` names
two nodes, and ``srun`` runs its command here as its own job step (a process group that, as in
Slurm, dies as a whole when srun is signalled or its command exits). So the script starts real
Ray processes — a head and a worker on this machine, each with its own temp dir and ports — and
the tests check what it must do: a driver that sees both nodes with their rank labels, a node
that dies or a driver that fails ending the allocation, and no process left behind in any case.
"""

from __future__ import annotations

import contextlib
import os
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
from rlinfra.services.slurm import SlurmError, SlurmJob, job_from_config, render_sbatch
from tests.ports import free_ports

STUB_SRUN = r"""#!/bin/bash
# Stub srun: drop the options (the script passes them as --name=value), run the command here as
# its own job step, and end the whole step when srun is signalled or the command exits.
while [[ $# -gt 0 && $1 == -* ]]; do shift; done
setsid "$@" &
step=$!
[[ -n ${STUB_STEPS_LOG:-} ]] && echo "$step $*" >> "$STUB_STEPS_LOG"
stop() {
    kill -TERM "$step" 2>/dev/null
    kill -TERM -- "-$step" 2>/dev/null
    for _ in $(seq 30); do kill -0 -- "-$step" 2>/dev/null || return 0; sleep 0.1; done
    kill -KILL -- "-$step" 2>/dev/null
}
trap 'stop; exit 143' TERM INT
wait "$step"
status=$?
stop
exit "$status"
"""
STUB_SCONTROL = r"""#!/bin/bash
[[ $1 == show && $2 == hostnames ]] || { echo "stub scontrol: unsupported: $*" >&2; exit 2; }
printf '%s\n' ${STUB_HOSTS:-node0 node1}
"""
DRIVER = """\
import os, sys, time
import ray
from rlinfra.runtime.discovery import rank_nodes

ray.init(address=os.environ["RAY_ADDRESS"], logging_level="error")
nodes = rank_nodes(ray.nodes())
print("ranks", [(node.rank, node.labels.get("rlinfra-node-rank")) for node in nodes], flush=True)
assert [node.labels.get("rlinfra-node-rank") for node in nodes] == ["0", "1"], nodes
assert ray.cluster_resources().get("GPU") == 2.0, ray.cluster_resources()
print("OK", flush=True)
if len(sys.argv) > 1:  # wait to be killed (the node-failure test)
    open(sys.argv[1], "w").close()
    time.sleep(120)
"""
CONFIG = """\
cluster:
  num_nodes: {nodes}
  simulate: {nodes}x1
  component_placement:
    actor: all
"""


@dataclass
class Run:
    process: subprocess.Popen
    output: Path
    steps_log: Path

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def step_groups(self) -> dict[int, str]:
        """Process group → command of every step the stub srun started."""
        if not self.steps_log.exists():
            return {}
        steps = {}
        for line in self.steps_log.read_text().splitlines():
            pid, _, command = line.partition(" ")
            steps[int(pid)] = command
        return steps


def _processes_in_groups(groups: set[int]) -> list[str]:
    """``"PID (NAME)"`` of every live process whose process group is in ``groups``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        state, pgid = fields[0], int(fields[2])
        if pgid in groups and state != "Z":
            found.append(f"{entry.name} ({name})")
    return found


def _assert_all_gone(run: Run, timeout_s: float = 15.0) -> None:
    """Nothing of the script or its steps is left; whatever is, is killed (then the test fails)."""
    groups = {run.process.pid, *run.step_groups()}
    deadline = time.monotonic() + timeout_s
    while (left := _processes_in_groups(groups)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    assert not left, f"left behind: {left}\n{run.text()[-3000:]}"


@pytest.fixture
def stubs(tmp_path: Path) -> Path:
    directory = tmp_path / "bin"
    directory.mkdir()
    for name, text in (("srun", STUB_SRUN), ("scontrol", STUB_SCONTROL)):
        (directory / name).write_text(text)
        (directory / name).chmod(0o755)
    return directory


@pytest.fixture
def launch(tmp_path: Path, stubs: Path) -> Iterator:
    """Render a script for ``nodes`` nodes and start it as Slurm would (its own session)."""
    runs: list[Run] = []
    temp_dirs: list[str] = []

    def start(nodes: int, driver: list[str], **env_overrides: str) -> Run:
        config = tmp_path / f"conf{nodes}.yaml"
        config.write_text(CONFIG.format(nodes=nodes))
        script = tmp_path / f"job{nodes}.sbatch"
        rendered = CliRunner().invoke(app, ["slurm", "render", str(config), "-o", str(script), "--", *driver])
        assert rendered.exit_code == 0, rendered.output
        temp_dir = tempfile.mkdtemp(prefix="rljs")  # short: Ray's socket paths must fit in 107 bytes
        temp_dirs.append(temp_dir)
        gcs, client, head_agent, worker_agent = free_ports(4)
        env = {key: value for key, value in os.environ.items() if not key.startswith(("RAY_", "SLURM_"))}
        env.update(
            PATH=f"{stubs}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
            SLURM_JOB_NODELIST=f"node[0-{nodes - 1}]",
            STUB_HOSTS=" ".join(f"node{rank}" for rank in range(nodes)),
            STUB_STEPS_LOG=str(tmp_path / "steps.log"),
            RLINFRA_SLURM_NODE_IP="127.0.0.1",
            RLINFRA_SLURM_TEMP_DIR=temp_dir,
            RLINFRA_SLURM_PORT=str(gcs),
            RLINFRA_SLURM_HEAD_ARGS=(
                f"--include-dashboard=false --ray-client-server-port={client} "
                f"--dashboard-agent-listen-port={head_agent} --num-cpus=1"
            ),
            RLINFRA_SLURM_WORKER_ARGS=f"--dashboard-agent-listen-port={worker_agent} --num-cpus=1",
            RLINFRA_SLURM_NODE_TIMEOUT="90",
            RLINFRA_SLURM_STOP_GRACE="8",
        )
        env.update(env_overrides)
        output = tmp_path / "run.out"
        with output.open("w") as out:
            process = subprocess.Popen(
                ["bash", str(script)], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        run = Run(process, output, tmp_path / "steps.log")
        runs.append(run)
        return run

    yield start
    for run in runs:  # a failed test must not leave Ray running either
        if run.process.poll() is None:
            os.killpg(run.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.process.wait(timeout=20)
        for group in {run.process.pid, *run.step_groups()}:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
    for temp_dir in temp_dirs:
        shutil.rmtree(temp_dir, ignore_errors=True)


def _wait(run: Run, timeout_s: float) -> int:
    try:
        return run.process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the script did not end within {timeout_s:g} s:\n{run.text()[-3000:]}")


# --- the script, run -------------------------------------------------------------------------------


@pytest.mark.timeout(150)
def test_driver_sees_every_node_then_everything_stops(launch, tmp_path: Path) -> None:
    driver_file = tmp_path / "driver.py"
    driver_file.write_text(DRIVER)
    run = launch(2, [sys.executable, str(driver_file)])
    assert _wait(run, 120) == 0, run.text()[-3000:]
    text = run.text()
    assert "ranks [(0, '0'), (1, '1')]" in text and "OK" in text
    assert "the driver exited with status 0" in text
    steps = run.step_groups()
    assert len(steps) == 2 and any("--head" in command for command in steps.values())
    _assert_all_gone(run)


@pytest.mark.timeout(150)
def test_a_dead_node_ends_the_allocation(launch, tmp_path: Path) -> None:
    driver_file = tmp_path / "driver.py"
    driver_file.write_text(DRIVER)
    ready = tmp_path / "ready"
    run = launch(2, [sys.executable, str(driver_file), str(ready)])
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert run.process.poll() is None, run.text()[-3000:]
        assert time.monotonic() < deadline, run.text()[-3000:]
        time.sleep(0.2)
    (worker,) = [group for group, command in run.step_groups().items() if "rlinfra-node-rank=1" in command]
    os.killpg(worker, signal.SIGKILL)  # the node and all its Ray processes are gone at once
    status = _wait(run, 60)
    assert status != 0
    assert "node 1 (node1): Ray exited" in run.text()
    _assert_all_gone(run)


@pytest.mark.timeout(120)
def test_a_failing_driver_ends_the_allocation_with_its_status(launch) -> None:
    run = launch(1, [sys.executable, "-c", "import sys; sys.exit(3)"])
    assert _wait(run, 100) == 3, run.text()[-3000:]
    assert "the driver exited with status 3" in run.text()
    assert len(run.step_groups()) == 1
    _assert_all_gone(run)


@pytest.mark.timeout(60)
def test_a_head_that_cannot_start_fails_fast(launch) -> None:
    run = launch(1, ["true"], RLINFRA_SLURM_HEAD_ARGS="--no-such-option")
    assert _wait(run, 45) != 0
    assert "node 0 (node0, head): Ray exited" in run.text()
    _assert_all_gone(run)


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
    config.write_text(CONFIG.format(nodes=2))
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
