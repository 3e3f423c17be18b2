"""What a worker process is started with: ``python_interpreter_path`` and ``cluster.profiling``.

Ray starts a Python worker as ``bash -c "exec <py_executable> default_worker.py …"``
(``RuntimeEnvContext.exec_worker``, Ray 2.60), so ``py_executable`` is a shell command — it may
carry arguments — and a per-actor ``runtime_env={"py_executable": …}`` starts that actor in a
process of its own under it. rlinfra uses exactly that: the interpreter of the node group's
``env_configs`` entry covering the worker's node, wrapped by the profiler when the worker's group
is profiled (``ProfilingConfig.wrap``; without ``python_interpreter_path`` the profiler wraps the
interpreter Ray would have used on that node). Nothing else goes into the runtime_env: Ray records
it in plain text, and environment variables are set inside the process (``rlinfra.runtime.env``).

A bad ``py_executable`` is no error to Ray: bash says "No such file or directory" in the raylet's
log, the raylet waits ``worker_register_timeout_seconds`` (60 s) and starts it again, forever,
while the actor stays pending (measured: ``ray.get`` still waiting after 170 s). So before any
actor starts, ``worker_runtime_envs`` runs one small task per node and command, pinned to the
node, that starts the command the way Ray will — the same ``exec`` line, with a probe script in
place of ``default_worker.py`` — and names what is wrong within seconds: an interpreter that is
missing or not executable, a profiler missing from the node's PATH or refusing its options, an
output directory that cannot be created, an interpreter without Ray or with another Python or
Ray version than the node's Ray workers.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import ray
from ray.exceptions import RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlinfra.placement.cluster_spec import ClusterSpec
from rlinfra.placement.profiling import ProfilingConfig
from rlinfra.placement.record import Placement
from rlinfra.runtime.cluster import Cluster
from rlinfra.runtime.errors import RankFailure, WorkerGroupError

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
    """How one worker process is started on node ``node_rank`` (one probe checks each):
    ``interpreter`` is the node group's ``python_interpreter_path`` (None: the node's own),
    ``profiling`` is set when the worker's group is profiled."""

    node_rank: int
    interpreter: str | None
    profiling: ProfilingConfig | None

    def command(self, node_python: str, report_prefix: str = "") -> str:
        """The ``py_executable``: the interpreter (``node_python`` when none is configured),
        quoted, under the profiler writing to ``report_prefix`` when profiled."""
        python = self.interpreter or node_python
        if self.profiling is None:
            return shlex.quote(python)
        return shlex.join(self.profiling.wrap(python, report_prefix))


def worker_executable(
    placement: Placement, spec: ClusterSpec, group_name: str, profiling: ProfilingConfig | None
) -> WorkerExecutable | None:
    """What the worker at ``placement`` is started with, or None when Ray's default applies."""
    group = spec.node_groups.get(placement.node_group_label)
    interpreter = group.interpreter_on(placement.cluster_node_rank) if group is not None else None
    profiled = profiling if profiling is not None and profiling.profiles(group_name) else None
    if interpreter is None and profiled is None:
        return None
    return WorkerExecutable(placement.cluster_node_rank, interpreter, profiled)


def worker_runtime_env(
    placement: Placement, executable: WorkerExecutable, group_name: str, node_python: str
) -> dict[str, str]:
    """The actor's runtime_env: only ``py_executable``. ``node_python`` is the interpreter Ray's
    workers use on the node (what the profiler wraps without an interpreter)."""
    profiling = executable.profiling
    prefix = profiling.report_prefix(group_name, placement.rank) if profiling is not None else ""
    return {"py_executable": executable.command(node_python, prefix)}


def worker_runtime_envs(
    cluster: Cluster, group_name: str, placements: Sequence[Placement]
) -> list[dict[str, str] | None]:
    """One runtime_env (or None) per placement, after checking every command on its node; a
    command that cannot start a worker raises ``WorkerGroupError`` naming ranks, nodes and why."""
    profiling = cluster.config.profiling
    executables = [worker_executable(p, cluster.spec, group_name, profiling) for p in placements]
    needed = {executable for executable in executables if executable is not None}
    if not needed:
        return [None] * len(placements)
    probes = _probe_nodes(cluster, needed)
    failures = {
        p.rank: RankFailure(p.rank, p.cluster_node_rank, probes[e].problem or "")
        for p, e in zip(placements, executables, strict=True)
        if e is not None and probes[e].problem
    }
    if failures:
        raise WorkerGroupError(group_name, CHECK_ACTION, failures)
    return [
        worker_runtime_env(p, e, group_name, probes[e].python) if e is not None else None
        for p, e in zip(placements, executables, strict=True)
    ]


# ------------------------------------------------------------------------------ the node check


@dataclass(frozen=True)
class ProbeResult:
    """What a probe found on one node: the interpreter Ray's workers use there, and the problem
    with the command (None when it started a worker process as Ray will)."""

    python: str
    problem: str | None = None


def _probe_nodes(cluster: Cluster, needed: set[WorkerExecutable]) -> dict[WorkerExecutable, ProbeResult]:
    """Run every probe at once, each pinned to its node, and wait for all with one deadline."""
    probe = ray.remote(num_cpus=0, max_retries=0)(probe_command)
    refs: dict[WorkerExecutable, ray.ObjectRef] = {}
    for executable in needed:
        pinned = NodeAffinitySchedulingStrategy(cluster.node(executable.node_rank).node_id, soft=False)
        refs[executable] = probe.options(scheduling_strategy=pinned).remote(executable)
    limit = PROBE_TIMEOUT_S + SCHEDULE_SLACK_S
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=limit)
    return {key: _result(ref, ref in ready, key.node_rank, limit) for key, ref in refs.items()}


def _result(ref: ray.ObjectRef, ready: bool, node_rank: int, limit: float) -> ProbeResult:
    if not ready:
        ray.cancel(ref, force=True)
        return ProbeResult(
            "", f"the interpreter check on node {node_rank} did not finish within {limit:.0f} s"
        )
    try:
        return ray.get(ref)
    except RayError as error:  # the node died, or the task's worker could not start
        return ProbeResult("", f"the interpreter check could not run on node {node_rank}: {error}")


def probe_command(executable: WorkerExecutable) -> ProbeResult:
    """On the node: does ``executable`` start a Python that can run a Ray worker? Runs inside a
    default Ray worker there, whose environment is the one Ray starts workers with."""
    problem = _missing_parts(executable, executable.node_rank)
    if problem is None:
        with tempfile.TemporaryDirectory(prefix="rlinfra-probe-") as scratch:
            problem = _run_probe(executable, Path(scratch), executable.node_rank)
    return ProbeResult(sys.executable, problem)


def _missing_parts(executable: WorkerExecutable, node_rank: int) -> str | None:
    """A clear message for what would otherwise be a bare ``exec`` failure."""
    path = executable.interpreter
    if path is not None and not os.path.isfile(path):
        return f"python_interpreter_path {path!r} does not exist on node {node_rank}"
    if path is not None and not os.access(path, os.X_OK):
        return f"python_interpreter_path {path!r} is not executable on node {node_rank}"
    if executable.profiling is None:
        return None
    program = executable.profiling.program
    if program is not None and shutil.which(program) is None:
        return (
            f"{program!r} ({executable.profiling.backend} profiler) is not on the PATH of node "
            f"{node_rank} (the PATH its Ray node was started with)"
        )
    try:
        os.makedirs(executable.profiling.output_dir, exist_ok=True)
    except OSError as error:
        return f"profiling output_dir cannot be created on node {node_rank}: {error}"
    return None


def _run_probe(executable: WorkerExecutable, scratch: Path, node_rank: int) -> str | None:
    script, report = scratch / "probe.py", scratch / "probe.json"
    script.write_text(_PROBE_SCRIPT)
    command = executable.command(sys.executable, str(scratch / "probe_%p"))
    line = f"exec {command} {shlex.quote(str(script))} {shlex.quote(str(report))}"
    if executable.profiling is None:
        shown = f"python_interpreter_path {executable.interpreter!r}"
    else:
        shown = f"the profiled worker command {command!r}"
    try:
        done = subprocess.run(
            ["bash", "-c", line], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return f"{shown} did not start a Python within {PROBE_TIMEOUT_S:.0f} s on node {node_rank}"
    if done.returncode != 0 or not report.exists():
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-4:])
        return f"{shown} failed on node {node_rank} (exit status {done.returncode}): {tail}"
    return _version_mismatch(json.loads(report.read_text()), shown, node_rank)


def _version_mismatch(found: dict, shown: str, node_rank: int) -> str | None:
    """Ray refuses workers of another Ray version and cannot unpickle across Python versions."""
    python, wanted = tuple(found["python"]), sys.version_info[:2]
    if found["ray"] != ray.__version__ or python != wanted:
        return (
            f"{shown} runs Python {'.'.join(map(str, python))} with Ray {found['ray']} on node "
            f"{node_rank}; Ray's workers there run Python {'.'.join(map(str, wanted))} with Ray "
            f"{ray.__version__}"
        )
    return None
