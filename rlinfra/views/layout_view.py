"""The job's layout in ``rlinfra plan``: one placement group, and each component's slice of it.

The table is computed by ``rlinfra.runtime.bundles.plan_layout`` — the same function a live
``Layout`` reserves from — so what the plan shows is what a launch asks Ray for: the bundles in
(node rank, device id) order, every component's runs of bundle indices, what each process
reserves inside its bundle (``1/users`` of a shared device) and how components relate
(colocated, disaggregated or partly colocated). The human view stays a few lines however big the
job: one row per component (devices summarised per node), relations among the first components.
"""

from collections import Counter
from dataclasses import asdict
from itertools import combinations
from math import comb
from typing import Any

from rich.table import Table
from rich.text import Text

from rlinfra.placement import ComponentPlacement, PlacementError
from rlinfra.placement.errors import plural, short_ranks
from rlinfra.placement.node_groups import NODE_KIND
from rlinfra.placement.record import VISIBILITY_ENV
from rlinfra.runtime.bundles import ActorReservation, LayoutPlan, plan_layout
from rlinfra.views.tables import amounts, number, titled_table

LAYOUT_ROWS = 32  # components shown in the layout table without --all
RELATION_COMPONENTS = 12  # relations are listed among this many components without --all
DEVICE_PARTS = 3  # distinct per-node device sets shown in one cell
RESERVATION_PARTS = 3  # distinct per-process reservations shown in one cell


def plan_job_layout(placement: ComponentPlacement) -> LayoutPlan:
    """Every component of the config in one placement group, as a live ``Layout`` would plan it;
    a ``PlacementError`` when the placements cannot be reserved so (e.g. a fraction above 1)."""
    placements = {name: placement.get_placements(name) for name in placement.components}
    constraints = {name: placement.get_process_constraints(name) for name in placement.components}
    cpus = {name: placement.get_strategy(name).num_cpus for name in placement.components}
    try:
        return plan_layout(placements, cpus, constraints=constraints)
    except ValueError as error:
        raise PlacementError(f"cannot lay the job out as one placement group: {error}") from None


# --- JSON ------------------------------------------------------------------------------------------


def layout_to_dict(layout: LayoutPlan, placement: ComponentPlacement) -> dict[str, Any]:
    """The ``"layout"`` object of ``rlinfra plan --json``: bundles, slices, reservations, relations."""
    return {
        "bundles": [
            {"index": index, "node": node, "devices": list(devices), "resources": dict(resources)}
            for index, (resources, node, devices) in enumerate(
                zip(layout.bundles, layout.bundle_nodes, layout.bundle_devices, strict=True)
            )
        ],
        "components": {
            name: {
                "slices": [list(run) for run in layout.slices(name)],
                "reservations": [asdict(row) for row in layout.reservations[name]],
            }
            for name in placement.components
        },
        "relations": [
            {"a": first, "b": second, "relation": layout.relation(first, second)}
            for first, second in combinations(placement.components, 2)
        ],
    }


# --- human view --------------------------------------------------------------------------------------


def layout_table(
    layout: LayoutPlan, placement: ComponentPlacement, colors: dict[str, str], show_all: bool
) -> Table:
    """One row per component: its bundles, the devices they hold, what each process reserves."""
    bundles = plural(len(layout.bundles), "bundle")
    title = Text.assemble(("Layout", "bold"), f" (one placement group, {bundles})")
    columns = ("component", "bundles", "devices", "per process")
    table = titled_table(title, _caption(layout, placement), *columns, show_edge=False)
    names = placement.components
    shown = names if show_all else names[:LAYOUT_ROWS]
    for name in shown:
        kind = placement.get_placements(name)[0].hardware_type
        table.add_row(
            Text(name, style=colors[name]),
            short_ranks(layout.bundle_indices(name), limit=4, unit="bundles"),
            devices_text(layout, layout.bundle_indices(name), kind),
            reservations_text(layout.reservations[name]),
        )
    if len(shown) < len(names):
        table.add_row(f"… {len(names) - len(shown)} more", "", "--all shows every component", style="dim")
    return table


def _caption(layout: LayoutPlan, placement: ComponentPlacement) -> str:
    """What the placement group reserves in all, and which hardware Ray does not know about."""
    totals: Counter[str] = Counter()
    for bundle in layout.bundles:
        totals.update(bundle)
    caption = f"reserves {amounts(totals)} on {plural(len(set(layout.bundle_nodes)), 'node')}"
    custom = sorted(
        {placement.get_placements(name)[0].hardware_type for name in placement.components}
        - set(VISIBILITY_ENV)
        - {NODE_KIND}
    )
    if custom:
        caption += (
            f"; for {', '.join(custom)}, only CPUs (Ray reserves a unit only where a node "
            "advertises a resource of that name)"
        )
    return caption


def devices_text(layout: LayoutPlan, indices: list[int], kind: str) -> str:
    """The (node, device) span of some bundles: ``node 0: GPU 0-7``, ``node 0-1 (whole node)``.

    Nodes with the same devices share one line (``node 0-999: GPU 0-7``), so the cell stays short.
    """
    per_node: dict[int, set[int]] = {}
    for index in indices:
        per_node.setdefault(layout.bundle_nodes[index], set()).update(layout.bundle_devices[index])
    if not any(per_node.values()):
        return f"node {short_ranks(sorted(per_node))} (whole node)"
    nodes_of: dict[tuple[int, ...], list[int]] = {}
    for node in sorted(per_node):
        nodes_of.setdefault(tuple(sorted(per_node[node])), []).append(node)
    parts = [
        f"node {short_ranks(nodes)}: {kind} {short_ranks(devices)}" for devices, nodes in nodes_of.items()
    ]
    more = [f"… ({len(per_node)} nodes in all)"] if len(parts) > DEVICE_PARTS else []
    return "\n".join(parts[:DEVICE_PARTS] + more)


def reservations_text(rows: list[ActorReservation]) -> str:
    """The distinct reservations of a component's processes (``GPU 0.5, CPU 1``), one per line and
    with process counts when they differ (``GPU 0.5, CPU 1 (4)`` / ``GPU 1, CPU 1 (8)``)."""
    counts = Counter((row.num_gpus, tuple(sorted(row.resources.items())), row.num_cpus) for row in rows)
    texts = [_reservation_text(*key) for key in counts]
    if len(texts) == 1:
        return texts[0]
    parts = [f"{text} ({count})" for text, count in zip(texts, counts.values(), strict=True)]
    extra = len(parts) - RESERVATION_PARTS
    return "\n".join(parts[:RESERVATION_PARTS] + ([f"… {extra} more"] if extra > 0 else []))


def _reservation_text(num_gpus: float, resources: tuple[tuple[str, float], ...], num_cpus: float) -> str:
    parts = [f"GPU {number(num_gpus)}"] if num_gpus else []
    parts += [f"{name} {number(amount)}" for name, amount in resources]
    parts.append(f"CPU {number(num_cpus)}")
    return ", ".join(parts)


def relations_text(
    layout: LayoutPlan, placement: ComponentPlacement, colors: dict[str, str], show_all: bool
) -> Text | None:
    """``actor ↔ rollout: colocated`` for each pair of components (None for a single component).

    Components written in one config key share one strategy, hence the same bundles: they are
    colocated by definition, and marked so.
    """
    names = placement.components
    if len(names) < 2:
        return None
    shown = names if show_all else names[:RELATION_COMPONENTS]
    lines = [Text("Relations", style="bold")]
    for first, second in combinations(shown, 2):
        relation = layout.relation(first, second)
        line = Text.assemble("  ", (first, colors[first]), " ↔ ", (second, colors[second]), f": {relation}")
        if placement.get_strategy(first) is placement.get_strategy(second):
            line.append(" (one config key)", style="dim")
        lines.append(line)
    if omitted := comb(len(names), 2) - comb(len(shown), 2):
        hint = f"  … {omitted} more pairs among {len(names)} components; --all or --json lists every pair"
        lines.append(Text(hint, style="dim"))
    return Text("\n").join(lines)
