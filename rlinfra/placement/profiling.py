"""``cluster.profiling`` (RLinf's schema): which worker groups run under a profiler, and how.

    profiling:
      backend: nsight                 # Nsight Systems, or rocprof_sys (ROCm Systems Profiler)
      enabled: true
      worker_groups: [actor, rollout] # group names, 'a,b', or 'all' (any case); null: none
      output_dir: /scratch/profiles   # absolute; default /tmp/rlinfra-profiles, on each node
      options: {t: "cuda,nvtx", capture-range: cudaProfilerApi}   # nsight: `nsys profile` options
      flags: [stats]                  # nsight: options without a value
      args: {F: "true"}               # rocprof_sys: options of `python -m rocprofsys`
      env: {ROCPROFSYS_SAMPLING_FREQ: "100"}   # rocprof_sys: its settings, set before it starts

Ray starts a worker as ``<py_executable> default_worker.py …``; ``ProfilingConfig.wrap`` gives the
``py_executable`` that runs the worker's interpreter under the profiler, one report per process:

    nsight:       nsys profile <flags> <options> -o <output_dir>/<group>_<rank>_%p <python>
    rocprof_sys:  env ROCPROFSYS_OUTPUT_PATH=<output_dir> ROCPROFSYS_OUTPUT_PREFIX=<group>_<rank>_%p
                      <env> <python> -m rocprofsys <args> --

Ray's own ``_nsight``/``_rocprof_sys`` runtime_env plugins honour less of the schema (Ray 2.60):
both replace the interpreter (``nsys profile … python`` from PATH; ``rocprof-sys-python``, which
picks its own), so ``python_interpreter_path`` could not be combined with them; ``_nsight`` has no
bare flags and writes under the Ray session's log directory by default. ``python -m rocprofsys``
is what ``rocprof-sys-python`` runs, in the interpreter the worker would have used anyway.

Refused at parse time, naming the key: unknown keys and backends, wrong types, relative paths
(each node would read them against another directory), ``steps`` (rlinfra does not run the
training loop, so it cannot open and close a capture window per step), an output path in
``options``/``env`` (the per-process report names above keep ranks from overwriting each other;
set ``output_dir``), and credential-like values (``py_executable`` is recorded by Ray in plain text).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from rlinfra.placement.config_access import (
    absolute_path,
    as_mapping,
    reject_unknown_keys,
    require_bool,
    require_key,
    require_list,
    require_str,
)
from rlinfra.placement.env_vars import ENV_NAME, refuse_credential
from rlinfra.placement.errors import PlacementError

NSIGHT = "nsight"
ROCPROF_SYS = "rocprof_sys"
BACKENDS = {NSIGHT: "Nsight Systems", ROCPROF_SYS: "ROCm Systems Profiler"}
ALL_GROUPS = "all"
DEFAULT_OUTPUT_DIR = "/tmp/rlinfra-profiles"

_COMMON_FIELDS = ("backend", "enabled", "worker_groups", "steps", "output_dir")
_BACKEND_FIELDS = {NSIGHT: ("options", "flags"), ROCPROF_SYS: ("args", "env")}
_NSIGHT_OUTPUT_OPTIONS = ("o", "output")
_ROCPROF_OUTPUT_ENV = ("ROCPROFSYS_OUTPUT_PATH", "ROCPROFSYS_OUTPUT_PREFIX")
_OPTION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_UNSAFE_IN_FILE_NAME = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True)
class ProfilingConfig:
    """``cluster.profiling``, checked. ``worker_groups`` as written (matched case-insensitively);
    ``options``/``args``/``env`` as (name, value) pairs in the order written, values as text."""

    backend: str
    enabled: bool = True
    worker_groups: tuple[str, ...] = ()
    output_dir: str = DEFAULT_OUTPUT_DIR
    options: tuple[tuple[str, str], ...] = ()
    flags: tuple[str, ...] = ()
    args: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    def profiles(self, group_name: str) -> bool:
        """Whether the processes of worker group ``group_name`` run under the profiler."""
        if not self.enabled:
            return False
        wanted = {name.lower() for name in self.worker_groups}
        return ALL_GROUPS in wanted or group_name.lower() in wanted

    @property
    def program(self) -> str | None:
        """The profiler's executable, found on the node's PATH (``rocprof_sys`` is a module of
        the interpreter instead)."""
        return "nsys" if self.backend == NSIGHT else None

    def report_prefix(self, group_name: str, rank: int) -> str:
        """Where rank ``rank`` of ``group_name`` writes its report (``%p``: the process id, so a
        restarted worker never overwrites the report of the one before)."""
        safe = _UNSAFE_IN_FILE_NAME.sub("_", group_name)
        return posixpath.join(self.output_dir, f"{safe}_{rank}_%p")

    def wrap(self, python: str, report_prefix: str) -> tuple[str, ...]:
        """The command that runs ``python`` (then the script and arguments Ray appends) under the
        profiler, writing its report to ``report_prefix``."""
        if self.backend == NSIGHT:
            flags = tuple(f"-{flag}" if len(flag) == 1 else f"--{flag}" for flag in self.flags)
            return ("nsys", "profile", *flags, *_cli_options(self.options), "-o", report_prefix, python)
        output = (
            f"ROCPROFSYS_OUTPUT_PATH={posixpath.dirname(report_prefix)}",
            f"ROCPROFSYS_OUTPUT_PREFIX={posixpath.basename(report_prefix)}",
        )
        settings = tuple(f"{name}={value}" for name, value in self.env)
        return ("env", *output, *settings, python, "-m", "rocprofsys", *_cli_options(self.args), "--")


def _cli_options(pairs: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    """``-x value`` for one-letter names, ``--name=value`` for the others (the profilers' syntax)."""
    tokens: list[str] = []
    for name, value in pairs:
        tokens.extend((f"-{name}", value) if len(name) == 1 else (f"--{name}={value}",))
    return tuple(tokens)


def parse_profiling(raw: Any, where: str = "cluster.profiling") -> ProfilingConfig | None:
    """``cluster.profiling`` checked and typed (a ``ProfilingConfig`` is returned as it is), or
    None when the section is absent. Every key is validated even with ``enabled: false``, so a
    typo does not wait for the day profiling is switched on."""
    if raw is None or isinstance(raw, ProfilingConfig):
        return raw
    section = as_mapping(raw, where)
    backend = _backend(section, where)
    reject_unknown_keys(section, _COMMON_FIELDS + _BACKEND_FIELDS[backend], where)
    _refuse_steps(section.get("steps"), backend, f"{where}.steps")
    output_dir = absolute_path(
        section.get("output_dir"),
        f"{where}.output_dir",
        expected="an absolute directory, valid on every node that runs a profiled worker",
    )
    config = ProfilingConfig(
        backend=backend,
        enabled=require_bool(section.get("enabled", True), f"{where}.enabled"),
        worker_groups=_worker_groups(section.get("worker_groups"), f"{where}.worker_groups"),
        output_dir=output_dir or DEFAULT_OUTPUT_DIR,
    )
    if backend == NSIGHT:
        return _with_nsight_fields(config, section, where)
    return _with_rocprof_fields(config, section, where)


def _backend(section: Mapping[str, Any], where: str) -> str:
    expected = " or ".join(f"{name!r} ({tool})" for name, tool in BACKENDS.items())
    backend = require_key(section, "backend", where, expected)
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise PlacementError(
            f"unknown profiling backend {backend!r}", where=f"{where}.backend", expected=expected
        )
    return backend


def _refuse_steps(steps: Any, backend: str, where: str) -> None:
    if steps is None:
        return
    workaround = (
        "; to capture only some steps, set options {capture-range: cudaProfilerApi} and call "
        "torch.cuda.profiler.start()/stop() around them in the worker"
        if backend == NSIGHT
        else ""
    )
    raise PlacementError(
        "steps cannot be honoured: rlinfra does not run the training loop, so it cannot open and "
        "close a capture window around given steps",
        where=where,
        expected=f"no steps (the whole process is profiled){workaround}",
    )


def _worker_groups(value: Any, where: str) -> tuple[str, ...]:
    """Group names: one string (commas separate several, as in ``component_placement``), or a list."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise PlacementError(
            f"expected worker group names, got {value!r}",
            where=where,
            expected="a name, 'actor,rollout', a list of names, or 'all'",
        )
    return tuple(require_str(item, f"{where}[{index}]") for index, item in enumerate(items))


def _with_nsight_fields(config: ProfilingConfig, section: Mapping[str, Any], where: str) -> ProfilingConfig:
    options = _named_values(section.get("options"), f"{where}.options", _OPTION_NAME, "an nsys option name")
    report = "output_dir: reports are named <output_dir>/<group>_<rank>_<pid>.nsys-rep"
    _refuse_report_paths(options, _NSIGHT_OUTPUT_OPTIONS, f"{where}.options", report)
    flags = _flags(section.get("flags"), f"{where}.flags")
    both = sorted(set(flags) & {name for name, _ in options})
    if both:
        raise PlacementError(
            f"{both[0]!r} is both a flag and an option", where=f"{where}.flags", expected="each name once"
        )
    return replace(config, options=options, flags=flags)


def _with_rocprof_fields(config: ProfilingConfig, section: Mapping[str, Any], where: str) -> ProfilingConfig:
    args = _named_values(section.get("args"), f"{where}.args", _OPTION_NAME, "a rocprofsys option name")
    env = _named_values(section.get("env"), f"{where}.env", ENV_NAME, "a variable name")
    report = "output_dir: reports go to <output_dir> with the prefix <group>_<rank>_<pid>"
    _refuse_report_paths(env, _ROCPROF_OUTPUT_ENV, f"{where}.env", report)
    for name, value in env:
        refuse_credential(name, value, f"{where}.env")
    return replace(config, args=args, env=env)


def _refuse_report_paths(
    pairs: tuple[tuple[str, str], ...], refused: tuple[str, ...], where: str, expected: str
) -> None:
    """The report paths are rlinfra's own, one per process (see ``report_prefix``)."""
    for name, _ in pairs:
        if name in refused:
            raise PlacementError(
                f"{name!r} cannot be honoured: every process writes its own report",
                where=f"{where}.{name}",
                expected=expected,
            )


def _named_values(
    raw: Any, where: str, name_pattern: re.Pattern[str], what: str
) -> tuple[tuple[str, str], ...]:
    """A mapping of names to scalar values; booleans are written ``true``/``false`` as the
    profilers spell them (YAML reads ``stop-on-exit: true`` as a boolean)."""
    if raw is None:
        return ()
    pairs = []
    for name, value in as_mapping(raw, where).items():
        if not isinstance(name, str) or not name_pattern.fullmatch(name):
            raise PlacementError(
                f"bad name {name!r}",
                where=where,
                expected=f"{what}, without leading dashes (e.g. 't', 'capture-range')",
            )
        if isinstance(value, (Mapping, list)) or value is None:
            raise PlacementError(
                f"{name!r} has no scalar value", where=f"{where}.{name}", expected="a string or number"
            )
        pairs.append((name, str(value).lower() if isinstance(value, bool) else str(value)))
    return tuple(pairs)


def _flags(raw: Any, where: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    items = require_list([raw] if isinstance(raw, str) else raw, where, "a flag name or a list of them")
    for index, flag in enumerate(items):
        if not isinstance(flag, str) or not _OPTION_NAME.fullmatch(flag):
            raise PlacementError(
                f"bad flag {flag!r}",
                where=f"{where}[{index}]",
                expected="an nsys option name without leading dashes",
            )
    return tuple(items)


__all__ = ["BACKENDS", "DEFAULT_OUTPUT_DIR", "NSIGHT", "ROCPROF_SYS", "ProfilingConfig", "parse_profiling"]
