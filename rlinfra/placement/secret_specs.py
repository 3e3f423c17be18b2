"""``cluster.secrets``: where each secret comes from, as records (the values are read at launch).

    secrets:
      HF_TOKEN: {from_env: HF_TOKEN}                 # the driver's environment
      WANDB_API_KEY: {from_file: ~/.wandb_key, expose_as_env: true}

Only the record lives here (``rlinfra.placement.config`` parses the section into it, so that a
worker reading a record never loads the schema library); reading the values and handing them to
workers outside Ray's records is the runtime's job (``rlinfra.runtime.secrets``).
"""

from dataclasses import dataclass


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
