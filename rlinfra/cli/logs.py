"""``rlinfra logs OUTPUT_DIR [COMPONENT[:RANK]] [--follow]``: a run's worker logs, with no Ray.

``placement.json`` names each rank's process id and the folder Ray writes the session's logs to;
a worker's output is that folder's ``worker-*-<pid>.out`` and ``.err``. Each line is shown after
its rank (``rollout:1 | ...``); ``--follow`` keeps reading until the run ends (its
``summary.json`` appears) or Ctrl-C.
"""

import json
import time
from pathlib import Path
from typing import Annotated, TextIO

import typer

from rlinfra.cli.options import argument, user_errors
from rlinfra.config import ConfigError, did_you_mean
from rlinfra.driver.result import PLACEMENT_FILE, SUMMARY_FILE

FOLLOW_POLL_S = 0.5  # how often --follow looks for new lines (files give no event to wait on)


def logs(
    output_dir: Annotated[Path, argument(metavar="OUTPUT_DIR", help="The run's run.output_dir.")],
    which: Annotated[
        str | None, argument(metavar="[COMPONENT[:RANK]]", help="Only this component, or this rank.")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep showing new lines until the run ends.")
    ] = False,
) -> None:
    """Show the output of a run's workers (all, a component's, or one rank's), each line after its rank."""
    with user_errors(ConfigError):
        files = _log_files(output_dir, which)
    sources = {(rank, path): _open(path) for rank, paths in files.items() for path in paths}
    try:
        while True:
            for (rank, _), source in sources.items():
                for line in source.readlines():
                    typer.echo(f"{rank} | {line.rstrip()}")
            if not follow or (output_dir / SUMMARY_FILE).is_file():
                return
            time.sleep(FOLLOW_POLL_S)
    except KeyboardInterrupt:
        return
    finally:
        for source in sources.values():
            source.close()


def _log_files(folder: Path, which: str | None) -> dict[str, list[Path]]:
    """Each selected rank (``component:rank``) and its log files."""
    try:
        placed = json.loads((folder / PLACEMENT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise ConfigError(
            f"{folder}: no readable {PLACEMENT_FILE}", expected="a run's run.output_dir"
        ) from None
    ranks = {rank: process.get("pid") for rank, process in placed.get("processes", {}).items()}
    chosen = [rank for rank in ranks if which is None or rank == which or rank.split(":")[0] == which]
    if not chosen:
        hint = did_you_mean(str(which), [*ranks, *(rank.split(":")[0] for rank in ranks)])
        raise ConfigError(
            f"{which!r} is not a component or rank of this run" + (f"; {hint}" if hint else ""),
            expected="one of " + ", ".join(ranks),
        )
    logs_dir = Path(placed.get("logs") or "")
    return {rank: sorted(logs_dir.glob(f"worker-*-{ranks[rank]}.*")) for rank in chosen if ranks[rank]}


def _open(path: Path) -> TextIO:
    return path.open(encoding="utf-8", errors="replace")
