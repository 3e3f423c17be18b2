"""``python -m examples.ppo_cartpole [--config-name NAME] [--resume] [OVERRIDE ...]``

Hydra composes the config from this folder (``disaggregated`` by default), so every Hydra
override works: ``algo.iterations=50``, ``run.output_dir=/tmp/ppo``, ``+algo.ent_coef=0.0``.
Run it from the repository root (Ray's workers import ``examples`` from the driver's directory).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rlinfra import driver
from rlinfra.config.loading import load_config

HERE = Path(__file__).resolve().parent


def compose_config(name: str, overrides: Sequence[str]) -> Any:
    """The config ``name`` from this folder with Hydra overrides applied (Hydra's full grammar)."""
    return load_config(HERE, name, overrides)


def _job_main() -> Callable[..., int]:
    from examples.ppo_cartpole.job import main

    return main


def main(argv: Sequence[str] | None = None) -> int:
    prog = "python -m examples.ppo_cartpole"
    return driver.run_module(HERE, prog, __doc__, _job_main, argv, "algo.iterations=50")


if __name__ == "__main__":
    sys.exit(main())
