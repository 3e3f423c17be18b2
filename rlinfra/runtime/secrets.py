"""Secrets for workers through a channel Ray does not record.

Ray writes a ``runtime_env`` in plain text to the job and actor tables (``ray list actors
--detail``, the dashboard) and to ``runtime_env_agent.log``; so do env vars passed any other
recorded way. Secrets take another road:

    cluster:
      secrets:
        HF_TOKEN: {from_env: HF_TOKEN}                 # the driver's environment
        WANDB_API_KEY: {from_file: ~/.wandb_key, expose_as_env: true}

At launch the driver reads the values (here, never in a worker), ``ray.put``s them once as one
object and hands workers only its ``ObjectRef``, inside their ``WorkerContext``. A worker resolves
the reference while binding its context and serves ``self.secret("HF_TOKEN")``; names marked
``expose_as_env`` are also set in that worker process's ``os.environ`` — inside the process,
never in a runtime_env. Object contents are not logged, and the object dies with the group.
Error messages name secrets and where they come from, never their values.
"""

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlinfra.placement.secret_specs import SecretSpec

# The secrets of this worker process, kept off the worker instance so that they are not in its
# ``__dict__`` (pickled, printed by debuggers) and reach fused roles too; one worker per process.
_received: dict[str, str] = {}


class SecretError(ValueError):
    """A configured secret cannot be read on the driver (unset variable, unreadable file)."""


@dataclass(frozen=True)
class SecretsChannel:
    """What workers receive: a reference to the values, and the names to set as env vars. Its
    repr names the secrets only (it travels in every worker's context and error messages)."""

    ref: Any = field(repr=False)
    names: tuple[str, ...]
    expose_as_env: tuple[str, ...] = ()


def read_secrets(specs: tuple[SecretSpec, ...], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The values, read on the driver; ``SecretError`` names what is missing, never a value."""
    environ = os.environ if environ is None else environ
    values = {}
    for spec in specs:
        if spec.from_env is not None:
            value = environ.get(spec.from_env)
            if not value:
                raise SecretError(
                    f"secret {spec.name!r}: environment variable {spec.from_env} is "
                    f"{'empty' if value == '' else 'not set'} on the driver"
                )
        else:
            path = Path(str(spec.from_file)).expanduser()
            try:
                value = path.read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as error:
                raise SecretError(
                    f"secret {spec.name!r}: cannot read {path}: {getattr(error, 'strerror', None) or error}"
                ) from None
            if not value:
                raise SecretError(f"secret {spec.name!r}: {path} is empty")
        values[spec.name] = value
    return values


def publish_secrets(specs: tuple[SecretSpec, ...]) -> SecretsChannel | None:
    """Read the secrets and put them in Ray's object store once; ``None`` when there are none.
    The caller keeps the channel (its ``ObjectRef``) alive as long as its workers may start."""
    if not specs:
        return None
    import ray

    values = read_secrets(specs)
    exposed = tuple(spec.name for spec in specs if spec.expose_as_env)
    return SecretsChannel(ray.put(values), tuple(values), exposed)


def receive_secrets(channel: SecretsChannel, timeout: float) -> None:
    """Worker side: resolve ``channel`` into this process's secrets, and set the
    ``expose_as_env`` ones in ``os.environ``."""
    import ray

    _received.clear()
    _received.update(ray.get(channel.ref, timeout=timeout))
    for name in channel.expose_as_env:
        os.environ[name] = _received[name]


def received_secret(name: str) -> str:
    """Worker side: the value of secret ``name`` received by this process."""
    if name not in _received:
        known = ", ".join(sorted(_received)) or "none (cluster.secrets is empty)"
        raise KeyError(f"no secret {name!r} in this worker; secrets: {known}")
    return _received[name]
