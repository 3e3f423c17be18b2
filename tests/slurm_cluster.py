"""A real Slurm cluster on this host for the tests: munged, slurmctld and two slurmd (``n1``,
``n2``), each node with 4 CPUs and 4 fake GPUs, everything under one temporary folder.

No systemd and no cgroups (``proctrack/linuxproc``, ``task/none``); each slurmd has its own port
and spool; a GPU is a GRES whose ``File=`` is a symlink to ``/dev/null`` (a count-only GRES line
makes the nodes INVAL). munged refuses a socket folder that is not ``o+x`` all the way up, so the
folder is made under the system temp dir, not pytest's 0700 ``tmp_path``. ``stop`` ends every
daemon by its PID and removes the folder. Needs Debian's ``slurmctld slurmd slurm-client munge``
and root (``make test`` installs them where it can).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.ports import free_ports

DAEMONS = ("munged", "slurmctld", "slurmd")
NODES = ("n1", "n2")
CPUS_PER_NODE = 4  # more than the host has: slurmd takes the config's word (config_overrides)
GPUS_PER_NODE = 4  # fake: GRES files that are symlinks to /dev/null
KILL_WAIT_S = 10
START_TIMEOUT_S = 60.0


def missing() -> str | None:
    """Why a real Slurm cannot start here, or None when it can."""
    absent = [name for name in (*DAEMONS, "sbatch", "scontrol", "squeue") if shutil.which(name) is None]
    if absent:
        packages = "slurmctld slurmd slurm-client munge"
        return f"Slurm is not installed ({', '.join(absent)} missing): apt-get install {packages}"
    if os.geteuid() != 0:
        return "the test Slurm cluster runs its daemons as root"
    return None


@dataclass
class SlurmCluster:
    root: Path
    env: dict[str, str]
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def run(self, *command: str, timeout: float = 30.0, check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster."""
        done = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip()}")
        return done

    def job_state(self, job_id: str) -> str:
        """The job's state (``COMPLETED``, ``FAILED`` …) as slurmctld reports it."""
        shown = self.run("scontrol", "show", "job", job_id, check=False).stdout
        for word in shown.split():
            if word.startswith("JobState="):
                return word.split("=", 1)[1]
        return "GONE" if not shown else "UNKNOWN"

    def wait_job(self, job_id: str, timeout_s: float) -> str:
        """Poll until the job leaves PENDING/RUNNING/COMPLETING; its final state."""
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.job_state(job_id)
            if state not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "UNKNOWN"):
                return state
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} still {state} after {timeout_s:g} s")
            time.sleep(0.3)

    def exit_code(self, job_id: str) -> str:
        shown = self.run("scontrol", "show", "job", job_id).stdout
        return next(word.split("=", 1)[1] for word in shown.split() if word.startswith("ExitCode="))

    def stop(self) -> None:
        for pid in reversed(list(self.pids.values())):
            with _suppress():
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            with _suppress():
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, *rest: object) -> bool:
        return kind is not None and issubclass(kind, ProcessLookupError)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of ours counts as gone
        waited, _ = os.waitpid(pid, os.WNOHANG)
        return waited == 0
    except ChildProcessError:
        return True


def _config(root: Path, host: str, ctld_port: int, node_ports: list[int]) -> str:
    nodes = "\n".join(
        f"NodeName={name} NodeHostname={host} Port={port} CPUs={CPUS_PER_NODE} "
        f"Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN"
        for name, port in zip(NODES, node_ports, strict=True)
    )
    return f"""\
ClusterName=rlinfra-test
SlurmctldHost={host}
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge/munge.socket.2
CryptoType=crypto/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
GresTypes=gpu
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
KillWait={KILL_WAIT_S}
SchedulerParameters=defer
JobAcctGatherType=jobacct_gather/none
{nodes}
PartitionName=test Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""


def start() -> SlurmCluster:
    """Start munged, slurmctld and the two slurmd; return once both nodes are idle."""
    root = Path(tempfile.mkdtemp(prefix="rls"))
    root.chmod(0o755)
    for sub in ("munge", "state", "spool/n1", "spool/n2"):
        (root / sub).mkdir(parents=True)
    (root / "munge").chmod(0o755)
    host = socket.gethostname()
    ctld_port, *node_ports = free_ports(1 + len(NODES))
    (root / "slurm.conf").write_text(_config(root, host, ctld_port, node_ports))
    last = GPUS_PER_NODE - 1
    gres = "".join(f"NodeName={name} Name=gpu File={root}/gpu-{name}-[0-{last}]\n" for name in NODES)
    (root / "gres.conf").write_text(gres)
    for name in NODES:
        for index in range(GPUS_PER_NODE):
            (root / f"gpu-{name}-{index}").symlink_to("/dev/null")
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
    cluster = SlurmCluster(root, env)
    try:
        files = {"pid": "munged.pid", "log": "munged.log", "seed": "munged.seed"}
        munged = ["munged", "--force", f"--socket={root}/munge/munge.socket.2", f"--key-file={key}"]
        _daemon(cluster, "munged", munged + [f"--{kind}-file={root}/{name}" for kind, name in files.items()])
        _daemon(cluster, "slurmctld", ["slurmctld", "-D", "-i"])
        for name in NODES:
            _daemon(cluster, f"slurmd {name}", ["slurmd", "-D", "-N", name])
        _wait_idle(cluster)
    except BaseException as error:
        logs = "".join(f"\n--- {log.name}\n{log.read_text()[-1500:]}" for log in sorted(root.glob("*.log*")))
        logs += "".join(f"\n--- {out.name}\n{out.read_text()[-800:]}" for out in sorted(root.glob("*.out")))
        cluster.stop()
        raise RuntimeError(f"{error}{logs}") from None
    return cluster


def _daemon(cluster: SlurmCluster, name: str, command: list[str]) -> None:
    log = (cluster.root / f"{name.replace(' ', '-')}.out").open("w")
    process = subprocess.Popen(command, env=cluster.env, stdout=log, stderr=subprocess.STDOUT)
    cluster.pids[name] = process.pid
    if name == "munged":  # it forks into the background; wait for its socket
        process.wait(timeout=10)
        _wait(lambda: (cluster.root / "munge" / "munge.socket.2").exists(), "munged's socket")
        cluster.pids[name] = int((cluster.root / "munged.pid").read_text())


def _wait_idle(cluster: SlurmCluster) -> None:
    def idle() -> bool:
        done = cluster.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
        states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
        return all(states.get(name) == "idle" for name in NODES)

    _wait(idle, "both slurmd nodes idle")


def _wait(ready: object, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise RuntimeError(f"test Slurm: no {what} within {START_TIMEOUT_S:g} s")
        time.sleep(0.1)
