"""``rlinfra slurm render | submit | status``: the sbatch script that runs a config's driver on its
own Ray cluster, written, submitted, and followed.

Only wiring: load the config, turn options into a ``SlurmJob``, write what
``rlinfra.ops.slurm.render_sbatch`` makes of it (and ``sbatch`` it), or show a job's state.
Mistakes exit with status 2 and a message. ``render`` and ``submit`` take the same options.
"""

import inspect
from pathlib import Path
from typing import Annotated

import typer

from rlinfra.cli.options import ConfigArgument, argument, option, user_errors
from rlinfra.config import ConfigError
from rlinfra.config.loading import load_cluster_config
from rlinfra.ops.slurm import (
    DEFAULT_NODE_TIMEOUT_S,
    DEFAULT_PORT,
    SlurmError,
    job_from_config,
    job_status,
    render_sbatch,
    submit,
)

slurm_app = typer.Typer(
    help="Run a config's driver on a Ray cluster bootstrapped inside one Slurm allocation.",
    no_args_is_help=True,
)


def _script_command(name: str, submitting: bool) -> None:
    """Register ``render`` (write the script) or ``submit`` (write it, then sbatch it)."""

    def command(
        config: ConfigArgument,
        driver: Annotated[
            list[str],
            argument(
                metavar="-- DRIVER...",
                help="The driver command, after `--`, e.g. -- python main.py conf.yaml.",
            ),
        ],
        output: Annotated[
            Path | None,
            typer.Option(
                "--output",
                "-o",
                metavar="FILE",
                help="Write the script to FILE (default: stdout; submit: CONFIG's name with .sbatch).",
                dir_okay=False,
            ),
        ] = None,
        gpus_per_node: Annotated[
            int | None,
            option(
                "--gpus-per-node",
                metavar="N",
                help="GPUs per node. Default: from cluster.simulate ('NxG'), else Ray detects them.",
            ),
        ] = None,
        cpus_per_node: Annotated[
            int | None,
            option(
                "--cpus-per-node",
                metavar="N",
                help="CPUs per node for Ray (and Slurm's --cpus-per-task). Recommended: without it a Slurm "
                "step may get one CPU.",
            ),
        ] = None,
        partition: Annotated[
            str | None, option("--partition", "-p", metavar="P", help="Slurm partition.")
        ] = None,
        time_limit: Annotated[
            str | None, option("--time", "-t", metavar="T", help="Slurm time limit, e.g. 4:00:00.")
        ] = None,
        job_name: Annotated[
            str | None, option("--job-name", "-J", metavar="NAME", help="Default: the config's file name.")
        ] = None,
        sbatch: Annotated[
            list[str] | None,
            option(
                "--sbatch",
                metavar="OPTION",
                help="Another #SBATCH option (repeatable), e.g. --sbatch account=rl.",
            ),
        ] = None,
        setup: Annotated[
            list[str] | None,
            option(
                "--setup",
                metavar="LINE",
                help="A shell line run first (repeatable), e.g. 'source .venv/bin/activate'.",
            ),
        ] = None,
        port: Annotated[
            int, typer.Option("--port", metavar="PORT", help="The head's GCS port.")
        ] = DEFAULT_PORT,
        node_timeout: Annotated[
            int,
            typer.Option("--node-timeout", metavar="SECONDS", help="How long to wait for all nodes to join."),
        ] = DEFAULT_NODE_TIMEOUT_S,
    ) -> None:
        """Write an sbatch script: Ray head on the first node, the others joined with labels
        rlinfra-node-rank=0..N-1, then DRIVER; when the driver or any node exits, everything stops.

        The script exits with the driver's status, or non-zero when a node failed first.
        """
        if submitting and output is None:
            output = Path(f"{_job_name(config)}.sbatch")
        with user_errors(ConfigError, SlurmError) as errors:
            job = job_from_config(
                load_cluster_config(config).cluster,
                driver,
                gpus_per_node=gpus_per_node,
                cpus_per_node=cpus_per_node,
                job_name=job_name or _job_name(config),
                partition=partition,
                time=time_limit,
                sbatch_options=tuple(sbatch or ()),
                setup=tuple(setup or ()),
                port=port,
                node_timeout_s=node_timeout,
                config_name=str(config),
            )
            script = render_sbatch(job, output.name if output else "job.sbatch")
            if output is None:
                typer.echo(script, nl=False)
                return
            _write_executable(output, script)
            if not submitting:
                errors.print(
                    f"wrote {output} ({job.num_nodes} node(s)); submit it with: sbatch {output}", style="dim"
                )
                return
            job_id, log = submit(output)
        typer.echo(f"submitted job {job_id} ({job.num_nodes} node(s)); log: {log}")
        typer.echo(f"follow it: rlinfra slurm status {job_id}")

    # submit's help is render's, plus its last step.
    submit_help = "\n\nThen submit it with sbatch and print the job id and where its log is."
    slurm_app.command(name, help=f"{inspect.getdoc(command)}{submit_help}" if submitting else None)(command)


_script_command("render", submitting=False)
_script_command("submit", submitting=True)


@slurm_app.command("status")
def status(job_id: Annotated[str, argument(metavar="JOBID", help="The job id submit printed.")]) -> None:
    """Slurm's state of the job, and what its script logged about Ray: the head, the nodes that
    joined, the driver's end."""
    with user_errors(SlurmError):
        shown = job_status(job_id)
    typer.echo(f"job {shown.job_id}: {shown.state} on {shown.nodes}; log: {shown.log}")
    for line in shown.ray or ("(nothing from the script yet)",):
        typer.echo(f"  {line}")


def _write_executable(path: Path, script: str) -> None:
    try:
        path.write_text(script, encoding="utf-8")
        mode = path.stat().st_mode
        path.chmod(mode | (mode & 0o444) >> 2)  # executable for whoever may read it, like chmod +x
    except OSError as error:
        raise ConfigError(f"{path}: cannot write the script: {error.strerror or error}") from None


def _job_name(config: Path) -> str:
    """The config's stem, reduced to the characters Slurm job names keep intact."""
    name = "".join(char if char.isalnum() or char in "_.+-" else "-" for char in config.stem)
    return name or "rlinfra"
