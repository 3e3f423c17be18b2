"""A job's own config sections (``algo``, ``run`` …), parsed once into typed records.

Each section is an OmegaConf structured config over a frozen dataclass: OmegaConf checks every
key against the dataclass and every value against the field's type; this module turns its errors
into one ``JobConfigError`` per mistake, named by key (with the nearest valid key for a typo), and
checks the ranges a type cannot say, declared as plain field metadata (so a config dataclass
need not import rlinfra):

    updates: int = field(default=400, metadata={"at_least": 1})
    transport: str = field(default="object_store", metadata={"one_of": (...), "why": "..."})

``RANGES`` names the rules; ``why`` is said after what was expected. ``parse_config`` parses a
dataclass of sections at once. ``cluster`` (parsed by ``Cluster`` and ``ComponentPlacement``) and
``name`` (the run's, in the curve's title) are rlinfra's; every other top-level key is refused, so
nothing a user writes is ignored.
"""

from __future__ import annotations

import dataclasses
import operator
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from rlinfra.placement.config_access import reject_unknown_keys, to_plain
from rlinfra.placement.errors import PlacementError

T = TypeVar("T")
RANGES = {  # field metadata key -> (whether a value meets the bound, what was expected)
    "at_least": (operator.ge, "at least {}"),
    "above": (operator.gt, "above {}"),
    "one_of": (lambda value, options: value in options, "one of {}"),
}


class JobConfigError(PlacementError):
    """A mistake in a job's own config (a section, a key, a value), named by key; said as the
    placement's own config errors are (the key, the problem, what was expected)."""


def check_sections(cfg: Mapping[str, Any], sections: Sequence[str]) -> None:
    """Refuse the first top-level key that is not one of ``sections``."""
    reject_unknown_keys(cfg, sections, None, "section", JobConfigError)


def parse_config(schema: type[T], cfg: Mapping[str, Any]) -> T:
    """``cfg`` as ``schema``: a dataclass with one field per section, each a dataclass parsed by
    ``parse_section``; a top-level key that is none of them (nor ``cluster``, ``name``) is refused."""
    sections = [spec.name for spec in dataclasses.fields(schema)]  # type: ignore[arg-type]
    check_sections(cfg, ("cluster", "name", *sections))
    hints = typing.get_type_hints(schema)
    return schema(**{section: parse_section(hints[section], cfg, section) for section in sections})


def parse_section(schema: type, cfg: Mapping[str, Any], name: str) -> Any:
    """Section ``name`` merged over ``schema``'s defaults (an absent or empty section is all
    defaults), by OmegaConf's type rules: ``"5"`` is a fine int, ``1.5`` is not; a switch must be
    ``true`` or ``false`` (OmegaConf would read ``2`` or ``"yes"`` as true); then each field's range."""
    section = to_plain(cfg.get(name)) or {}
    if not isinstance(section, Mapping):
        raise JobConfigError(f"{name}: expected a mapping, got {section!r}")
    _check_keys(schema, section, name)
    base = _writable(OmegaConf.structured(schema))
    try:
        record = OmegaConf.to_object(OmegaConf.merge(base, section))
    except ValidationError as error:
        wanted: Any = schema  # the field's type, down through nested sections
        for part in str(error.full_key).split("."):
            wanted = typing.get_type_hints(wanted).get(part) if dataclasses.is_dataclass(wanted) else None
        expected = getattr(wanted, "__name__", str(wanted))
        raise JobConfigError(
            f"{name}.{error.full_key}: expected {expected}, got {to_plain(error.value)!r}"
        ) from None
    _check_ranges(record, name)
    return record


def _check_ranges(record: Any, where: str) -> None:
    """Each field's value within the range its metadata declares, down through nested sections."""
    for spec in dataclasses.fields(record):
        value = getattr(record, spec.name)
        for rule in RANGES.keys() & spec.metadata.keys():
            meets, expected = RANGES[rule]
            bound, why = spec.metadata[rule], spec.metadata.get("why")
            if not meets(value, bound):
                because = f" ({why})" if why else ""
                raise JobConfigError(
                    f"{where}.{spec.name}: got {value!r}; expected {expected.format(bound)}{because}"
                )
        if dataclasses.is_dataclass(value):
            _check_ranges(value, f"{where}.{spec.name}")


def _writable(node: Any) -> Any:
    """``node`` and every section nested in it made writable: a frozen dataclass gives a read-only
    config (each nested one its own flag), into which nothing merges."""
    OmegaConf.set_readonly(node, None)
    for key in node:
        if not OmegaConf.is_missing(node, key) and OmegaConf.is_config(node[key]):
            _writable(node[key])
    return node


def _check_keys(schema: Any, section: Mapping[str, Any], where: str) -> None:
    """Every key of ``section`` and of the sections nested in it is a field (else named, with the
    nearest), and a switch is ``true`` or ``false``: OmegaConf reads ``2`` or ``"yes"`` as true."""
    fields = [spec.name for spec in dataclasses.fields(schema)]
    reject_unknown_keys(section, fields, where, "key", JobConfigError)
    hints = typing.get_type_hints(schema)
    for key, value in section.items():
        wanted = hints.get(str(key))
        if wanted is bool and not isinstance(value, bool):
            raise JobConfigError(f"{where}.{key}: expected true or false, got {value!r}")
        if dataclasses.is_dataclass(wanted) and isinstance(value, Mapping):
            _check_keys(wanted, value, f"{where}.{key}")
