"""Running a bundled main job as a user runs it, for the benchmarks that measure one.

``rlinfra run examples/<job>/<layout>.yaml`` in a subprocess (a fresh embedded Ray with the
config's simulated nodes, nothing shared with the benchmark's own process), timed from the
outside; the figures are then read from the run's own outputs.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_bundled(
    job: str, layout: str, seed: int, folder: Path, timeout_s: float, overrides: tuple[str, ...] = ()
) -> tuple[Path, float]:
    """Run ``layout`` of ``job`` with ``algo.seed=seed`` and ``overrides`` (``key=value``), writing
    under ``folder/layout``; returns that output folder and the command's wall seconds (Ray start,
    launch, training, teardown). A run that fails or outlives ``timeout_s`` ends the benchmark
    with the tail of its output."""
    output = folder / layout
    command = [
        str(Path(sys.executable).with_name("rlinfra")),
        "run",
        str(ROOT / "examples" / job / f"{layout}.yaml"),
        f"run.output_dir={output}",
        f"algo.seed={seed}",
        *overrides,
    ]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as expired:
        said = (
            expired.stdout.decode(errors="replace") if isinstance(expired.stdout, bytes) else expired.stdout
        )
        raise SystemExit(
            f"{job} {layout}: no result within {timeout_s:.0f} s:\n{(said or '')[-3000:]}"
        ) from None
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(
            f"{job} {layout} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return output, wall
