"""An sbatch script that bootstraps one Ray cluster per Slurm allocation and runs the driver in it.

The script (``slurm_template.sh``, filled in here) starts the Ray head on the first node and
``ray start --block`` on every other node, each labelled ``rlinfra-node-rank=RANK`` in the order of
``scontrol show hostnames`` (the order ``rlinfra.runtime.discovery`` ranks nodes by), waits with
a deadline until all nodes are in, runs the driver on the first node, and tears everything down
when the driver or any node's Ray exits: a node that dies ends the allocation instead of leaving
a driver to hang at its next collective. It exits with the driver's status, or non-zero when a
node failed first. It needs bash ≥ 4.4 (``wait -n``) and Slurm's ``srun``/``scontrol``.

Token authentication stays on (``RAY_AUTH_MODE=token``), with a fresh token per allocation unless
the user brings one: Ray's GCS listens on every interface of the head.
"""

import ipaddress
import re
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from rlinfra.placement.config import parse_cluster_config

DEFAULT_PORT = 6379
DEFAULT_NODE_TIMEOUT_S = 600
TEMPLATE = "slurm_template.sh"
_JOB_NAME = re.compile(r"[A-Za-z0-9_.+-]+")
_TIME = re.compile(r"(\d+-)?\d+(:\d+){0,2}|UNLIMITED|INFINITE", re.IGNORECASE)
_NO_NEWLINES = re.compile(r"[\r\n]")


class SlurmError(ValueError):
    """Options or a config that cannot become a correct sbatch script."""


@dataclass(frozen=True)
class SlurmJob:
    """What goes into the script. ``gpus_per_node`` None lets Ray detect the node's GPUs (and asks
    Slurm for none); ``cpus_per_node`` becomes each node's ``--cpus-per-task`` and Ray's
    ``--num-cpus`` (without it a Slurm step may get a single CPU); ``sbatch_options`` are extra
    ``#SBATCH`` lines (``--account=rl``); ``setup`` lines run first on the first node
    (``module load …``, ``source .venv/bin/activate``) and, because srun exports the
    environment, shape every node's."""

    num_nodes: int
    driver: tuple[str, ...]
    job_name: str = "rlinfra"
    gpus_per_node: int | None = None
    cpus_per_node: int | None = None
    partition: str | None = None
    time: str | None = None
    sbatch_options: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    port: int = DEFAULT_PORT
    node_timeout_s: int = DEFAULT_NODE_TIMEOUT_S
    config_name: str = "a config"

    def __post_init__(self) -> None:
        if self.num_nodes < 1:
            raise SlurmError(f"num_nodes is {self.num_nodes}; expected at least 1")
        if not self.driver:
            raise SlurmError("no driver command: give it after `--`, e.g. -- python main.py conf.yaml")
        if not _JOB_NAME.fullmatch(self.job_name):
            raise SlurmError(f"job name {self.job_name!r}: use letters, digits and _.+- only")
        if self.gpus_per_node is not None and self.gpus_per_node < 0:
            raise SlurmError(f"--gpus-per-node {self.gpus_per_node}: expected a number ≥ 0")
        if self.cpus_per_node is not None and self.cpus_per_node < 1:
            raise SlurmError(f"--cpus-per-node {self.cpus_per_node}: expected a number ≥ 1")
        if self.time is not None and not _TIME.fullmatch(self.time):
            raise SlurmError(f"--time {self.time!r}: expected a Slurm time such as 30, 4:00:00 or 2-00:00:00")
        if not 1024 <= self.port <= 65535:
            raise SlurmError(f"--port {self.port}: expected 1024-65535")
        if self.node_timeout_s < 1:
            raise SlurmError(f"--node-timeout {self.node_timeout_s}: expected at least 1 second")
        for line in (self.partition or "", *self.sbatch_options, *self.setup, *self.driver, self.config_name):
            if _NO_NEWLINES.search(line):
                raise SlurmError(f"{line!r}: a line break would end the #SBATCH line or the command early")


def job_from_config(
    cluster_cfg: Any, driver: Sequence[str], *, gpus_per_node: int | None = None, **options: Any
) -> SlurmJob:
    """A ``SlurmJob`` for the config's ``cluster`` section: ``num_nodes`` nodes, and GPUs per node
    from ``gpus_per_node`` or else ``cluster.simulate`` (``"NxG"``; per-node counts must agree,
    since Slurm's ``--gpus-per-node`` is one number)."""
    config = parse_cluster_config(cluster_cfg)
    if gpus_per_node is None and config.simulate is not None:
        if len(set(config.simulate)) != 1:
            raise SlurmError(
                f"cluster.simulate gives different GPU counts per node ({list(config.simulate)}); sbatch "
                "asks for one number per node: pass --gpus-per-node"
            )
        gpus_per_node = config.simulate[0]
    return SlurmJob(num_nodes=config.num_nodes, driver=tuple(driver), gpus_per_node=gpus_per_node, **options)


def render_sbatch(job: SlurmJob, script_name: str = "job.sbatch") -> str:
    """The sbatch script for ``job`` (text; the caller writes it and makes it executable)."""
    chosen = {
        "job-name": job.job_name,
        "nodes": job.num_nodes,
        "ntasks-per-node": 1,
        "gpus-per-node": job.gpus_per_node,
        "cpus-per-task": job.cpus_per_node,
        "partition": job.partition,
        "time": job.time,
    }
    directives = [f"#SBATCH --{name}={value}" for name, value in chosen.items() if value]
    # ``account=rl`` and ``--account=rl`` both become ``--account=rl``.
    options = (option.strip() for option in job.sbatch_options)
    directives += [f"#SBATCH {option if option.startswith('-') else '--' + option}" for option in options]
    values: Mapping[str, str] = {
        "CONFIG": job.config_name,
        "SCRIPT_NAME": script_name,
        "SBATCH": "\n".join(directives),
        "SETUP": "\n".join(job.setup),
        "NUM_NODES": str(job.num_nodes),
        "GPUS_PER_NODE": "auto" if job.gpus_per_node is None else str(job.gpus_per_node),
        "CPUS_PER_NODE": "auto" if job.cpus_per_node is None else str(job.cpus_per_node),
        "DRIVER": " ".join(shlex.quote(word) for word in job.driver),
        "PORT": str(job.port),
        "NODE_TIMEOUT": str(job.node_timeout_s),
    }
    text = resources.files(__package__).joinpath(TEMPLATE).read_text(encoding="utf-8")
    return re.sub(r"@@([A-Z_]+)@@", lambda match: values[match.group(1)], text)


SLURM_TIMEOUT_S = 30.0  # for one sbatch or scontrol call


def _slurm(*command: str) -> str:
    """Run a Slurm client command; its stdout, or ``SlurmError`` with what it said."""
    if shutil.which(command[0]) is None:
        raise SlurmError(f"{command[0]} is not on PATH: run this where Slurm's client commands are installed")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=SLURM_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(command)}: no answer within {SLURM_TIMEOUT_S:g} s") from None
    if done.returncode != 0:
        raise SlurmError(f"{' '.join(command)} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


@dataclass(frozen=True)
class SlurmStatus:
    """A job as ``rlinfra slurm status`` shows it: Slurm's view, and the script's log lines
    about Ray (the head, the nodes that joined, the driver's end)."""

    job_id: str
    state: str
    nodes: str
    log: str
    ray: tuple[str, ...]


def submit(script: Path) -> tuple[str, str]:
    """``sbatch`` the script; the job id and the path of its log (Slurm's, ``%j`` resolved)."""
    job_id = _slurm("sbatch", "--parsable", str(script)).strip().split(";")[0]
    return job_id, job_status(job_id).log


def job_status(job_id: str) -> SlurmStatus:
    fields = dict(
        word.split("=", 1) for word in _slurm("scontrol", "show", "job", job_id).split() if "=" in word
    )
    log = fields.get("StdOut", "")
    try:
        lines = Path(log).read_text(errors="replace").splitlines() if log else []
    except OSError:  # on another node's disk, or not written yet
        lines = []
    ray = tuple(line.split("] ", 1)[1] for line in lines if line.startswith("[rlinfra-slurm"))
    return SlurmStatus(job_id, fields.get("JobState", "?"), fields.get("NodeList", "?"), log, ray)


# Any routable address: connecting a UDP socket sends nothing, but makes the kernel pick the
# source address of the route towards it (TEST-NET-1).
ROUTE_PROBE = ("192.0.2.1", 9)


def _routed_address() -> list[str]:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(ROUTE_PROBE)
            return [probe.getsockname()[0]]
    except OSError:
        return []


def _hostname_addresses() -> list[str]:
    try:
        return socket.gethostbyname_ex(socket.gethostname())[2]
    except OSError:
        return []


def node_address(
    sources: Iterable[Callable[[], list[str]]] = (_routed_address, _hostname_addresses),
) -> str | None:
    """This node's address as other nodes reach it: the first non-loopback address the
    ``sources`` give (the route's source address, then the hostname's addresses), else None.
    ``hostname --ip-address`` alone gives 127.0.1.1 on Debian hosts that map their name to it."""
    for source in sources:
        for address in source():
            if not ipaddress.ip_address(address).is_loopback:
                return address
    return None


def print_node_address(argv: Sequence[str] | None = None) -> None:
    """The script's head-address step (``python -c``, with the node count as argument): print
    ``node_address()``; with one node, fall back to loopback; else fail naming the problem."""
    nodes = int((argv or sys.argv[1:] or ["1"])[0])
    address = node_address()
    if address is None and nodes > 1:
        sys.exit(
            f"{socket.gethostname()}: no address other nodes could reach (only loopback); set "
            "RLINFRA_SLURM_NODE_IP, or map the hostname to the node's network address in /etc/hosts"
        )
    print(address or "127.0.0.1")
