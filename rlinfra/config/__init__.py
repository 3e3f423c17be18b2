"""The lowest layer: reading a user's config (YAML, Hydra composition, overrides) and validating
it against declared schemas, with one error type that names the key, the text and what was
expected. Every other layer — placement, the driver, the CLI, a job — reads config through here."""

from rlinfra.config.errors import ConfigError, JobConfigError, Span, did_you_mean
from rlinfra.config.schema import Section, parse, parse_config, to_plain

__all__ = [
    "ConfigError",
    "JobConfigError",
    "Section",
    "Span",
    "did_you_mean",
    "parse",
    "parse_config",
    "to_plain",
]
