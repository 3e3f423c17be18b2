"""A job package's own entry point, ``python -m <package> [--config-name NAME] [--resume] [OVERRIDE ...]``:
Hydra composes the config from the package's folder (``rlinfra.config.loading``: Hydra's full
override grammar, the placement-safe YAML reading) and
the job's ``main(cfg, resume=...)`` runs it, as ``rlinfra run`` would. Both bundled main jobs'
``__main__`` modules are this, with their folder and their job."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from rlinfra.config import ConfigError
from rlinfra.config.loading import load_config

from .entry import USAGE_ERROR  # a config that cannot be composed is the user's to fix


def run_module(
    config_dir: Path,
    prog: str,
    description: str | None,
    job_main: Callable[[], Callable[..., int]],
    argv: Sequence[str] | None = None,
    example_override: str = "algo.seed=1",
) -> int:
    """Parse the command line, compose the config, run ``job_main()(cfg, resume=...)`` and return
    its exit status; a config that cannot be composed is printed as one line and returns
    ``USAGE_ERROR``. ``job_main`` returns the job's main function (imported only once the command
    line is parsed, so ``--help`` is instant)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config-name", default="disaggregated", help=f"a YAML file in {config_dir}")
    parser.add_argument("--resume", action="store_true", help="continue from run.output_dir's checkpoint")
    parser.add_argument("overrides", nargs="*", help=f"Hydra overrides, e.g. {example_override}")
    args = parser.parse_args(None if argv is None else list(argv))

    try:
        cfg = load_config(config_dir, args.config_name, args.overrides)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return USAGE_ERROR
    return job_main()(cfg, resume=args.resume)
