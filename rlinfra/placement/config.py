"""The ``cluster`` section of a config, parsed once into typed records.

Every key the section may hold is listed here, and nothing else is accepted: an unknown key is a
``PlacementError`` naming it and the nearest valid key (``node_grups`` → ``node_groups``), so a
typo can never be silently dropped. The records are what every layer reads afterwards — the
cluster spec and placement (``node_groups``, ``components``), the runtime (``address``,
``simulate*``, ``secrets``, ``env_allowlist``) — so no module re-reads raw mappings. RLinf keys
for features rlinfra does not have (``auto_scheduler`` and its settings, ``profiling``) are refused
by name, with what to do instead.

    cluster:
      num_nodes: 2
      num_gpus_per_node: 8        # RLinf's: what a dry run assumes, what each live node must have
      component_placement: {actor: 0-7, env: {node_group: node, placement: 0-1, num_cpus: 2,
                                                   restart: {max: 3, within_s: 600}}}
      node_groups: [...]          # rlinfra.placement.node_groups
      address: ray://head:10001   # attach instead of starting an embedded Ray
      simulate: 2x8               # rehearse on one machine: N real raylets with logical GPUs
      simulate_cpus: 8            # … their logical CPUs, object store, resources and labels
      node_timeout: 60            # seconds to wait for num_nodes nodes
      secrets: {...}              # rlinfra.placement.secret_specs
      env_allowlist: [WANDB_*]    # driver variables workers may inherit, beyond the defaults
      accelerator: H100           # each accelerator's memory (or {memory_gib: N}), for the memory plan
      memory_check: error         # or warn: a device the memory plan overfills is only a warning

A component's mapping may add ``model`` (a checkpoint folder or its ``config.json``) and
``memory`` (``rlinfra.placement.memory``): its role and the settings that change its memory.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ConfigDict, Field

from rlinfra.config import Section, parse
from rlinfra.placement.config_access import as_mapping, name_list, require_int
from rlinfra.placement.constraints import NO_CONSTRAINTS, Constraints, parse_constraints
from rlinfra.placement.env_vars import ENV_NAME, NO_ENV_VARS, EnvVars, parse_env_vars
from rlinfra.placement.errors import PlacementError, Span, plural
from rlinfra.placement.grammar import bounded_int, comma_parts
from rlinfra.placement.memory import MemorySettings, parse_memory
from rlinfra.placement.node_groups import CLUSTER_GROUP, NodeGroup, accelerator_gib, parse_node_groups
from rlinfra.placement.restart import RestartPolicy
from rlinfra.placement.secret_specs import SecretSpec

MAX_NODES = 100_000
MAX_ACCELERATORS_PER_NODE = 1024
DEFAULT_NODE_TIMEOUT_S = 60.0
DEFAULT_SIMULATED_CPUS = 16  # logical CPUs of a simulated node when simulate_cpus is not given

# RLinf features rlinfra does not provide, refused by name: their keys, what is missing, and what to
# do instead. ``auto_scheduler: false`` alone asks for nothing, so it is accepted.
UNSUPPORTED_FEATURES = (
    (
        (
            "auto_scheduler",
            "assign_policy",
            "use_pre_process_policy",
            "rollout_use_all_gpus",
            "monitor_interval",
            "preprocess_threshold",
            "migrate_out_max_bs",
            "use_wait_before_last_iter_policy",
            "fuse_rollout_inference_only",
            "recreate_nccl_groups",
        ),
        "RLinf's dynamic scheduler (moving GPUs between rollout and training while the job runs) is not "
        "part of rlinfra",
        "a static component_placement; remove these keys (or set auto_scheduler: false alone)",
    ),
    (
        ("profiling",),
        "rlinfra does not wrap workers in a profiler (RLinf's Nsight / rocprof_sys wrapping)",
        "no cluster.profiling; profile a running worker with py-spy (`py-spy record --pid PID`, each "
        "rank's pid is in placement.json's processes), or start your own actors with Ray's "
        "runtime_env={'_nsight': ...}",
    ),
)

_UNIFORM_SPEC = re.compile(r"\s*([0-9]+)\s*[xX]\s*([0-9]+)\s*")
_COUNT = re.compile(r"\s*[0-9]+\s*")


@dataclass(frozen=True)
class ComponentConfig:
    """One key of ``component_placement``: the components it names (``"actor,inference"`` names
    two, sharing one strategy), their node groups, the placement string as written, and the
    component's own ``env_vars``, ``constraints``, ``num_cpus`` (CPUs per process; None: the
    default rule of ``rlinfra.runtime.bundles``), ``restart`` budget (None: the default of
    ``rlinfra.placement.restart``) and ``model``, the checkpoint directory its processes hold (the
    plan shows what it is; a job that loads another one refuses it)."""

    key: str
    names: tuple[str, ...]
    node_groups: tuple[str, ...]
    placement: str
    env_vars: EnvVars = NO_ENV_VARS
    constraints: Constraints = NO_CONSTRAINTS
    num_cpus: float | None = None
    restart: RestartPolicy | None = None
    model: str | None = None
    memory: MemorySettings | None = None


@dataclass(frozen=True)
class ClusterConfig:
    """The whole ``cluster`` section, checked. ``simulate`` holds accelerators per simulated node;
    ``simulate_resources``/``simulate_labels`` one mapping per simulated node. A ``simulate_*``
    key not written is None (``simulate_cpus``: ``DEFAULT_SIMULATED_CPUS`` where a simulated
    cluster is started or planned), so a written one that cannot be honoured can be refused."""

    num_nodes: int
    num_gpus_per_node: int | None = None
    components: tuple[ComponentConfig, ...] = ()
    node_groups: tuple[NodeGroup, ...] = ()
    address: str | None = None
    simulate: tuple[int, ...] | None = None
    simulate_cpus: int | None = None
    simulate_object_store_mib: int | None = None
    simulate_resources: tuple[Mapping[str, float], ...] | None = None
    simulate_labels: tuple[Mapping[str, str], ...] | None = None
    node_timeout: float = DEFAULT_NODE_TIMEOUT_S
    secrets: tuple[SecretSpec, ...] = ()
    env_allowlist: tuple[str, ...] = ()
    accelerator_gib: float | None = None  # every node's accelerators, unless its node group says
    memory_check: Literal["error", "warn"] = "error"


class _Written(Section):
    """The ``cluster`` keys as written, typed strictly (``num_nodes: "2"`` is a typo to show, not a
    number to guess); what other modules parse is passed on as it is."""

    model_config = ConfigDict(strict=True)

    num_nodes: int = Field(ge=1, le=MAX_NODES)
    num_gpus_per_node: int | None = Field(default=None, ge=0)
    component_placement: Any = None
    node_groups: Any = None
    address: str | None = Field(default=None, min_length=1)
    simulate: Any = None
    simulate_cpus: int | None = Field(default=None, ge=1)
    simulate_object_store_mib: int | None = Field(default=None, ge=64)
    simulate_resources: list[dict[str, float]] | None = None
    simulate_labels: list[dict[str, str]] | None = None
    node_timeout: float = Field(default=DEFAULT_NODE_TIMEOUT_S, gt=0)
    secrets: Any = None
    env_allowlist: list[str] | None = None
    auto_scheduler: Literal[False] = False
    accelerator: Any = None
    memory_check: Literal["error", "warn"] = Field(
        default="error", description="what a device the memory plan overfills is"
    )


_SIMULATE_ONLY = ("simulate_cpus", "simulate_object_store_mib", "simulate_resources", "simulate_labels")
# Keys taken as written (simulate_cpus, simulate_object_store_mib too); the others are parsed further.
_COPIED = {"num_nodes", "num_gpus_per_node", "address", "node_timeout", "memory_check", *_SIMULATE_ONLY[:2]}


def parse_cluster_config(section: Any, where: str = "cluster") -> ClusterConfig:
    """``section`` (a mapping, a ``DictConfig``, or a ``ClusterConfig`` already parsed) checked
    and typed; any problem is a ``PlacementError`` naming the key."""
    if isinstance(section, ClusterConfig):
        return section
    raw = as_mapping(section, where)
    _refuse_unsupported(raw, where)
    written = parse(_Written, raw, where, PlacementError)
    simulate = (
        None
        if written.simulate is None
        else tuple(parse_nodes_spec(written.simulate, f"{where}.simulate", written.num_nodes))
    )
    if simulate is not None and written.address is not None:
        raise PlacementError(
            "cluster.simulate and cluster.address are both given",
            where=f"{where}.simulate",
            expected="simulate (an embedded rehearsal cluster) or address (an existing Ray), not both",
        )
    for key in _SIMULATE_ONLY:
        value = getattr(written, key)
        if value is not None and simulate is None:
            raise PlacementError(
                "only used with cluster.simulate", where=f"{where}.{key}", expected="cluster.simulate as well"
            )
        if isinstance(value, list) and simulate is not None and len(value) != len(simulate):
            raise PlacementError(
                "expected one mapping per simulated node",
                where=f"{where}.{key}",
                expected=f"a list of {len(simulate)} mappings",
            )
    if (
        simulate is not None
        and written.num_gpus_per_node is not None
        and set(simulate) != {written.num_gpus_per_node}
    ):
        raise PlacementError(
            f"cluster.num_gpus_per_node is {written.num_gpus_per_node} but cluster.simulate gives "
            f"{list(simulate)}",
            where=f"{where}.num_gpus_per_node",
            expected="the same accelerator count on every simulated node, or no num_gpus_per_node",
        )
    num_nodes = written.num_nodes
    return ClusterConfig(
        **written.model_dump(include=_COPIED),
        components=parse_components(written.component_placement, num_nodes, f"{where}.component_placement"),
        node_groups=parse_node_groups(written.node_groups, num_nodes, f"{where}.node_groups"),
        simulate=simulate,
        simulate_resources=_per_node(written.simulate_resources),
        simulate_labels=_per_node(written.simulate_labels),
        secrets=parse_secret_specs(written.secrets, f"{where}.secrets"),
        env_allowlist=tuple(written.env_allowlist or ()),
        accelerator_gib=accelerator_gib(written.accelerator, f"{where}.accelerator"),
    )


def cluster_section(cfg: Any) -> Any:
    """The ``cluster`` section of a full config (``cfg.cluster``), unresolved, or the
    ``ClusterConfig`` already parsed from it (``{"cluster": cluster.config}``)."""
    section = cfg.get("cluster") if isinstance(cfg, Mapping) else getattr(cfg, "cluster", None)
    if not isinstance(section, (Mapping, ClusterConfig)):  # a DictConfig is a Mapping
        raise PlacementError(
            "the config has no 'cluster' section",
            where="cfg.cluster",
            expected="a mapping with num_nodes and component_placement",
        )
    return section


# --------------------------------------------------------------------------- component_placement


def parse_components(raw: Any, num_nodes: int, where: str) -> tuple[ComponentConfig, ...]:
    """Each key of ``component_placement`` (empty when the section is absent: a cluster may be
    started before anything is placed; ``ComponentPlacement`` insists on at least one)."""
    if raw is None:
        return ()
    raw = as_mapping(raw, where, expected="a mapping such as {actor: '0-7'}")
    entries: list[ComponentConfig] = []
    placed: set[str] = set()
    for key, value in raw.items():
        entry = _parse_component(str(key), value, num_nodes, f"{where}.{key}")
        for name in entry.names:
            if name in placed:
                raise PlacementError(
                    f"component {name!r} is placed twice",
                    where=f"{where}.{key}",
                    expected="each component in one key",
                )
            placed.add(name)
        entries.append(entry)
    return tuple(entries)


class _Entry(Section):
    """A ``component_placement`` value written as a mapping; what other modules parse is passed on."""

    node_group: Any = CLUSTER_GROUP
    placement: Any = Field(description="a string such as '0-7' or '0-3:0-7'")
    env_vars: Any = None
    constraints: Any = None
    num_cpus: float | None = Field(default=None, ge=0, description="CPUs per process")
    restart: RestartPolicy | None = None
    model: str | None = Field(
        default=None, strict=True, description="a checkpoint path: a Hugging Face folder or its config.json"
    )
    memory: Any = None


def _parse_component(key: str, value: Any, num_nodes: int, path: str) -> ComponentConfig:
    names = name_list(key, "cluster.component_placement", "component name")
    if not isinstance(value, Mapping):
        return ComponentConfig(key, names, (CLUSTER_GROUP,), _placement_text(value, path))
    entry = parse(_Entry, value, path, PlacementError)
    return ComponentConfig(
        key,
        names,
        name_list(entry.node_group, f"{path}.node_group", "node group label"),
        _placement_text(entry.placement, path),
        parse_env_vars(entry.env_vars, f"{path}.env_vars"),
        parse_constraints(entry.constraints, f"{path}.constraints", num_nodes),
        entry.num_cpus,
        entry.restart,
        entry.model or None,  # empty: an interpolated path the job leaves unset
        _memory(entry, path),
    )


def _memory(entry: _Entry, path: str) -> MemorySettings | None:
    if entry.memory is None:
        return None
    if not entry.model:
        raise PlacementError(
            "a memory declaration needs the component's model",
            where=f"{path}.model",
            expected="the model's checkpoint directory or its config.json (a 2 KB file is enough)",
        )
    return parse_memory(entry.memory, f"{path}.memory")


def _placement_text(value: Any, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise PlacementError(
            f"expected a placement string, got {value!r}",
            where=where,
            expected="a string such as '0-7' or '0-3:0-7', or a mapping {node_group, placement}",
        )
    return str(value)


# ------------------------------------------------------------------------------- the other keys


def parse_nodes_spec(spec: Any, where: str = "--nodes", num_nodes: int | None = None) -> list[int]:
    """Accelerators per node from ``'NxG'`` (N nodes with G each) or ``'8,8,4,0'`` (one per node),
    or a YAML list of counts; with ``num_nodes``, for exactly that many nodes (cluster.num_nodes).

    Shared by ``rlinfra plan --nodes``, ``cluster.simulate`` and ``ClusterSpec.from_config``.
    """
    expected = "'NxG' (N nodes with G accelerators each, e.g. '2x8') or per-node counts like '8,8,4,0'"
    if isinstance(spec, (list, tuple)):
        counts = [require_int(count, f"{where}[{index}]") for index, count in enumerate(spec)]
    else:
        counts = _counts_from_text(str(spec), where, expected)
    if not counts or len(counts) > MAX_NODES:
        raise PlacementError(
            "too many nodes" if counts else "no nodes",
            where=where,
            expected=f"between 1 and {MAX_NODES:,} nodes; {expected}",
        )
    for index, count in enumerate(counts):
        if count > MAX_ACCELERATORS_PER_NODE:
            raise PlacementError(
                f"node {index} has {count} accelerators",
                where=where,
                expected=f"at most {MAX_ACCELERATORS_PER_NODE:,} accelerators per node",
            )
    if num_nodes is not None and len(counts) != num_nodes:
        # A size mismatch is almost always a wrong file or a typo, so say which numbers disagree.
        raise PlacementError(
            f"{plural(len(counts), 'node')} given, but cluster.num_nodes is {num_nodes}",
            where=where,
            expected=f"exactly {plural(num_nodes, 'node')}, e.g. '{num_nodes}x8', "
            "or change cluster.num_nodes",
        )
    return counts


def _counts_from_text(text: str, where: str, expected: str) -> list[int]:
    uniform = _UNIFORM_SPEC.fullmatch(text)
    if uniform:
        num_nodes, per_node = bounded_int(uniform.group(1)), bounded_int(uniform.group(2))
        if per_node is None:
            raise PlacementError(
                "the accelerator count is too large", where=where, text=text, expected=expected
            )
        return [per_node] * (MAX_NODES + 1 if num_nodes is None else min(num_nodes, MAX_NODES + 1))
    counts = []
    for part, offset in comma_parts(text):
        count = bounded_int(part) if _COUNT.fullmatch(part) else None
        if count is None:
            start = offset + len(part) - len(part.lstrip())
            raise PlacementError(
                f"cannot read {part.strip()!r} as an accelerator count",
                where=where,
                text=text,
                span=Span(start, max(start + 1, offset + len(part.rstrip()))),
                expected=expected,
            )
        counts.append(count)
    return counts


class _Source(Section):
    from_env: str | None = Field(default=None, min_length=1)
    from_file: str | None = Field(default=None, min_length=1)
    expose_as_env: bool = False


def parse_secret_specs(raw: Any, where: str = "cluster.secrets") -> tuple[SecretSpec, ...]:
    """The ``secrets`` mapping as specs (none if absent); schema errors are ``PlacementError``."""
    if raw is None:
        return ()
    specs = []
    for name, entry in as_mapping(raw, where).items():
        entry_where = f"{where}.{name}"
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
            raise PlacementError(f"bad secret name {name!r}", where=where, expected="a name like HF_TOKEN")
        source = parse(_Source, entry, entry_where, PlacementError)
        if (source.from_env is None) == (source.from_file is None):
            raise PlacementError(
                "a secret needs exactly one source",
                where=entry_where,
                expected="{from_env: VARIABLE} or {from_file: PATH}",
            )
        specs.append(SecretSpec(name, **source.model_dump()))
    return tuple(specs)


def _per_node(values: list[dict[str, Any]] | None) -> tuple[dict[str, Any], ...] | None:
    return None if values is None else tuple(values)


def _refuse_unsupported(raw: Mapping[str, Any], where: str) -> None:
    """RLinf's keys for features rlinfra does not have (``UNSUPPORTED_FEATURES``), refused by name."""
    for keys, problem, expected in UNSUPPORTED_FEATURES:
        given = [key for key in keys if key in raw]
        if given and (given != ["auto_scheduler"] or raw["auto_scheduler"] is not False):
            # The key path names the first key; the others, if any, are named in the problem.
            said = f"{', '.join(given)}: {problem}" if len(given) > 1 else problem
            raise PlacementError(said, where=f"{where}.{given[0]}", expected=expected)
