"""``rlinfra status OUTPUT_DIR``: a run's state from its files, live or finished, with no Ray.

A run writes ``metrics.jsonl`` (a record per iteration, an event per survived fault),
``placement.json`` (each rank's node and process id) and, when it ends, ``summary.json``; this
reads them, so it needs no access to the run's Ray (and so no token) and works from any terminal.
"""

import json
import time
from pathlib import Path
from typing import Annotated, Any

from rlinfra.cli.options import argument, user_errors
from rlinfra.config import ConfigError
from rlinfra.driver.metrics import METRICS_FILE, read_events, read_metrics
from rlinfra.driver.result import PLACEMENT_FILE, SUMMARY_FILE
from rlinfra.views.tables import make_console

SHOWN_METRICS = 8  # the last record's first keys, beside the standard ones


def status(
    output_dir: Annotated[Path, argument(metavar="OUTPUT_DIR", help="The run's run.output_dir.")],
) -> None:
    """Show a run's state from its files: progress and rate, versions, recoveries, last metrics,
    each rank's node and process id. Works while the run goes on and after it ended."""
    with user_errors(ConfigError):
        records = read_metrics(output_dir) if (output_dir / METRICS_FILE).is_file() else None
        if records is None:
            raise ConfigError(f"{output_dir}: no {METRICS_FILE} here", expected="a run's run.output_dir")
    console, lines = make_console(), _lines(output_dir, records)
    for line in lines:
        console.print(line)


def _lines(folder: Path, records: list[dict[str, Any]]) -> list[str]:
    summary = _json(folder / SUMMARY_FILE)
    quiet_s = time.time() - (folder / METRICS_FILE).stat().st_mtime
    state = f"ended: {summary['outcome']}" if summary else f"running (last progress {quiet_s:.0f} s ago)"
    lines = [f"{folder}: {state}"]
    if records:
        last = records[-1]
        rate = last["iteration"] / last["time_s"] * 60 if last.get("time_s") else 0.0
        lines.append(
            f"iteration {last['iteration']}, {last.get('time_s', 0):.1f} s of training ({rate:.1f}/min)"
        )
        learner, served = last.get("learner_version"), last.get("served_version")
        if served is not None:
            stale = learner - served if learner is not None else 0
            lines.append(f"weights: trained {learner}, served {served} (staleness {stale})")
        shown = {k: v for k, v in last.items() if k not in ("iteration", "time_s")}
        lines.append("last: " + ", ".join(f"{k} {v}" for k, v in list(shown.items())[:SHOWN_METRICS]))
    events = read_events(folder)
    lines.append(f"recoveries: {len(events)}")
    lines += [f"  {e['component']}:{e['rank']} {e['event']} after {e.get('cause', '')}" for e in events]
    processes = (_json(folder / PLACEMENT_FILE) or {}).get("processes", {})
    lines += [f"{rank}: node {process['node']}, pid {process['pid']}" for rank, process in processes.items()]
    return lines


def _json(path: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None
