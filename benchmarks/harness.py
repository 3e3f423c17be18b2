"""What every benchmark script shares: its command line and its last line.

``--smoke`` runs the script's own code path at its smallest size with one repeat and no warm-up,
in seconds rather than minutes: ``tests/test_benchmarks.py`` runs every script that way so that
a broken benchmark fails the suite the day it breaks. Its figures mean nothing and say so
(``"smoke": true`` in the last line). The last line printed is always one JSON object.

A real run also writes that object, with the date and the machine it ran on, to
``benchmarks/results/<benchmark>.json``: the docs' Benchmarks page is rendered from those files,
so updating a figure is a data change.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"

SMOKE_HELP = (
    "the smallest size, one repeat, no warm-up: checks that the script runs; its figures mean nothing"
)


def parser(doc: str | None) -> argparse.ArgumentParser:
    """The script's argument parser (its docstring's first line as description), with ``--smoke``."""
    made = argparse.ArgumentParser(description=(doc or "").splitlines()[0] if doc else None)
    made.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    return made


def machine() -> str:
    """What the figures were measured on: CPUs, memory and, where torch sees one, the GPU."""
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    described = f"{platform.machine()}, {os.cpu_count()} CPUs, {memory_gib:.0f} GiB"
    try:
        import torch

        if torch.cuda.is_available():
            described += f", {torch.cuda.device_count()} × {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    return described


def emit(figures: dict[str, Any], smoke: bool) -> None:
    """Print the last line: ``figures`` as one JSON object, marked as a smoke run or not; a real
    run's is also written to ``benchmarks/results/<benchmark>.json`` with the date and machine."""
    print(json.dumps({**figures, "smoke": smoke}), flush=True)
    if not smoke:
        RESULTS.mkdir(exist_ok=True)
        kept = {"date": datetime.date.today().isoformat(), "machine": machine(), "figures": figures}
        (RESULTS / f"{figures['benchmark']}.json").write_text(
            json.dumps(kept, indent=1) + "\n", encoding="utf-8"
        )
