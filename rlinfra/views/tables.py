"""The rich pieces every view of a plan shares: the console, the table shape, resource amounts."""

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Column, Table
from rich.text import Text


def make_console(**options: Any) -> Console:
    """A console that prints user text literally: labels and paths may contain ``[...]``, which
    rich would read as markup, and highlighting would recolor numbers, blurring the one color
    per component that ties tables to the map."""
    return Console(markup=False, highlight=False, **options)


def titled_table(title: Text, caption: str | None, *columns: Column | str, **options: Any) -> Table:
    """A table with its title and caption on the left and bold headers, as every plan table; its
    ``columns`` are header names, or rich ``Column`` objects where one needs its own justify or overflow."""
    return Table(
        *columns,
        title=title,
        title_justify="left",
        caption=caption,
        caption_justify="left",
        header_style="bold",
        **options,
    )


def number(value: float) -> str:
    """``8000``, ``0.5``, ``0.3333`` (Ray's resource precision is 1e-4)."""
    return str(int(value)) if value == int(value) else f"{round(value, 4):g}"


def amounts(resources: Mapping[str, float]) -> str:
    """``GPU 8, robot 1, CPU 16``: resources by name, CPUs last; ``—`` for none."""
    order = sorted(resources, key=lambda name: (name == "CPU", name))
    return ", ".join(f"{name} {number(resources[name])}" for name in order) or "—"
