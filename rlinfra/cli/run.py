"""``rlinfra run CONFIG [KEY=VALUE ...] [--resume]``: start the job a config names.

The config's ``run.entrypoint`` (``"package.module:function"``, or ``"package.module:JobClass"`` for
its ``main``) is called with the loaded config
(overrides applied, OmegaConf dotlist syntax) and ``resume=``; it returns the exit status. The
current directory is put on ``sys.path`` first, as ``python -m`` does, so a job in the working
tree (``examples.ppo_cartpole.job:PPOJob``) imports without being installed — and Ray hands the
driver's directory to its workers, so they import it too. So is the config's own folder (also on
the workers' ``PYTHONPATH``): a job module kept beside its config runs from any directory.
"""

import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlinfra.cli.options import argument, user_errors
from rlinfra.config import ConfigError, parse_config
from rlinfra.config.loading import load_config
from rlinfra.driver.preflight import preflight
from rlinfra.placement.config import ClusterConfig
from rlinfra.views.config_view import config_table
from rlinfra.views.tables import make_console


def run(
    config: Annotated[Path, argument(metavar="CONFIG", help="YAML config with cluster and run sections.")],
    overrides: Annotated[
        list[str] | None, argument(metavar="[KEY=VALUE]...", help="Overrides, e.g. algo.iterations=50.")
    ] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the last checkpoint.")] = False,
    show_config: Annotated[
        bool,
        typer.Option(
            "--show-config",
            help="Print every key of the job's config (value, default, type, allowed values) and exit "
            "without starting Ray.",
        ),
    ] = False,
) -> None:
    """Run the job CONFIG names in run.entrypoint: placement map first, then progress, then results."""
    with user_errors(ConfigError, OmegaConfBaseException) as errors:
        cfg = load_config(config)
        malformed = [item for item in overrides or () if "=" not in item or item.startswith("=")]
        if malformed:
            raise ConfigError(f"override {malformed[0]!r}: expected KEY=VALUE, e.g. algo.iterations=50")
        cfg.merge_with_dotlist(list(overrides or ()))
        entry = resolve_entrypoint(OmegaConf.select(cfg, "run.entrypoint"), config)
        job = getattr(entry, "__self__", None)  # a job class's main: its Config is the schema
        if show_config:
            if not isinstance(job, type) or not hasattr(job, "Config"):
                raise ConfigError(f"{config}: --show-config needs run.entrypoint to name a Job class")
            parsed = parse_config(job.Config, cfg)
            make_console().print(config_table(parsed, f"{job.__name__}'s config ({config})"))
            errors.print("the cluster section: rlinfra plan " + str(config), style="dim")
            raise typer.Exit(0)
    raise typer.Exit(entry(cfg, resume=resume))


def resolve_entrypoint(text: Any, config: Path) -> Callable[..., int]:
    """``"module:function"`` → the function, or a ``ConfigError`` saying what is wrong."""
    where = f"{config}: run.entrypoint"
    if not isinstance(text, str) or text.count(":") != 1:
        raise ConfigError(f"{where}: expected 'package.module:function', got {text!r}")
    module_name, function_name = text.split(":")
    beside = str(config.resolve().parent)  # a job kept beside its config, from any directory
    for folder in (beside, os.getcwd()):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    # The workers import it too: an embedded Ray's processes inherit this environment.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (beside, os.environ.get("PYTHONPATH"))))
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(
            f"{where}: cannot import {module_name!r} ({error}); keep it beside the config or run from "
            "the folder its package lives in"
        ) from None
    function = getattr(module, function_name, None)
    if isinstance(function, type):  # a job class (``rlinfra.driver.Job``): its ``main``
        function = getattr(function, "main", None)
    if not callable(function):
        raise ConfigError(f"{where}: {module_name!r} has no function {function_name!r}")
    return function


def check_job(config: Path, cluster: ClusterConfig) -> None:
    """For ``rlinfra plan`` of a job's config, what ``rlinfra run`` checks before Ray starts: the
    entrypoint imports, the job's sections parse (keys, types, ranges), and its components are
    the placed ones (``rlinfra.driver.preflight``)."""
    cfg = load_config(config)
    job = getattr(resolve_entrypoint(OmegaConf.select(cfg, "run.entrypoint"), config), "__self__", None)
    if isinstance(job, type):  # a Job class: its config and components
        preflight(job(cfg), cluster)
