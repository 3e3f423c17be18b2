"""Reading a user's config — one YAML file, or a Hydra config to compose — into a ``DictConfig``.

Every way the config itself can be wrong — missing, unreadable, not YAML, not a mapping, no
``cluster`` section, a Hydra defaults list that cannot be composed, a ``${...}`` interpolation
that does not resolve (named by its key path) — becomes one ``ConfigError`` whose message is a
short paragraph the CLI can print as is. Problems with the placement itself are left to the
placement engine, which reports them as ``PlacementError`` with the config path.

Two entry points, because commands need different amounts of the config:

- ``load_cluster_config`` (``plan``, ``job``, ``slurm``) resolves only ``cluster`` (and any other
  section the caller names). RLinf's configs interpolate environment variables, RLinf's own
  resolvers (``${subtract:...}``) and keys from sub-configs all over the file; placement reads
  only ``cluster``, as RLinf's own ``ComponentPlacement`` does, so none of that may stop a plan.
- ``load_config`` (``run``) resolves everything, because the job reads everything.

A file with a top-level ``defaults`` list or ``hydra`` section is a Hydra config: it is composed
by Hydra from its own directory, as RLinf's ``@hydra.main`` entry points compose it.
"""

import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, cast

import omegaconf._utils
import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import (
    InterpolationKeyError,
    InterpolationToMissingValueError,
    MissingMandatoryValue,
    OmegaConfBaseException,
    UnsupportedInterpolationType,
)

from rlinfra.config.errors import ConfigError
from rlinfra.config.schema import to_plain

_INT_TAG = "tag:yaml.org,2002:int"
_YAML12_INT = re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0o?[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$")
_OMEGACONF_LOADER = omegaconf._utils.get_yaml_loader()


class _PlacementSafeLoader(_OMEGACONF_LOADER):  # type: ignore[misc, valid-type]
    """OmegaConf's YAML loader without YAML 1.1's base-60 integers.

    YAML 1.1 reads an unquoted ``placement: 1:0`` as the integer 60 (and ``1:30`` as 90), which
    would silently put "one process on GPU 1" on GPU 60. YAML 1.2 dropped base 60; so does this
    loader, which keeps such values as the strings the user wrote.
    """

    yaml_implicit_resolvers: ClassVar[dict[str, list[tuple[str, re.Pattern[str]]]]] = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != _INT_TAG]
        for first, resolvers in _OMEGACONF_LOADER.yaml_implicit_resolvers.items()
    }


_PlacementSafeLoader.add_implicit_resolver(_INT_TAG, _YAML12_INT, list("-+0123456789"))
# RLinf's entry points use @hydra.main(version_base="1.1"); composing with the same base reads
# their defaults lists the same way (e.g. a `hydra/...` group without the `override` keyword).
_HYDRA_VERSION_BASE = "1.1"


def load_cluster_config(
    path: Path, config_name: str | None = None, *, also: tuple[str, ...] = ()
) -> DictConfig:
    """A config holding only ``cluster`` — and the sections named in ``also``, where present —
    with their interpolations resolved; or a ``ConfigError`` saying why not.

    Interpolations inside ``cluster`` may point anywhere in the (composed) config. Everything
    else is never resolved, so an unset variable or an unknown resolver there does not matter;
    and it is not carried over, because consumers such as ``ComponentPlacement`` convert the
    whole config they are given, which would resolve it after all.
    """
    cfg, where = _read(path, config_name)
    sections = {name: _resolved_section(where, cfg, name) for name in ("cluster", *also) if name in cfg}
    _require_cluster(where, sections)
    return OmegaConf.create(sections)


def load_config(path: Path, config_name: str | None = None, overrides: Sequence[str] = ()) -> DictConfig:
    """The whole config, every interpolation resolved, or a ``ConfigError`` saying why not.
    ``overrides`` are Hydra's (``key=value``, ``+key=value`` adds one): the config is then
    composed by Hydra even when it is a single file."""
    cfg, where = _read(path, config_name, overrides)
    _resolve_all(where, cfg, OmegaConf.to_container(cfg, resolve=False), "")
    OmegaConf.resolve(cfg)
    _require_cluster(where, cfg)
    return cfg


def _read(path: Path, config_name: str | None, overrides: Sequence[str] = ()) -> tuple[DictConfig, str]:
    """The config as written (a file) or composed (a Hydra config, always with ``config_name``),
    and how to name it."""
    if config_name is not None:
        if not path.is_dir():
            raise ConfigError(
                f"{path}: not a directory. With --config-name, pass the Hydra config directory "
                "that holds NAME.yaml (or pass the YAML file alone)."
            )
        path = path / f"{config_name.removesuffix('.yaml')}.yaml"
    cfg = _load_file(path)
    if config_name is None and not overrides and "defaults" not in cfg and "hydra" not in cfg:
        return cfg, str(path)
    if path.suffix != ".yaml":
        raise ConfigError(
            f"{path}: a Hydra config (it has a 'defaults' list or a 'hydra' section), but Hydra "
            f"reads only '.yaml' files; rename it to {path.stem}.yaml."
        )
    return _compose(path, cfg, overrides), f"{path} (composed by Hydra)"


def _load_file(path: Path) -> DictConfig:
    text = _read_text(path)
    try:
        data = yaml.load(text, Loader=_PlacementSafeLoader)
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
    return loaded


def _read_text(path: Path) -> str:
    if not path.exists():
        raise ConfigError(f"{path}: no such file. Pass the path of a YAML config with a 'cluster' section.")
    if not path.is_file():
        raise ConfigError(
            f"{path}: not a file. Pass the path of a YAML config with a 'cluster' section "
            "(rlinfra plan also takes a Hydra config directory with --config-name NAME)."
        )
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


# --- Hydra composition ---------------------------------------------------------------------------


def _compose(primary: Path, written: DictConfig, overrides: Sequence[str]) -> DictConfig:
    """The Hydra config ``primary`` (a ``.yaml`` file), composed from its directory as
    ``@hydra.main`` would.

    ``written`` is the primary file as loaded here; it supplies the ``hydra.searchpath`` entries
    that can be resolved now (see ``_searchpath_overrides``). Hydra's warnings (a defaults list
    without ``_self_``, a search path that does not exist) are about running a Hydra app, not
    about placement, so they are not shown. Hydra returns the config in struct mode; it is
    switched off so that a composed config takes the same overrides as a single file.
    """
    from hydra import compose, initialize_config_dir  # imported only for Hydra configs: ~0.1 s
    from hydra.errors import HydraException, MissingConfigException

    searchpath, skipped = _searchpath_overrides(written)
    try:
        with _placement_safe_yaml(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with initialize_config_dir(str(primary.parent.resolve()), version_base=_HYDRA_VERSION_BASE):
                cfg = compose(config_name=primary.stem, overrides=[*searchpath, *overrides])
    except yaml.MarkedYAMLError as error:  # in a sub-config: named by the mark, shown like the primary
        raise ConfigError(_describe_sub_config_yaml_error(primary, error)) from None
    except (HydraException, OmegaConfBaseException, yaml.YAMLError, ValueError) as error:
        message = f"{primary}: cannot compose the Hydra config: {_hydra_problem(error)}"
        if isinstance(error, MissingConfigException) and error.options:
            message += f" (available: {', '.join(error.options)})"
        if skipped:
            message += f". Skipped hydra.searchpath entries that do not resolve: {'; '.join(skipped)}"
        raise ConfigError(message) from None
    OmegaConf.set_struct(cfg, False)
    return cfg


def _searchpath_overrides(written: DictConfig) -> tuple[list[str], list[str]]:
    """A ``hydra.searchpath`` override without the entries that cannot be resolved, and those.

    Hydra resolves every ``hydra.searchpath`` entry before it composes anything, so RLinf's
    ``file://${oc.env:EMBODIED_PATH}/config/`` fails the whole composition when the variable is
    unset, even when every file needed is in the config's own directory. Dropping only such
    entries composes what can be composed; a default that needed one of them is then reported as
    missing, with the skipped entries named. No override when every entry resolves.
    """
    searchpath = OmegaConf.select(written, "hydra.searchpath", throw_on_resolution_failure=False)
    if not isinstance(searchpath, ListConfig):
        return [], []
    kept: list[str] = []
    skipped: list[str] = []
    raw = cast(list[Any], OmegaConf.to_container(searchpath, resolve=False))  # a ListConfig: a list
    for index, text in enumerate(raw):
        try:
            kept.append(str(searchpath[index]))
        except OmegaConfBaseException as error:
            skipped.append(f"{text!r} ({_problem(error)})")
    if not skipped:
        return [], []
    quoted = ",".join("'" + entry.replace("\\", "\\\\").replace("'", "\\'") + "'" for entry in kept)
    return [f"hydra.searchpath=[{quoted}]"], skipped


@contextmanager
def _placement_safe_yaml() -> Iterator[None]:
    """Hydra reads each file with ``OmegaConf.load``, which asks ``omegaconf._utils`` for its YAML
    loader at every call; while Hydra composes, that loader is the placement-safe one, so an
    unquoted ``1:0`` in any composed file stays "1:0" instead of becoming 60. Scoped to the
    composition and restored after it; a test fails if OmegaConf stops looking the loader up.
    """
    original = omegaconf._utils.get_yaml_loader
    omegaconf._utils.get_yaml_loader = lambda: _PlacementSafeLoader
    try:
        yield
    finally:
        omegaconf._utils.get_yaml_loader = original


def _hydra_problem(error: BaseException) -> str:
    """Hydra's message on one line, with the OmegaConf error behind it and the folders searched.

    Hydra wraps OmegaConf's errors, sometimes in an exception without a message; a missing
    config's message goes on for lines with the search path, of which the folders are kept.
    """
    text = "" if isinstance(error, OmegaConfBaseException) else str(error)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    problem = lines[0].rstrip(".") if lines else ""
    inner = error if isinstance(error, OmegaConfBaseException) else error.__cause__ or error.__context__
    if isinstance(inner, OmegaConfBaseException):
        problem = f"{problem}: {_problem(inner)}" if problem else _problem(inner)
    searched = re.findall(r"path=file://(\S+)", text)
    if searched:
        problem += f" (searched: {', '.join(searched)})"
    return problem or type(error).__name__


def _describe_sub_config_yaml_error(primary: Path, error: yaml.MarkedYAMLError) -> str:
    mark = error.problem_mark or error.context_mark
    path = Path(mark.name) if mark is not None else None
    if path is None or not path.is_file():
        return f"{primary}: cannot compose the Hydra config: YAML syntax error in one of its files: {error}"
    return _describe_yaml_error(path, _read_text(path), error)


# --- interpolations ------------------------------------------------------------------------------


def _resolved_section(where: str, cfg: DictConfig, name: str) -> Any:
    """Top-level section ``name`` as plain values, its interpolations resolved against ``cfg``."""
    raw = cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=False))[name]  # a DictConfig: a dict
    _resolve_all(where, cfg, {name: raw}, "")
    return to_plain(cfg[name])


def _resolve_all(where: str, node: DictConfig | ListConfig, raw: Any, path: str) -> None:
    """Read every value under ``node`` that ``raw`` (the same values, as written) lists, so that
    the first one that cannot be resolved is reported with its key path and its text.

    OmegaConf's own ``resolve`` does not say which key failed; reading key by key does.
    """
    items = raw.items() if isinstance(raw, dict) else enumerate(raw) if isinstance(raw, list) else ()
    for key, text in items:
        key_path = f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else str(key)
        try:
            value = node[key]
        except OmegaConfBaseException as error:
            raise ConfigError(_unresolvable(where, key_path, text, error)) from None
        if isinstance(value, DictConfig | ListConfig):
            # An interpolation may stand for a whole section; its values are checked as written.
            inner = text if isinstance(text, dict | list) else OmegaConf.to_container(value, resolve=False)
            _resolve_all(where, value, inner, key_path)


def _unresolvable(where: str, key_path: str, text: Any, error: OmegaConfBaseException) -> str:
    expected = next((hint for kind, hint in _EXPECTED.items() if isinstance(error, kind)), _RESOLVES)
    return f"{where}: {key_path}: cannot resolve {text!r}: {_problem(error)}; expected {expected}."


_RESOLVES = "an interpolation that resolves (${oc.env:NAME} needs NAME set, or a default: ${oc.env:NAME,x})"
_EXPECTED: dict[type[OmegaConfBaseException], str] = {
    UnsupportedInterpolationType: (
        "only OmegaConf's built-in resolvers (oc.env, oc.select, ...): resolvers that RLinf "
        "registers are not known here, so write the value itself"
    ),
    InterpolationKeyError: "a key that exists in the config (after Hydra composition)",
    InterpolationToMissingValueError: "a value instead of '???'",
    MissingMandatoryValue: "a value instead of '???'",
}


def _problem(error: OmegaConfBaseException) -> str:
    """OmegaConf's message without its trailer (full_key, object_type) and its wrapping."""
    lines = str(error.msg or error).strip().splitlines()
    first = _WRAPPED.sub(r"\1", lines[0]) if lines else ""
    return first or type(error).__name__


# A resolver's own exception, as OmegaConf words it: KeyError raised while resolving interpolation: "..."
_WRAPPED = re.compile(r'^\w+ raised while resolving interpolation: "?(.*?)"?$')


def _require_cluster(where: str, cfg: Mapping[str, Any]) -> None:
    cluster = cfg.get("cluster")
    if cluster is None:
        raise ConfigError(
            f"{where}: the config has no 'cluster' section. rlinfra reads cluster.num_nodes, "
            "cluster.component_placement and, optionally, cluster.node_groups from it."
        )
    if not isinstance(cluster, Mapping):
        raise ConfigError(
            f"{where}: 'cluster' is {type(cluster).__name__}, not a mapping; expected num_nodes, "
            "component_placement and, optionally, node_groups under it."
        )
