"""``python -m examples.grpo_lm [--config-name NAME] [--resume] [OVERRIDE ...]``

Hydra composes the config from this folder (``disaggregated`` by default), so every Hydra
override works: ``algo.updates=50``, ``run.output_dir=/tmp/ppo``, ``algo.kl_coef=0.02``.
Run it from the repository root (Ray's workers import ``examples`` from the driver's directory).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def compose_config(name: str, overrides: list[str]) -> Any:
    """The config ``name`` from this folder with Hydra overrides applied (Hydra's full grammar)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(HERE), version_base=None):
        return compose(config_name=name, overrides=overrides)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.grpo_lm", description=__doc__)
    parser.add_argument("--config-name", default="disaggregated", help="a YAML file in examples.grpo_lm")
    parser.add_argument("--resume", action="store_true", help="continue from run.output_dir's checkpoint")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. algo.updates=50")
    args = parser.parse_args(argv)

    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from examples.grpo_lm.job import USAGE_ERROR
    from examples.grpo_lm.job import main as run_job

    try:
        cfg = compose_config(args.config_name, args.overrides)
    except (HydraException, OmegaConfBaseException) as error:
        print(f"error: {error}", file=sys.stderr)
        return USAGE_ERROR
    return run_job(cfg, resume=args.resume)


if __name__ == "__main__":
    sys.exit(main())
