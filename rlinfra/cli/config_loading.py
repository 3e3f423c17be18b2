"""Reading a user's YAML config file into an OmegaConf ``DictConfig``.

Every way the file itself can be wrong — missing, unreadable, not YAML, not a mapping, no
``cluster`` section, a broken ``${...}`` interpolation — becomes one ``ConfigError`` whose message
is a short paragraph the CLI can print as is. Problems *inside* the cluster section are left to
the placement engine, which reports them as ``PlacementError`` with the config path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf._utils import get_yaml_loader
from omegaconf.errors import OmegaConfBaseException


class ConfigError(ValueError):
    """A config file that cannot be used at all (as opposed to a bad placement inside it)."""


def _placement_safe_loader() -> type:
    """OmegaConf's YAML loader without YAML 1.1's base-60 integers.

    YAML 1.1 reads an unquoted ``placement: 1:0`` as the integer 60 (and ``1:30`` as 90), which
    would silently put "one process on GPU 1" on GPU 60. YAML 1.2 dropped base 60; so does this
    loader, which keeps such values as the strings the user wrote.
    """
    base = get_yaml_loader()

    class PlacementSafeLoader(base):  # type: ignore[misc, valid-type]
        pass

    PlacementSafeLoader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != _INT_TAG]
        for first, resolvers in base.yaml_implicit_resolvers.items()
    }
    PlacementSafeLoader.add_implicit_resolver(_INT_TAG, _YAML12_INT, list("-+0123456789"))
    return PlacementSafeLoader


_INT_TAG = "tag:yaml.org,2002:int"
_YAML12_INT = re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0o?[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$")
_LOADER = _placement_safe_loader()


def load_config(path: Path) -> DictConfig:
    """The config at ``path``, with interpolations resolved, or a ``ConfigError`` saying why not."""
    text = _read_text(path)
    try:
        data = yaml.load(text, Loader=_LOADER)
        loaded = OmegaConf.create(data) if data is not None else None
    except yaml.MarkedYAMLError as error:
        raise ConfigError(_describe_yaml_error(path, text, error)) from None
    except (yaml.YAMLError, ValueError, OmegaConfBaseException) as error:
        raise ConfigError(f"{path}: cannot read the file as a YAML mapping: {error}") from None
    if not isinstance(loaded, DictConfig):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise ConfigError(
            f"{path}: the top level of the file is {kind}; expected a mapping with a 'cluster' section."
        )
    try:
        OmegaConf.resolve(loaded)
    except OmegaConfBaseException as error:
        raise ConfigError(f"{path}: cannot resolve an interpolation: {error}") from None
    _require_cluster(path, loaded)
    return loaded


def _read_text(path: Path) -> str:
    if not path.exists():
        raise ConfigError(f"{path}: no such file. Pass the path of a YAML config with a 'cluster' section.")
    if not path.is_file():
        raise ConfigError(f"{path}: not a file. Pass the path of a YAML config with a 'cluster' section.")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text (byte {error.start}); is this a YAML file?") from None
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the file: {error.strerror or error}") from None


def _describe_yaml_error(path: Path, text: str, error: yaml.MarkedYAMLError) -> str:
    """The 1-based position, then the offending line with a caret under it.

    An unclosed bracket is only noticed at the end of the file, so the place where the open
    construct started (the context mark) is named too, and shown when the problem has no line.
    """
    mark = error.problem_mark or error.context_mark
    if mark is None:
        return f"{path}: YAML syntax error: {error.problem or error.context or error}"
    message = f"{path}: YAML syntax error at {_position(mark)}: {error.problem or error.context}"
    context = error.context_mark
    if error.context and context is not None and context is not mark:
        message += f" ({error.context} started at {_position(context)})"
    lines = text.splitlines()
    shown = mark if mark.line < len(lines) else context
    if shown is not None and shown.line < len(lines):
        source = lines[shown.line].replace("\t", " ")  # one column per tab keeps the caret aligned
        message += f"\n  {shown.line + 1:>4} | {source}\n         {' ' * shown.column}^"
    return message


def _position(mark: yaml.Mark) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"


def _require_cluster(path: Path, cfg: DictConfig) -> None:
    cluster = cfg.get("cluster")
    if cluster is None:
        raise ConfigError(
            f"{path}: the config has no 'cluster' section. rlinfra reads cluster.num_nodes, "
            "cluster.component_placement and, optionally, cluster.node_groups from it."
        )
    if not isinstance(cluster, Mapping):
        raise ConfigError(
            f"{path}: 'cluster' is {type(cluster).__name__}, not a mapping; expected num_nodes, "
            "component_placement and, optionally, node_groups under it."
        )
