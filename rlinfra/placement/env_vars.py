"""``env_vars`` sections of the config: parsing, path-like merging, and refusing credentials.

Two places in the YAML take ``env_vars`` — a node group's ``env_configs`` entries and a component's
mapping form — in either of RLinf's spellings: a mapping, or a list of one-key mappings. A value
may also be written ``{value: ..., merge: false}`` to make a path-like variable (``PATH``,
``PYTHONPATH``, ``LD_LIBRARY_PATH``) overwrite the layers below it instead of being prepended.

Everything in ``env_vars`` ends up where Ray or a log may record it, so values that look like
credentials are refused here, at parse time, with a message that says to use ``cluster.secrets``.
"""

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from rlinfra.placement.config_access import as_mapping, require_bool
from rlinfra.placement.errors import PlacementError

# Variables whose value is a list of directories: layers prepend to them instead of replacing them.
PATH_VARIABLES = frozenset({"PATH", "PYTHONPATH", "LD_LIBRARY_PATH"})
PATH_SEPARATOR = ":"

# Name parts that mark a credential: HF_TOKEN, WANDB_API_KEY, AWS_SECRET_ACCESS_KEY, DB_PASSWORD …
_CREDENTIAL_PARTS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS")
# … unless the name says the value only points at one (HF_TOKEN_PATH, SSH_KEY_FILE).
_POINTER_SUFFIXES = ("PATH", "FILE", "DIR", "HOME")
# Values that are switches, not credentials (e.g. WANDB_DISABLE_KEY=1 would be harmless).
_SWITCH_VALUES = frozenset({"", "0", "1", "true", "false", "yes", "no", "on", "off", "none"})
URL_WITH_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/@\s:]*:[^/@\s]+@")
_NAME_PARTS = re.compile(r"[^A-Za-z0-9]+")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a portable environment variable name

SECRETS_HINT = (
    "pass it as a secret instead: cluster.secrets: {{{name}: {{from_env: {name}}}}} (or from_file: PATH); "
    "workers read it with self.secret({name!r}), or add expose_as_env: true to set it in the worker "
    "process's environment"
)


class EnvVars(Mapping[str, str]):
    """One ``env_vars`` section: name → value, plus the path-like names that overwrite
    (``merge: false``) instead of merging. Read-only, so a parsed config cannot be changed by
    whoever composes an environment from it."""

    __slots__ = ("_values", "replace")

    def __init__(self, values: Mapping[str, str] | None = None, replace: Iterable[str] = ()) -> None:
        self._values = dict(values or {})
        self.replace = frozenset(replace)

    def __getitem__(self, name: str) -> str:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __hash__(self) -> int:
        return hash((frozenset(self._values.items()), self.replace))

    def __repr__(self) -> str:
        replace = f", replace={sorted(self.replace)}" if self.replace else ""
        return f"EnvVars({self._values!r}{replace})"


NO_ENV_VARS = EnvVars()


def credential_reason(name: str, value: str) -> str | None:
    """Why ``name=value`` looks like a credential that must not travel in plain text, or None.

    A URL carrying ``user:password@`` is one whatever its name. A name is one when a part of it
    (split at ``_``, ``-``, ``.``) is or ends with TOKEN, KEY, SECRET, PASSWORD, PASSWD or
    CREDENTIAL(S) — ``HF_TOKEN``, ``WANDB_API_KEY``, ``APIKEY`` — unless the value is a switch
    (``1``, ``false``) or the name ends in PATH, FILE, DIR or HOME (it points at a secret).
    ``TOKENIZERS_PARALLELISM`` is not one: parts are compared whole or as a suffix. Erring towards
    refusal is deliberate: a refused variable costs a rename, a leaked token a rotation.
    """
    if URL_WITH_PASSWORD.search(value):
        return "its value is a URL with a user:password part"
    if value.strip().lower() in _SWITCH_VALUES:
        return None
    parts = [part.upper() for part in _NAME_PARTS.split(name) if part]
    if not parts or parts[-1] in _POINTER_SUFFIXES:
        return None
    if any(part.endswith(_CREDENTIAL_PARTS) for part in parts):
        return "its name says it holds a credential"
    return None


def looks_like_secret(name: str, value: str) -> bool:
    """Whether ``name=value`` looks like a credential (see ``credential_reason``)."""
    return credential_reason(name, value) is not None


def refuse_credential(name: str, value: str, where: str) -> None:
    """Raise ``PlacementError`` if ``name=value`` looks like a credential; the message names the
    variable and the safe way to pass it, and never repeats the value."""
    why = credential_reason(name, value)
    if why is None:
        return
    raise PlacementError(
        f"variable {name!r} looks like a credential ({why}); env_vars are recorded in plain text "
        "(Ray's runtime_env, job info, logs), so it is refused",
        where=where,
        expected=SECRETS_HINT.format(name=name),
    )


def merge_paths(higher: str, lower: str | None) -> str:
    """``higher``'s entries, then ``lower``'s that are new; empty entries are dropped (an empty
    ``PYTHONPATH`` entry would mean the working directory)."""
    entries = [*higher.split(PATH_SEPARATOR), *(lower or "").split(PATH_SEPARATOR)]
    return PATH_SEPARATOR.join(dict.fromkeys(entry for entry in entries if entry))


def parse_env_vars(raw: Any, where: str) -> EnvVars:
    """``env_vars`` as a mapping, or RLinf's list of one-key mappings; a value is a scalar or
    ``{value: ..., merge: false}`` for a path-like variable that should overwrite."""
    if raw is None:
        return NO_ENV_VARS
    if isinstance(raw, list):
        entries = [as_mapping(entry, f"{where}[{index}]") for index, entry in enumerate(raw)]
    else:
        entries = [as_mapping(raw, where, expected="NAME: value pairs")]
    items = [item for entry in entries for item in entry.items()]
    env: dict[str, str] = {}
    merges: dict[str, bool] = {}  # a name given twice: the later entry wins, merge included
    for name, value in items:
        if not isinstance(name, str) or not name or "=" in name:
            raise PlacementError(f"bad variable name {name!r}", where=where)
        env[name], merges[name] = _value_and_merge(name, value, where)
        refuse_credential(name, env[name], where)
    return EnvVars(env, replace=[name for name, merge in merges.items() if not merge])


def _value_and_merge(name: str, value: Any, where: str) -> tuple[str, bool]:
    expected = "a string or number, or {value: ..., merge: false} for " + "/".join(sorted(PATH_VARIABLES))
    merge = True
    if isinstance(value, Mapping) and "value" in value and set(value) <= {"value", "merge"}:
        merge = require_bool(value.get("merge", True), f"{where}.{name}.merge")
        if "merge" in value and name not in PATH_VARIABLES:
            raise PlacementError(
                f"variable {name!r} is not path-like, so it cannot merge", where=where, expected=expected
            )
        value = value["value"]
    if isinstance(value, (Mapping, list)) or value is None:
        raise PlacementError(f"variable {name!r} has no scalar value", where=where, expected=expected)
    return str(value), merge
