"""A job's own config sections (``algo``, ``run`` …), parsed once into typed records.

Each section is an OmegaConf structured config over a frozen dataclass: OmegaConf checks every
key against the dataclass and every value against the field's type; this module turns its errors
into one ``JobConfigError`` per mistake, named by key (with the nearest valid key for a typo), and
offers ``require`` for the ranges a type cannot say. ``cluster`` is rlinfra's own section (parsed
by ``Cluster`` and ``ComponentPlacement``); ``check_sections`` refuses every top-level key a job
does not read, so nothing a user writes is ignored.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from rlinfra.placement.config_access import did_you_mean, to_plain


class JobConfigError(ValueError):
    """A mistake in a job's own config (a section, a key, a value), named by key."""


def check_sections(cfg: Mapping[str, Any], sections: Sequence[str]) -> None:
    """Refuse the first top-level key that is not one of ``sections``."""
    unknown = [str(key) for key in cfg if key not in sections]
    if unknown:
        raise unknown_key(unknown[0], unknown[0], "section", sections)


def parse_section(schema: type, cfg: Mapping[str, Any], name: str) -> Any:
    """Section ``name`` merged over ``schema``'s defaults (an absent or empty section is all
    defaults), by OmegaConf's type rules: ``"5"`` is a fine int, ``1.5`` is not; a switch must be
    ``true`` or ``false`` (OmegaConf would read ``2`` or ``"yes"`` as true)."""
    section = to_plain(cfg.get(name)) or {}
    if not isinstance(section, Mapping):
        raise JobConfigError(f"{name}: expected a mapping, got {section!r}")
    hints = typing.get_type_hints(schema)
    for key, value in section.items():
        if hints.get(str(key)) is bool and not isinstance(value, bool):  # OmegaConf reads 2 as true
            raise JobConfigError(f"{name}.{key}: expected true or false, got {value!r}")
    base = OmegaConf.structured(schema)
    OmegaConf.set_readonly(base, False)  # a frozen dataclass gives a read-only config: nothing merges
    try:
        return OmegaConf.to_object(OmegaConf.merge(base, section))
    except ConfigKeyError as error:
        fields = [f.name for f in dataclasses.fields(schema)]
        raise unknown_key(f"{name}.{error.key}", str(error.key), "key", fields) from None
    except ValidationError as error:
        expected = hints[str(error.key)]
        name_of = getattr(expected, "__name__", str(expected))
        raise JobConfigError(
            f"{name}.{error.key}: expected {name_of}, got {to_plain(error.value)!r}"
        ) from None


def unknown_key(where: str, key: str, kind: str, allowed: Sequence[str]) -> JobConfigError:
    """Typos would otherwise be silently ignored: name the key and the nearest valid one."""
    hint = did_you_mean(key, allowed)
    hint = f"{hint} " if hint else ""
    return JobConfigError(f"{where}: unknown {kind}; {hint}expected one of {', '.join(allowed)}")


def require(ok: bool, key: str, value: Any, expected: str) -> None:
    """Raise ``JobConfigError`` naming ``key``, the value and what was expected, unless ``ok``."""
    if not ok:
        raise JobConfigError(f"{key}: got {value!r}; expected {expected}")


__all__ = ["JobConfigError", "check_sections", "parse_section", "require", "unknown_key"]
