"""What a worker process is started with: ``python_interpreter_path``.

Ray starts a Python worker as ``bash -c "exec <py_executable> default_worker.py …"``
(``RuntimeEnvContext.exec_worker``, Ray 2.60), so ``py_executable`` is a shell command, and a
per-actor ``runtime_env={"py_executable": …}`` starts that actor in a process of its own under it.
rlinfra uses exactly that: the interpreter of the node group's ``env_configs`` entry covering the
worker's node. Nothing else goes into the runtime_env: Ray records it in plain text, and
environment variables are set inside the process (``rlinfra.runtime.env``).

A bad ``py_executable`` is no error to Ray: bash says "No such file or directory" in the raylet's
log, the raylet waits ``worker_register_timeout_seconds`` (60 s) and starts it again, forever,
while the actor stays pending (measured: ``ray.get`` still waiting after 170 s). So before any
actor starts, ``worker_runtime_envs`` runs one small task per node and interpreter, pinned to the
node, that starts the interpreter the way Ray will — the same ``exec`` line, with a probe script in
place of ``default_worker.py`` — and names what is wrong within seconds: an interpreter that is
missing or not executable, without Ray, or with another Python or Ray version than the node's Ray
workers.
"""

import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import ray
from ray.exceptions import RayError

from rlinfra.placement.cluster_spec import ClusterSpec
from rlinfra.placement.record import Placement
from rlinfra.runtime.cluster import Cluster
from rlinfra.runtime.errors import RankFailure, WorkerGroupError
from rlinfra.runtime.stacks import run_on_node

PROBE_TIMEOUT_S = 60.0  # one probe command; an interpreter that hangs at start-up fails here
SCHEDULE_SLACK_S = 30.0  # on top of it: starting the task's own worker process on the node
CHECK_ACTION = "checking the worker's interpreter"

# Run as Ray runs default_worker.py: it reports the versions Ray needs to match.
_PROBE_SCRIPT = """\
import json, sys
import ray
with open(sys.argv[1], "w") as out:
    json.dump({"python": list(sys.version_info[:2]), "ray": ray.__version__}, out)
"""


@dataclass(frozen=True)
class WorkerExecutable:
    """How one worker process on node ``node_rank`` is started (one probe checks each):
    ``interpreter`` is its node group's ``python_interpreter_path``."""

    node_rank: int
    interpreter: str

    @property
    def command(self) -> str:
        """The ``py_executable``: the interpreter, quoted (Ray pastes it into a shell line)."""
        return shlex.quote(self.interpreter)


def worker_executable(placement: Placement, spec: ClusterSpec) -> WorkerExecutable | None:
    """What the worker at ``placement`` is started with, or None when Ray's default applies."""
    group = spec.node_groups.get(placement.node_group_label)
    interpreter = group.interpreter_on(placement.cluster_node_rank) if group is not None else None
    return None if interpreter is None else WorkerExecutable(placement.cluster_node_rank, interpreter)


def worker_runtime_envs(
    cluster: Cluster, group_name: str, placements: Sequence[Placement]
) -> list[dict[str, str] | None]:
    """One runtime_env (or None) per placement, after checking every interpreter on its node; one
    that cannot start a worker raises ``WorkerGroupError`` naming ranks, nodes and why."""
    executables = [worker_executable(placement, cluster.spec) for placement in placements]
    needed = {executable for executable in executables if executable is not None}
    if not needed:
        return [None] * len(placements)
    problems = _probe_nodes(cluster, needed)
    failures = {
        p.rank: RankFailure(p.rank, p.cluster_node_rank, problems[e] or "")
        for p, e in zip(placements, executables, strict=True)
        if e is not None and problems[e]
    }
    if failures:
        raise WorkerGroupError(group_name, CHECK_ACTION, failures)
    return [None if e is None else {"py_executable": e.command} for e in executables]


# ------------------------------------------------------------------------------ the node check


def _probe_nodes(cluster: Cluster, needed: set[WorkerExecutable]) -> dict[WorkerExecutable, str | None]:
    """Run every probe at once, each pinned to its node, and wait for all with one deadline."""
    refs = {key: run_on_node(cluster.node(key.node_rank).node_id, probe_command, key) for key in needed}
    limit = PROBE_TIMEOUT_S + SCHEDULE_SLACK_S
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=limit)
    return {key: _result(ref, ref in ready, key.node_rank, limit) for key, ref in refs.items()}


def _result(ref: ray.ObjectRef, ready: bool, node_rank: int, limit: float) -> str | None:
    if not ready:
        ray.cancel(ref, force=True)
        return f"the interpreter check on node {node_rank} did not finish within {limit:.0f} s"
    try:
        return ray.get(ref)
    except RayError as error:  # the node died, or the task's worker could not start
        return f"the interpreter check could not run on node {node_rank}: {error}"


def probe_command(executable: WorkerExecutable) -> str | None:
    """On the node: why ``executable`` cannot start a Python that runs a Ray worker, or None. Runs
    inside a default Ray worker there, whose environment is the one Ray starts workers with."""
    path, node_rank = executable.interpreter, executable.node_rank
    shown = f"python_interpreter_path {path!r}"
    if not os.path.isfile(path):
        return f"{shown} does not exist on node {node_rank}"
    if not os.access(path, os.X_OK):
        return f"{shown} is not executable on node {node_rank}"
    with tempfile.TemporaryDirectory(prefix="rlinfra-probe-") as scratch:
        script, report = Path(scratch) / "probe.py", Path(scratch) / "probe.json"
        script.write_text(_PROBE_SCRIPT)
        line = f"exec {executable.command} {shlex.quote(str(script))} {shlex.quote(str(report))}"
        try:
            done = subprocess.run(
                ["bash", "-c", line], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            return f"{shown} did not start a Python within {PROBE_TIMEOUT_S:.0f} s on node {node_rank}"
        if done.returncode != 0 or not report.exists():
            tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-4:])
            return f"{shown} failed on node {node_rank} (exit status {done.returncode}): {tail}"
        found = json.loads(report.read_text())
    # Ray refuses workers of another Ray version and cannot unpickle across Python versions.
    python, wanted = ".".join(map(str, found["python"])), ".".join(map(str, sys.version_info[:2]))
    if found["ray"] == ray.__version__ and python == wanted:
        return None
    return (
        f"{shown} runs Python {python} with Ray {found['ray']} on node {node_rank}; Ray's workers "
        f"there run Python {wanted} with Ray {ray.__version__}"
    )
