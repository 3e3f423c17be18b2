"""``rlinfra job submit``: a job on a running Ray cluster (Ray's Jobs API), followed to its end.

The command only wires ``rlinfra.ops.jobs`` to the terminal: job output goes to stdout,
rlinfra's own notes and errors to stderr. A mistake or an unreachable cluster exits with status
2 and one message, no traceback; ``submit`` (when it waits) exits 0 when the job SUCCEEDED and 1
when it FAILED or was STOPPED, so scripts can chain on it. Status, logs, stop and list are Ray's
own (``ray job status|logs|stop|list``): the same address, and the token where Ray looks for it.
"""

import shlex
from functools import partial
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from rlinfra.cli.options import ConfigArgument, argument, option, user_errors
from rlinfra.config import ConfigError
from rlinfra.config.loading import load_cluster_config
from rlinfra.ops.jobs import (
    TERMINAL_STATUSES,
    JobsClient,
    JobsError,
    build_runtime_env,
    parse_assignments,
    parse_requirements,
)

JOB_FAILED = 1
INTERRUPTED = 130

job_app = typer.Typer(
    help="Submit a job to a running Ray cluster and follow it (Ray's Jobs API, ray\\[default]); "
    "`ray job status|logs|stop|list` do the rest.",
    no_args_is_help=True,
)

AddressOption = Annotated[
    str | None,
    option(
        "--address",
        metavar="URL",
        help="Dashboard address of the cluster. Default: RAY_ADDRESS, else http://127.0.0.1:8265.",
    ),
]
FollowTimeoutOption = Annotated[
    float | None,
    option(
        "--timeout",
        metavar="SECONDS",
        help="Stop following the logs after SECONDS (the job keeps running). Default: until it ends.",
    ),
]


@job_app.command("submit")
def submit(
    config: ConfigArgument,
    entrypoint: Annotated[
        list[str],
        argument(
            metavar="-- ENTRYPOINT...",
            help="The command to run on the head, after `--`. One argument is taken as a shell command.",
        ),
    ],
    address: AddressOption = None,
    require: Annotated[
        list[str] | None,
        option(
            "--require",
            metavar="NAME=N",
            help="Refuse to submit unless the cluster has exactly N of resource NAME (repeatable), "
            "e.g. GPU=16.",
        ),
    ] = None,
    env: Annotated[
        list[str] | None,
        option(
            "--env",
            metavar="NAME=VALUE",
            help="An env var for the job (repeatable); overrides runtime_env.env_vars of the config. "
            "Credential-looking names and values are refused.",
        ),
    ] = None,
    working_dir: Annotated[
        Path | None,
        option(
            "--working-dir", metavar="DIR", help="Upload DIR and run the entrypoint in it.", file_okay=False
        ),
    ] = None,
    submission_id: Annotated[
        str | None, option("--submission-id", metavar="ID", help="Choose the job's id.")
    ] = None,
    no_wait: Annotated[
        bool, typer.Option("--no-wait", help="Print the id and return instead of following the logs.")
    ] = False,
    timeout: FollowTimeoutOption = None,
) -> None:
    """Submit ENTRYPOINT as a Ray job, then follow its logs until it ends.

    The cluster is the dashboard at --address, cluster.address or RAY_ADDRESS. --require checks
    the cluster's total resources first and submits nothing when they differ. The job's
    runtime_env carries the config's runtime_env.env_vars and --env, but never anything that
    looks like a credential: Ray shows runtime_env to anyone who can list jobs.
    """
    with user_errors(ConfigError, JobsError) as errors:
        cfg = load_cluster_config(config, also=("runtime_env",))
        required = parse_requirements(require or ())
        runtime_env = build_runtime_env(
            parse_assignments(env or (), "--env"), working_dir, cfg.get("runtime_env")
        )
        # One argument is a shell command as written ("python a.py && echo done"); several are quoted
        # word by word, so `-- python -c "print('hi')"` runs as typed. Typer requires at least one.
        command = entrypoint[0] if len(entrypoint) == 1 else shlex.join(entrypoint)
        client = JobsClient(address, cluster_cfg=cfg.cluster)
        client.require(required)
        job_id = client.submit(
            command, runtime_env, submission_id=submission_id, metadata={"rlinfra.config": config.name}
        )
        if no_wait:
            typer.echo(job_id)
            return
        errors.print(f"submitted {job_id} to {client.address}", style="dim")
        status = _follow(client, job_id, timeout, errors)
    if status in TERMINAL_STATUSES and status != "SUCCEEDED":
        raise typer.Exit(JOB_FAILED)


def _follow(client: JobsClient, job_id: str, timeout: float | None, errors: Console) -> str:
    """Stream the logs to stdout; a final status line on stderr. Ctrl-C detaches, it stops nothing."""
    try:
        final = client.tail(job_id, partial(print, end="", flush=True), timeout_s=timeout)
    except KeyboardInterrupt:
        errors.print(f"\ndetached; {job_id} keeps running (ray job stop {job_id} stops it)")
        raise typer.Exit(INTERRUPTED) from None
    if final in ("PENDING", "RUNNING"):
        errors.print(f"{job_id} is still {final} after {timeout:g} s; stopped following it", style="dim")
    else:
        style = "green" if final == "SUCCEEDED" else "bold red"
        errors.print(Text.assemble(f"{job_id}: ", (final, style)))
    return final
