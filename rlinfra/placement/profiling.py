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
from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from rlinfra.config import ConfigError, Section, parse
from rlinfra.config.errors import unknown_key
from rlinfra.placement.config_access import refuse_relative
from rlinfra.placement.env_vars import ENV_NAME, refuse_credential
from rlinfra.placement.errors import PlacementError

NSIGHT = "nsight"
ROCPROF_SYS = "rocprof_sys"
BACKENDS = {NSIGHT: "Nsight Systems", ROCPROF_SYS: "ROCm Systems Profiler"}
ALL_GROUPS = "all"
DEFAULT_OUTPUT_DIR = "/tmp/rlinfra-profiles"

_BACKEND_FIELDS = {NSIGHT: ("options", "flags"), ROCPROF_SYS: ("args", "env")}
_REPORT_PATHS = {"options": ("o", "output"), "env": ("ROCPROFSYS_OUTPUT_PATH", "ROCPROFSYS_OUTPUT_PREFIX")}
_REPORTS = {
    "options": "output_dir: reports are named <output_dir>/<group>_<rank>_<pid>.nsys-rep",
    "env": "output_dir: reports go to <output_dir> with the prefix <group>_<rank>_<pid>",
}
_OPTION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_OPTION_KINDS = {"options": "an nsys option name", "args": "a rocprofsys option name"}  # else: variables
_UNSAFE_IN_FILE_NAME = re.compile(r"[^A-Za-z0-9._-]")


class ProfilingConfig(Section):
    """``cluster.profiling``, checked. ``worker_groups`` as written (matched case-insensitively);
    ``options``/``args``/``env`` as (name, value) pairs in the order written, values as text.
    Every key is validated even with ``enabled: false``, so a typo does not wait for the day
    profiling is switched on."""

    backend: str = Field(description=" or ".join(f"{name!r} ({tool})" for name, tool in BACKENDS.items()))
    enabled: bool = True
    worker_groups: tuple[str, ...] = ()
    output_dir: str = DEFAULT_OUTPUT_DIR
    options: tuple[tuple[str, str], ...] = ()
    flags: tuple[str, ...] = ()
    args: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _backend_and_its_keys(cls, data: Any) -> Any:
        backend = data.get("backend") if isinstance(data, Mapping) else None
        if backend is None:
            return data
        if backend not in BACKENDS:
            expected = str(cls.model_fields["backend"].description)
            raise ConfigError(f"unknown profiling backend {backend!r}", where="backend", expected=expected)
        foreign = [key for name, keys in _BACKEND_FIELDS.items() if name != backend for key in keys]
        others = [key for key in data if key in foreign]
        if others:  # the other backend's keys (any other unknown key is the schema's to name)
            raise unknown_key(others[0], [key for key in cls.model_fields if key not in foreign], None)
        if "steps" in data:
            raise _steps_refused(backend)
        return data

    @field_validator("worker_groups", mode="before")
    @classmethod
    def _group_names(cls, value: Any) -> Any:
        """Group names: one string (commas separate several, as in ``component_placement``), or a list."""
        items = () if value is None else value.split(",") if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or (value is not None and not items):
            expected = "a name, 'actor,rollout', a list of names, or 'all'"
            raise ConfigError(f"expected worker group names, got {value!r}", expected=expected)
        for index, item in enumerate(items):
            if not isinstance(item, str) or not item.strip():
                raise ConfigError(f"expected a group name, got {item!r}", where=f"[{index}]")
        return tuple(item.strip() for item in items)

    @field_validator("output_dir")
    @classmethod
    def _absolute(cls, path: str) -> str:
        """Each node would read a relative path against another directory."""
        return refuse_relative(
            path, None, "an absolute directory, valid on every node that runs a profiled worker"
        )

    @field_validator("options", "args", "env", mode="before")
    @classmethod
    def _named_values(cls, raw: Any, info: ValidationInfo) -> Any:
        """A mapping of names to scalar values; booleans are written ``true``/``false`` as the
        profilers spell them (YAML reads ``stop-on-exit: true`` as a boolean)."""
        if not isinstance(raw, Mapping):
            return () if raw is None else raw
        field = str(info.field_name)
        pattern = _OPTION_NAME if field in _OPTION_KINDS else ENV_NAME
        what = _OPTION_KINDS.get(field, "a variable name")
        for name, value in raw.items():
            if not isinstance(name, str) or not pattern.fullmatch(name):
                expected = f"{what}, without leading dashes (e.g. 't', 'capture-range')"
                raise ConfigError(f"bad name {name!r}", expected=expected)
            if isinstance(value, (Mapping, list)) or value is None:
                raise ConfigError(f"{name!r} has no scalar value", where=name, expected="a string or number")
            if name in _REPORT_PATHS.get(field, ()):
                problem = f"{name!r} cannot be honoured: every process writes its own report"
                raise ConfigError(problem, where=name, expected=_REPORTS[field])
        pairs = [
            (name, str(value).lower() if isinstance(value, bool) else str(value))
            for name, value in raw.items()
        ]
        for name, value in pairs if field == "env" else ():
            refuse_credential(name, value, "")
        return tuple(pairs)

    @field_validator("flags", mode="before")
    @classmethod
    def _flag_names(cls, raw: Any) -> Any:
        items = () if raw is None else [raw] if isinstance(raw, str) else raw
        for index, flag in enumerate(items if isinstance(items, list) else ()):
            if not isinstance(flag, str) or not _OPTION_NAME.fullmatch(flag):
                expected = "an nsys option name without leading dashes"
                raise ConfigError(f"bad flag {flag!r}", where=f"[{index}]", expected=expected)
        return items

    @model_validator(mode="after")
    def _each_name_once(self) -> ProfilingConfig:
        both = sorted(set(self.flags) & {name for name, _ in self.options})
        if both:
            raise ConfigError(
                f"{both[0]!r} is both a flag and an option", where="flags", expected="each name once"
            )
        return self

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
    None when the section is absent."""
    if raw is None or isinstance(raw, ProfilingConfig):
        return raw
    return parse(ProfilingConfig, raw, where, PlacementError)


def _steps_refused(backend: str) -> ConfigError:
    """rlinfra does not run the training loop, so it cannot open and close a capture window."""
    workaround = (
        "; to capture only some steps, set options {capture-range: cudaProfilerApi} and call "
        "torch.cuda.profiler.start()/stop() around them in the worker"
        if backend == NSIGHT
        else ""
    )
    return ConfigError(
        "steps cannot be honoured: rlinfra does not run the training loop, so it cannot open and "
        "close a capture window around given steps",
        where="steps",
        expected=f"no steps (the whole process is profiled){workaround}",
    )


__all__ = ["BACKENDS", "DEFAULT_OUTPUT_DIR", "NSIGHT", "ROCPROF_SYS", "ProfilingConfig", "parse_profiling"]
