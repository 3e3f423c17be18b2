"""``rlinfra plan``: show where every process of a config would run, without a cluster.

The command only wires things together: load the config, decide how many accelerators each node
has (``--nodes``, else ``cluster.simulate``, else 8 per node), build the same ``ClusterSpec`` and
``ComponentPlacement`` a live launch would, and hand them to the view. User mistakes (config,
placement, ``--nodes``, an unknown component) exit with status 2 and a message; a valid plan that
some node cannot hold (``--cpus``) is printed, then exits with status 1 naming the nodes; anything
else is a bug and keeps its traceback.
"""

from pathlib import Path
from typing import Annotated

import typer
from omegaconf import OmegaConf
from rich.console import Console

from rlinfra.cli.options import argument, option, print_error, user_errors
from rlinfra.cli.run import check_job
from rlinfra.config import ConfigError
from rlinfra.config.loading import load_cluster_config
from rlinfra.placement import (
    ClusterConfig,
    ClusterSpec,
    ComponentPlacement,
    parse_cluster_config,
)
from rlinfra.placement.config import DEFAULT_SIMULATED_CPUS, parse_nodes_spec
from rlinfra.views.layout_view import plan_job_layout
from rlinfra.views.node_view import node_loads, overload_message, overloaded, parse_cpus
from rlinfra.views.plan_view import (
    dumps_plan,
    plan_to_dict,
    render_plan,
    save_map_svg,
)
from rlinfra.views.tables import make_console

DOES_NOT_FIT = 1  # the plan is valid but some node cannot hold what it reserves
DEFAULT_ACCELERATORS = 8


def plan(
    config: Annotated[
        Path,
        argument(
            metavar="CONFIG",
            help="YAML config with a cluster section, or a Hydra config directory with --config-name.",
        ),
    ],
    config_name: Annotated[
        str | None,
        option(
            "--config-name",
            metavar="NAME",
            help="Compose config NAME of the Hydra config directory CONFIG (as @hydra.main would).",
        ),
    ] = None,
    nodes: Annotated[
        str | None,
        option(
            "--nodes",
            metavar="SPEC",
            help="Accelerators per node: 'NxG' (e.g. 2x8) or per-node counts (e.g. 8,8,4,0). "
            "Default: cluster.simulate, else 8 per node.",
        ),
    ] = None,
    cpus: Annotated[
        str | None,
        option(
            "--cpus",
            metavar="SPEC",
            help="CPUs per node, to check that each node can hold what it reserves: one count for "
            "all (e.g. 64) or one per node (64,64,32). Default: cluster.simulate_cpus when simulating.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as one JSON object.")] = False,
    svg: Annotated[
        Path | None,
        typer.Option(
            "--svg", metavar="FILE", help="Also write the node × device map as SVG.", dir_okay=False
        ),
    ] = None,
    show_all: Annotated[
        bool, typer.Option("--all", help="Show every rank and every node (no truncation).")
    ] = False,
) -> None:
    """Show where every process would run: a table per strategy, a node × device map and the layout.

    Resolves the config exactly as a launch would, but on a described cluster instead of a live
    one, so no Ray is needed. The layout is the job's one placement group: each component's bundles,
    what each process reserves and which components share devices. --json prints the plan for other
    tools instead. A job's config (with run.entrypoint) is first checked as rlinfra run checks it
    before Ray starts: the entrypoint imports, the job's keys, its components.
    """
    with user_errors(ConfigError) as errors:
        loaded = load_cluster_config(config, config_name, also=("run",))
        cluster = parse_cluster_config(loaded.cluster)
        if config_name is None and OmegaConf.select(loaded, "run.entrypoint") is not None:
            check_job(config, cluster)  # a job's config: what rlinfra run checks before Ray starts
        spec = ClusterSpec.from_config(cluster, accelerator_counts(cluster, nodes, errors))
        placement = ComponentPlacement({"cluster": cluster}, spec)
        layout = plan_job_layout(placement)
        loads = node_loads(layout, spec.num_nodes, _node_cpus(cpus, cluster))
        if svg is not None:
            # Before any output, so an unwritable path fails cleanly instead of after half a plan.
            try:
                save_map_svg(svg, spec, placement, show_all)
            except OSError as error:
                raise ConfigError(f"{svg}: cannot write the SVG: {error.strerror or error}") from None
    if as_json:
        typer.echo(dumps_plan(plan_to_dict(spec, placement, layout, loads)))
    else:
        render_plan(make_console(), spec, placement, layout, loads, show_all)
    if svg is not None:
        errors.print(f"wrote the node × device map to {svg}", style="dim")
    for warning in placement.memory_warnings:  # cluster.memory_check: warn
        errors.print(f"warning: {warning}", style="yellow")
    if overloaded(loads):
        print_error(errors, overload_message(loads))
        raise typer.Exit(DOES_NOT_FIT)


def _node_cpus(cpus: str | None, config: ClusterConfig) -> list[int] | None:
    """CPUs per node from ``--cpus``, else a simulated cluster's ``simulate_cpus``, else unknown."""
    if cpus is not None:
        return parse_cpus(cpus, config.num_nodes)
    if config.simulate is not None:
        return [config.simulate_cpus or DEFAULT_SIMULATED_CPUS] * config.num_nodes
    return None


def accelerator_counts(config: ClusterConfig, nodes: str | None, notes: Console) -> int | list[int]:
    """Accelerators per node from ``--nodes``, else ``cluster.simulate``, else RLinf's
    ``cluster.num_gpus_per_node``, else a stated default."""
    if nodes is not None:
        return parse_nodes_spec(nodes, "--nodes", config.num_nodes)
    if config.simulate is not None:
        return list(config.simulate)
    if config.num_gpus_per_node is not None:
        return config.num_gpus_per_node
    notes.print(
        f"note: neither --nodes, cluster.simulate nor cluster.num_gpus_per_node is given; assuming "
        f"{DEFAULT_ACCELERATORS} accelerators per node",
        style="dim",
    )
    return DEFAULT_ACCELERATORS
