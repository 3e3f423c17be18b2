"""``cluster.secrets``: where each secret comes from, as records (the values are read at launch).

    secrets:
      HF_TOKEN: {from_env: HF_TOKEN}                 # the driver's environment
      WANDB_API_KEY: {from_file: ~/.wandb_key, expose_as_env: true}

Only the schema lives here, with the rest of the config; reading the values and handing them to
workers outside Ray's records is the runtime's job (``rlinfra.runtime.secrets``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field

from rlinfra.config import Section, parse
from rlinfra.placement.config_access import as_mapping
from rlinfra.placement.env_vars import ENV_NAME
from rlinfra.placement.errors import PlacementError


@dataclass(frozen=True)
class SecretSpec:
    """Where one secret comes from: ``from_env`` (a driver variable) or ``from_file`` (a path on
    the driver's machine); ``expose_as_env`` also sets it in the worker process's environment."""

    name: str
    from_env: str | None = None
    from_file: str | None = None
    expose_as_env: bool = False

    def describe(self) -> str:
        origin = f"from_env {self.from_env}" if self.from_env else f"from_file {self.from_file}"
        return origin + (", exposed as env" if self.expose_as_env else "")


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
