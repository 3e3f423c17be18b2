"""What every ``rlinfra`` command shares, written once: the shape of its options and how it
reports a user error.

rlinfra's help texts say their defaults themselves ("Default: cluster.simulate, else 8 per node"),
so typer must not print its own; and every command that reads a config takes it the same way.
A user error (a bad config, option or cluster) is one line on stderr and exit status 2; anything
else is a bug and keeps its traceback.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from rlinfra.views.tables import make_console

USAGE_ERROR = 2


def option(*names: str, **settings: Any) -> Any:
    """A ``typer.Option`` whose default the help text states (none printed by typer)."""
    return typer.Option(*names, show_default=False, **settings)


def argument(**settings: Any) -> Any:
    """A ``typer.Argument`` whose default the help text states (none printed by typer)."""
    return typer.Argument(show_default=False, **settings)


ConfigArgument = Annotated[Path, argument(metavar="CONFIG", help="YAML config with a cluster section.")]


def print_error(console: Console, message: str) -> None:
    console.print(Text.assemble(("error: ", "bold red"), message))


@contextmanager
def user_errors(*kinds: type[Exception]) -> Iterator[Console]:
    """A stderr console for the command's notes; an error of ``kinds`` raised inside is printed
    without a traceback and exits with ``USAGE_ERROR``."""
    errors = make_console(stderr=True, soft_wrap=True)
    try:
        yield errors
    except kinds as error:
        print_error(errors, str(error))
        raise typer.Exit(USAGE_ERROR) from None
