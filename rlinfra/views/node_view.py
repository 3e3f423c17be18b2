"""What each node reserves, against what it has: the check that a layout can launch at all.

Ray waits forever for a placement group that needs more of a node than the node has; a launch
refuses that at once (``rlinfra.runtime.layout.check_capacity``), and ``rlinfra plan`` shows it
before anything runs. GPUs and other devices always fit, because the plan is made from the
nodes' own device counts; CPUs depend on the machines, so they are checked when the node sizes
are known (``--cpus``, or ``cluster.simulate_cpus`` for a simulated cluster).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.table import Table
from rich.text import Text

from rlinfra.placement.errors import PlacementError, short_ranks
from rlinfra.runtime.bundles import LayoutPlan
from rlinfra.views.tables import amounts, number, titled_table

NODE_ROWS = 16  # nodes listed without --all (nodes that do not fit are always listed)


@dataclass(frozen=True)
class NodeLoad:
    """One node: what the job's placement group reserves on it, and its CPUs when known."""

    node: int
    reserves: dict[str, float]
    cpus: float | None = None

    @property
    def cpu_shortfall(self) -> float:
        """CPUs missing on this node (0 when it fits or its size is unknown)."""
        if self.cpus is None:
            return 0.0
        return max(0.0, round(self.reserves.get("CPU", 0.0) - self.cpus, 4))


def node_loads(layout: LayoutPlan, num_nodes: int, cpus: Sequence[int] | None) -> list[NodeLoad]:
    """Every node of the cluster, reserving nothing where the job places nothing."""
    totals = layout.per_node()
    return [
        NodeLoad(
            node,
            {name: round(amount, 4) for name, amount in totals.get(node, {}).items()},
            None if cpus is None else float(cpus[node]),
        )
        for node in range(num_nodes)
    ]


def parse_cpus(text: str, num_nodes: int) -> list[int]:
    """``--cpus``: one count for every node (``64``) or one per node (``64,64,32``)."""
    parts = [part.strip() for part in text.split(",")]
    readable = all(part.isdigit() and len(part) <= 7 for part in parts)
    if readable and len(parts) == 1:
        return [int(parts[0])] * num_nodes
    if readable and len(parts) == num_nodes:
        return [int(part) for part in parts]
    raise PlacementError(
        f"{len(parts)} CPU counts for {num_nodes} nodes" if readable else f"cannot read {text!r} as counts",
        where="--cpus",
        text=text,
        expected=f"CPUs per node: one count for all nodes (e.g. 64) or {num_nodes}, one per node (64,64,32)",
    )


def overloaded(loads: Sequence[NodeLoad]) -> list[NodeLoad]:
    return [load for load in loads if load.cpu_shortfall > 0]


def nodes_table(loads: Sequence[NodeLoad], show_all: bool) -> Table:
    """Per node: what the placement group reserves, the node's CPUs, and whether it fits."""
    known = any(load.cpus is not None for load in loads)
    unknown = "node sizes unknown: --cpus N (or cluster.simulate_cpus) checks that each fits"
    table = titled_table(Text("Reserved per node", style="bold"), None if known else unknown, show_edge=False)
    for column in ("node", "reserves", *(("has", "fits") if known else ())):
        table.add_column(column)
    shown = [load for index, load in enumerate(loads) if show_all or index < NODE_ROWS or load.cpu_shortfall]
    for load in shown:
        cells: list[str | Text] = [str(load.node), amounts(load.reserves)]
        if known:
            short = f"no: short by CPU {number(load.cpu_shortfall)}"
            fit = Text(short, style="bold red") if load.cpu_shortfall else Text("yes", style="green")
            cells += [f"CPU {number(load.cpus or 0.0)}", fit]
        table.add_row(*cells)
    if len(shown) < len(loads):
        table.add_row(f"… {len(loads) - len(shown)} more", "--all shows every node", style="dim")
    return table


def overload_message(loads: Sequence[NodeLoad]) -> str:
    """The error line for nodes that cannot hold their reservation."""
    bad = overloaded(loads)
    worst = max(bad, key=lambda load: load.cpu_shortfall)
    return (
        f"the layout does not fit: node(s) {short_ranks([load.node for load in bad])} reserve more CPUs "
        f"than they have (node {worst.node}: CPU {number(worst.reserves.get('CPU', 0.0))} of "
        f"{number(worst.cpus or 0.0)}); lower num_cpus of the components there, or use larger nodes"
    )


def nodes_to_dict(loads: Sequence[NodeLoad]) -> list[dict[str, Any]]:
    """The ``"nodes"`` list of ``rlinfra plan --json``."""
    return [
        {
            "node": load.node,
            "reserves": load.reserves,
            "cpus": load.cpus,
            "fits": None if load.cpus is None else load.cpu_shortfall == 0,
        }
        for load in loads
    ]
