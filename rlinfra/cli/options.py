"""The shapes every ``rlinfra`` command's options share, written once.

rlinfra's help texts say their defaults themselves ("Default: cluster.simulate, else 8 per node"),
so typer must not print its own; and every command that reads a config takes it the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer


def option(*names: str, **settings: Any) -> Any:
    """A ``typer.Option`` whose default the help text states (none printed by typer)."""
    return typer.Option(*names, show_default=False, **settings)


def argument(**settings: Any) -> Any:
    """A ``typer.Argument`` whose default the help text states (none printed by typer)."""
    return typer.Argument(show_default=False, **settings)


ConfigArgument = Annotated[Path, argument(metavar="CONFIG", help="YAML config with a cluster section.")]
