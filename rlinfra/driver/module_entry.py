"""A job package's own entry point, ``python -m <package> [--config-name NAME] [--resume] [OVERRIDE ...]``:
Hydra composes the config from the package's folder (``rlinfra.config.loading``: Hydra's full
override grammar, the placement-safe YAML reading) and the job's ``main(cfg, resume=...)`` runs
it, as ``rlinfra run`` would. A package's ``__main__`` is one call:
``sys.exit(run_module(Path(__file__).parent, "package.job:JobClass"))``."""

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

from rlinfra.config import ConfigError
from rlinfra.config.loading import load_config

from .entry import USAGE_ERROR  # a config that cannot be composed is the user's to fix


def run_module(config_dir: Path, job: str, argv: Sequence[str] | None = None) -> int:
    """Parse the command line, compose the config, run ``job``'s ``main(cfg, resume=...)`` (``job``:
    ``"module:JobClass"``, imported only once the command line is parsed, so ``--help`` is
    instant) and return its exit status; a config that cannot be composed is printed as one line
    and returns ``USAGE_ERROR``."""
    module, name = job.split(":")
    parser = argparse.ArgumentParser(prog=f"python -m {module.rpartition('.')[0]}")
    parser.add_argument("--config-name", default="disaggregated", help=f"a YAML file in {config_dir}")
    parser.add_argument("--resume", action="store_true", help="continue from run.output_dir's checkpoint")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. run.output_dir=/tmp/run")
    args = parser.parse_args(None if argv is None else list(argv))
    try:
        cfg = load_config(config_dir, args.config_name, args.overrides)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return USAGE_ERROR
    return int(getattr(importlib.import_module(module), name).main(cfg, resume=args.resume))
