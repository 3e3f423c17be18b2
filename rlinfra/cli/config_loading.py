"""Reading a user's YAML config file into an OmegaConf ``DictConfig``.

Every way the file itself can be wrong — missing, unreadable, not YAML, not a mapping, no
``cluster`` section, a broken ``${...}`` interpolation — becomes one ``ConfigError`` whose message
is a short paragraph the CLI can print as is. Problems *inside* the cluster section are left to
the placement engine, which reports them as ``PlacementError`` with the config path.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


class ConfigError(ValueError):
    """A config file that cannot be used at all (as opposed to a bad placement inside it)."""


def load_config(path: Path) -> DictConfig:
    """The config at ``path``, with interpolations resolved, or a ``ConfigError`` saying why not."""
    text = _read_text(path)
    try:
        loaded = OmegaConf.load(io.StringIO(text))
    except yaml.MarkedYAMLError as error:
        raise ConfigError(_describe_yaml_error(path, text, error)) from None
    except (yaml.YAMLError, OSError, OmegaConfBaseException) as error:
        # OmegaConf reports a top-level scalar ("just a number") as an OSError.
        raise ConfigError(f"{path}: cannot read the file as a YAML mapping: {error}") from None
    if not isinstance(loaded, DictConfig):
        raise ConfigError(
            f"{path}: the top level of the file is a list; expected a mapping with a 'cluster' section."
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
