"""What every benchmark script shares: its command line and its last line.

``--smoke`` runs the script's own code path at its smallest size with one repeat and no warm-up,
in seconds rather than minutes: ``tests/test_benchmarks.py`` runs every script that way so that
a broken benchmark fails the suite the day it breaks. Its figures mean nothing and say so
(``"smoke": true`` in the last line). The last line printed is always one JSON object.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

SMOKE_HELP = (
    "the smallest size, one repeat, no warm-up: checks that the script runs; its figures mean nothing"
)


def parser(doc: str | None) -> argparse.ArgumentParser:
    """The script's argument parser (its docstring's first line as description), with ``--smoke``."""
    made = argparse.ArgumentParser(description=(doc or "").splitlines()[0] if doc else None)
    made.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    return made


def emit(figures: dict[str, Any], smoke: bool) -> None:
    """Print the last line: ``figures`` as one JSON object, marked as a smoke run or not."""
    print(json.dumps({**figures, "smoke": smoke}), flush=True)
