"""A job's config as a table (``rlinfra run CONFIG --show-config``): every key of every section,
its value after the YAML and the overrides, its default, type and allowed values, read from the
job's declared schema, so what the table says is what the run checks."""

import typing
from typing import Any

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel
from pydantic_core import PydanticUndefined
from rich.table import Table
from rich.text import Text

from rlinfra.views.tables import titled_table

_BOUNDS = ((Ge, "ge", "≥"), (Gt, "gt", ">"), (Le, "le", "≤"), (Lt, "lt", "<"))


def config_table(config: BaseModel, title: str) -> Table:
    """One row per key of each section of ``config`` (a job's parsed ``JobConfig``)."""
    table = titled_table(
        Text(title, style="bold"), None, "key", "value", "default", "type", "allowed", "about"
    )
    for name, section in config:
        for key, spec in type(section).model_fields.items():
            default = "(required)" if spec.default is PydanticUndefined else repr(spec.default)
            table.add_row(
                f"{name}.{key}",
                repr(getattr(section, key)),
                default,
                *_type_and_allowed(spec.annotation, spec.metadata),
                spec.description or "",
            )
    return table


def _type_and_allowed(annotation: Any, metadata: list[Any]) -> tuple[str, str]:
    if typing.get_origin(annotation) is typing.Literal:
        return "choice", ", ".join(repr(choice) for choice in typing.get_args(annotation))
    bounds = [
        f"{sign} {getattr(item, field)}"
        for item in metadata
        for kind, field, sign in _BOUNDS
        if isinstance(item, kind)
    ]
    name = getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")
    return name, ", ".join(bounds)
