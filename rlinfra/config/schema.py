"""Declared config schemas (pydantic v2 models), their mistakes said the rlinfra way.

A section is a ``Section``: frozen, every key declared, ranges and choices as pydantic declares
them (``Field(ge=1)``, ``Literal["hf", "vllm"]``), a field's ``description`` said after what was
expected. ``parse`` validates a mapping against one and turns pydantic's first error into one
``ConfigError`` with the full key path:

    algo.updates: got 0; expected at least 1
    run: unknown key 'transprt'; did you mean 'transport'?
      expected: one of 'entrypoint', 'output_dir', ...

A validator may raise a ``ConfigError`` itself (with a caret under the text it refuses); its
``where`` is then read below the key the validator checked.
"""

from collections.abc import Mapping
from typing import Any, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from rlinfra.config.errors import ConfigError, JobConfigError, reject_unknown, unknown_key
from rlinfra.config.plain import to_plain

M = TypeVar("M", bound=BaseModel)
_TYPE_NAMES = {bool: "true or false", int: "int", float: "float", str: "str"}
_BOUNDS = {"ge": "at least", "gt": "above", "le": "at most", "lt": "below"}


class Section(BaseModel):
    """A config section: frozen, every key declared, numbers finite. A switch is ``true`` or
    ``false`` and never a number (pydantic alone reads ``1`` as true and ``true`` as 1)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _switches_are_not_numbers(cls, data: Any) -> Any:
        fields = {spec.alias or name: spec for name, spec in cls.model_fields.items()}  # as written
        for name, value in data.items() if isinstance(data, Mapping) else ():
            wanted = _scalar(fields[name].annotation) if name in fields else None
            if wanted in (bool, int, float) and isinstance(value, bool) != (wanted is bool):
                raise ConfigError(f"expected {_TYPE_NAMES[wanted]}, got {value!r}", where=str(name))
        return data


def _scalar(annotation: Any) -> Any:
    """``int`` for ``int | None`` (a section for an optional section); any other annotation as it is."""
    args = get_args(annotation)
    return args[0] if len(args) == 2 and args[1] is type(None) else annotation


def parse(schema: type[M], raw: Any, where: str | None, error: type[ConfigError] = ConfigError) -> M:
    """``raw`` (a mapping or ``DictConfig``; None: every default) as ``schema``, or one ``error``
    naming the first mistake by its key path under ``where``."""
    plain = to_plain(raw)
    try:
        return schema.model_validate({} if plain is None else plain)
    except ValidationError as failure:  # an unknown key first: a typo is why another one is missing
        errors = sorted(failure.errors(), key=lambda detail: detail["type"] != "extra_forbidden")
        raise _explained(errors[0], schema, where, error) from None


def parse_config(schema: type[M], cfg: Mapping[str, Any]) -> M:
    """A job's config as ``schema``: a model with one field per section of the job's own, each a
    ``Section`` (an absent or empty one: every default). ``cluster`` is placement's and ``name``
    the run's; any other top-level key is refused by name. Errors are ``JobConfigError``s."""
    reject_unknown(cfg, ("cluster", "name", *schema.model_fields), None, "section", JobConfigError)
    sections = {name: {} if cfg.get(name) is None else cfg[name] for name in schema.model_fields}
    return parse(schema, sections, None, JobConfigError)


def _explained(
    detail: Any, schema: type[BaseModel], where: str | None, error: type[ConfigError]
) -> ConfigError:
    """Pydantic's error ``detail`` as the ``ConfigError`` a user reads."""
    given_loc = detail["loc"]
    loc = tuple(part for part in given_loc[:-1] if not _is_type_tag(part))
    # The union branches pydantic tried are dropped from the path, but an unknown key is the
    # user's own, whatever it looks like (``[``, ``int``).
    if given_loc and (detail["type"] == "extra_forbidden" or not _is_type_tag(given_loc[-1])):
        loc += (given_loc[-1],)
    path = _path(where, loc)
    raised = (detail.get("ctx") or {}).get("error")
    if isinstance(raised, ConfigError):  # from a validator, its ``where`` relative to the key checked
        kind = error if type(raised) is ConfigError else type(raised)
        joint = "" if not raised.where or raised.where.startswith("[") else "."
        where = f"{path or ''}{joint if path else ''}{raised.where or ''}" or None
        return kind(raised.problem, where=where, text=raised.text, span=raised.span, expected=raised.expected)
    kind, given = detail["type"], detail.get("input")
    if kind == "extra_forbidden":
        allowed = [spec.alias or name for name, spec in _model_at(schema, loc[:-1]).model_fields.items()]
        return unknown_key(str(loc[-1]), allowed, _path(where, loc[:-1]), error=error)
    field = _model_at(schema, loc[:-1]).model_fields.get(str(loc[-1])) if loc else None
    if kind == "missing":
        wanted = f"{loc[-1]}: {field.description}" if field is not None and field.description else None
        return error(f"missing {loc[-1]!r}", where=_path(where, loc[:-1]), expected=wanted)
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return error(f"expected a mapping, got {given!r}", where=path)
    why = f" ({field.description})" if field is not None and field.description else ""
    bound = next((key for key in _BOUNDS if key in (detail.get("ctx") or {})), None)
    if bound is not None:
        return error(f"got {given!r}; expected {_BOUNDS[bound]} {detail['ctx'][bound]:g}{why}", where=path)
    if kind == "literal_error" and field is not None:
        return error(f"got {given!r}; expected one of {get_args(field.annotation)!r}{why}", where=path)
    wanted = next((name for prefix, name in _KINDS.items() if kind.startswith(prefix)), None)
    if wanted is not None:
        return error(f"expected {wanted}, got {given!r}{why}", where=path)
    message = str(detail["msg"]).removeprefix("Value error, ")
    return error(f"got {given!r}; {message[:1].lower()}{message[1:]}{why}", where=path)


_KINDS = {"int_": "int", "float_": "float", "bool_": "true or false", "string_type": "str"}


def _path(where: str | None, loc: tuple[Any, ...]) -> str | None:
    path = where or ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path or None


def _is_type_tag(part: Any) -> bool:
    """Pydantic names the branch of a union it tried (``'function-after[...]'``, ``'int'``)."""
    return isinstance(part, str) and ("[" in part or part in _TYPE_NAMES.values())


def _model_at(schema: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel]:
    for part in loc:
        field = schema.model_fields.get(str(part))
        annotation = _scalar(field.annotation) if field is not None else None
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            schema = annotation
    return schema
