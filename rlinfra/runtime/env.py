"""A worker's environment, composed from named layers with one documented precedence.

Lowest to highest — a higher layer overrides a lower one, name by name:

1. ``class defaults`` — ``env_defaults`` on the ``Worker`` subclass (what ``@ray.remote(
   runtime_env={"env_vars": ...})`` would be in plain Ray, without Ray recording it);
2. ``driver`` — the driver's own environment, but only names on an allow-list
   (``DEFAULT_ALLOWLIST`` plus ``cluster.env_allowlist``), never the whole ``os.environ``:
   NeMo-RL's copy of everything is how tokens end up in Ray's metadata. Allow-listed names that
   look like credentials are withheld;
3. ``node group`` — the ``env_configs`` entries of the process's node group that cover its node;
4. ``component`` — the component's own ``env_vars`` in ``component_placement``;
5. ``rlinfra`` — what rlinfra computes per process: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
   ``LOCAL_WORLD_SIZE``, ``NODE_RANK``, the visibility variable; ``MASTER_ADDR``/``MASTER_PORT``
   follow once rank 0 holds its port.

Path-like variables (``PATH``, ``PYTHONPATH``, ``LD_LIBRARY_PATH``) merge: a higher layer's
entries come first, then the lower layers', without repeats — and, in the worker, then the
process's inherited value. A layer overwrites instead where told (``{value: ..., merge: false}``
in YAML, ``EnvLayer(replace=...)`` in code). Composition copies: no caller's mapping is changed.

Secrets never pass through here (see ``rlinfra.runtime.secrets``).
"""

import dataclasses
import fnmatch
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from rlinfra.placement.cluster_spec import ClusterSpec
from rlinfra.placement.env_vars import (
    NO_ENV_VARS,
    PATH_VARIABLES,
    EnvVars,
    looks_like_secret,
    merge_paths,
    refuse_credential,
)
from rlinfra.placement.record import Placement

# Driver variables a worker is given by default: locale, paths, caches and communication
# tuning — what a remote worker needs to behave like the driver, and nothing that identifies
# or authorises anyone. Shell-style patterns.
DEFAULT_ALLOWLIST = (
    *("PATH", "HOME", "LANG", "LANGUAGE", "LC_*", "TZ", "TMPDIR"),  # locale and paths
    *("PYTHONPATH", "PYTHONHASHSEED", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH"),  # interpreter, libraries
    *("NCCL_*", "GLOO_*", "TORCH_NCCL_*", "OMP_NUM_THREADS"),  # communication and threads
    *("TOKENIZERS_PARALLELISM", "PYTORCH_CUDA_ALLOC_CONF"),  # library tuning
    *("HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "HF_HUB_OFFLINE"),  # caches
    *("TRANSFORMERS_CACHE", "TORCH_HOME", "TRITON_CACHE_DIR"),
)


@dataclass(frozen=True)
class EnvLayer:
    """One named source of variables. ``replace`` names the path-like variables this layer
    overwrites instead of merging (an ``EnvVars`` brings its own). The values are copied."""

    source: str
    values: Mapping[str, str]
    replace: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "replace", self.replace | getattr(self.values, "replace", frozenset()))
        object.__setattr__(self, "values", MappingProxyType({str(k): str(v) for k, v in self.values.items()}))


@dataclass(frozen=True)
class ResolvedEnv:
    """The composed environment: ``values``, each value's ``sources`` (layer names, highest
    first, joined by ``" + "`` where a path-like variable merged several), ``replaced`` (path-like
    variables a layer overwrote, so the worker must not merge them with its inherited value),
    and ``withheld`` (allow-listed driver variables held back as credential-like)."""

    values: Mapping[str, str]
    sources: Mapping[str, str]
    replaced: frozenset[str] = frozenset()
    withheld: tuple[str, ...] = ()

    @property
    def merge_with_inherited(self) -> tuple[str, ...]:
        """Path-like variables the worker prepends to its process's own value."""
        return tuple(sorted(name for name in self.values if name in PATH_VARIABLES - self.replaced))


def compose_env(*layers: EnvLayer) -> ResolvedEnv:
    """Compose ``layers``, given lowest precedence first. Pure: reads the layers, returns new data."""
    values: dict[str, str] = {}
    sources: dict[str, list[str]] = {}
    replaced: set[str] = set()
    for layer in layers:
        for name, value in layer.values.items():
            if name in PATH_VARIABLES and name in values and name not in layer.replace:
                values[name] = merge_paths(value, values[name])
                sources[name] = [layer.source, *(s for s in sources[name] if s != layer.source)]
            else:
                values[name] = value
                sources[name] = [layer.source]
                replaced.discard(name)
            if name in layer.replace:
                replaced.add(name)
    return ResolvedEnv(
        MappingProxyType(values),
        MappingProxyType({name: " + ".join(names) for name, names in sources.items()}),
        frozenset(replaced),
    )


# --------------------------------------------------------------------------------- the layers


def class_defaults_layer(worker_cls: type | None) -> EnvLayer:
    """``worker_cls.env_defaults``, refusing credential-like values as the YAML does."""
    defaults: Mapping[str, Any] = getattr(worker_cls, "env_defaults", None) or {}
    where = f"{getattr(worker_cls, '__qualname__', 'Worker')}.env_defaults"
    for name, value in defaults.items():
        refuse_credential(str(name), str(value), where)
    return EnvLayer("class defaults", defaults)


def driver_layer(environ: Mapping[str, str], allowlist: Sequence[str]) -> tuple[EnvLayer, tuple[str, ...]]:
    """The allow-listed part of ``environ``, and the allow-listed names withheld as credentials."""
    allowed = [name for name in sorted(environ) if any(fnmatch.fnmatchcase(name, p) for p in allowlist)]
    withheld = tuple(name for name in allowed if looks_like_secret(name, environ[name]))
    return EnvLayer("driver", {name: environ[name] for name in allowed if name not in withheld}), withheld


def node_group_layers(placement: Placement, spec: ClusterSpec) -> list[EnvLayer]:
    """The ``env_configs`` entries of the process's node group that cover its node, in order."""
    group = spec.node_groups.get(placement.node_group_label)
    if group is None:
        return []
    covering = [config for config in group.env_configs if placement.cluster_node_rank in config.node_ranks]
    return [EnvLayer(f"node group {group.label!r}", config.env_vars) for config in covering]


def rlinfra_layer(placement: Placement) -> EnvLayer:
    """Ranks and visibility: what rlinfra computes for this very process."""
    return EnvLayer(
        "rlinfra",
        {
            "RANK": str(placement.rank),
            "WORLD_SIZE": str(placement.world_size),
            "LOCAL_RANK": str(placement.local_rank),
            "LOCAL_WORLD_SIZE": str(placement.local_world_size),
            "NODE_RANK": str(placement.cluster_node_rank),
            **placement.visibility_env,
        },
    )


class WorkerEnvs:
    """The environments of one component's processes. The layers that do not depend on the
    process — class defaults, driver, component — are built once, so a launch of thousands of
    ranks scans the driver's environment once, not once per rank. The driver's variables are
    those of ``DEFAULT_ALLOWLIST`` and of ``env_allowlist`` (``cluster.env_allowlist``)."""

    def __init__(
        self,
        spec: ClusterSpec,
        *,
        worker_cls: type | None = None,
        component_env: EnvVars = NO_ENV_VARS,
        component: str = "",
        driver_env: Mapping[str, str] | None = None,
        env_allowlist: Sequence[str] = (),
    ) -> None:
        self._spec = spec
        self._class = class_defaults_layer(worker_cls)
        self._driver, self._withheld = driver_layer(
            os.environ if driver_env is None else driver_env, (*DEFAULT_ALLOWLIST, *env_allowlist)
        )
        self._component = EnvLayer(f"component {component!r}" if component else "component", component_env)

    def of(self, placement: Placement) -> ResolvedEnv:
        """The environment of the process at ``placement``: all five layers, composed."""
        groups = node_group_layers(placement, self._spec)
        resolved = compose_env(self._class, self._driver, *groups, self._component, rlinfra_layer(placement))
        return dataclasses.replace(resolved, withheld=self._withheld)
