"""The ``rlinfra`` command: one typer app, one module per subcommand."""

import typer

from rlinfra.cli.job import job_app
from rlinfra.cli.logs import logs
from rlinfra.cli.plan import plan
from rlinfra.cli.run import run
from rlinfra.cli.slurm import slurm_app
from rlinfra.cli.status import status

app = typer.Typer(
    name="rlinfra",
    help="rlinfra: placement, launch, ordering and visible errors for RL systems on Ray.",
    no_args_is_help=True,
    add_completion=False,
    # A real bug should show its traceback, but not the locals of frames holding 8,000 placements.
    pretty_exceptions_show_locals=False,
)


app.command("plan")(plan)
app.command("run")(run)
app.command("status")(status)
app.command("logs")(logs)
app.add_typer(job_app, name="job")
app.add_typer(slurm_app, name="slurm")


def main() -> None:
    """Console-script entry point (``rlinfra = rlinfra.cli.main:main``)."""
    app()


if __name__ == "__main__":
    main()
