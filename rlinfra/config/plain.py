"""A config as plain Python values: OmegaConf containers resolved into dicts and lists."""

import sys
from typing import Any

from rlinfra.config.errors import ConfigError


def to_plain(value: Any) -> Any:
    """Resolve OmegaConf containers into dicts and lists; leave everything else as it is.

    A broken interpolation (``${missing}``, an unset ``${oc.env:X}``) is bad input like any other,
    so it becomes a ``ConfigError`` naming the key rather than OmegaConf's own exception.
    OmegaConf is not imported here: a container of it exists only where it was (a worker process,
    which parses nothing, never loads it).
    """
    omegaconf = sys.modules.get("omegaconf")
    if omegaconf is not None and isinstance(value, (omegaconf.DictConfig, omegaconf.ListConfig)):
        try:
            return omegaconf.OmegaConf.to_container(value, resolve=True)
        except omegaconf.errors.OmegaConfBaseException as error:
            problem = str(error.msg).splitlines()[0] if error.msg else type(error).__name__
            raise ConfigError(
                f"cannot resolve the config: {problem}",
                where=error.full_key or "config",
                expected="interpolations (${...}) that resolve",
            ) from None
    return value
