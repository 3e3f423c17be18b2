"""The lowest layer: reading a user's config (YAML, Hydra composition, overrides) and validating
it against declared schemas, with one error type that names the key, the text and what was
expected. Every other layer — placement, the driver, the CLI, a job — reads config through here.

The schemas (pydantic) are loaded on first use: a worker process that only reads parsed records
never imports pydantic.
"""

from typing import TYPE_CHECKING

from rlinfra.config.errors import ConfigError, JobConfigError, Span, did_you_mean, reject_unknown
from rlinfra.config.plain import to_plain
from rlinfra.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from rlinfra.config.schema import Section as Section
    from rlinfra.config.schema import parse as parse
    from rlinfra.config.schema import parse_config as parse_config

_SCHEMA_NAMES = ("Section", "parse", "parse_config")
__getattr__ = lazy_exports(__name__, dict.fromkeys(_SCHEMA_NAMES, "rlinfra.config.schema"))

__all__ = [
    "ConfigError", "JobConfigError", "Section", "Span", "did_you_mean", "parse", "parse_config",
    "reject_unknown", "to_plain",
]  # fmt: skip
