"""How placement resolution scales with the cluster.

Resolves ``actor,rollout: all`` (one process per accelerator, two components sharing a strategy)
plus ``env`` on the reserved ``node`` group (one process per node) on N nodes x 8 accelerators,
for N in 10, 100, 1,000, 4,000. Figures, best of ``--repeat`` runs each:

* ``ms``: config -> ``ComponentPlacement`` with every ``Placement`` record built;
* ``vs_floor``: that time divided by the time to build the same number of bare tuples shaped
  like a ``Placement`` (14 fields, three of them lists, as RLinf's types are) — the floor any
  Python engine pays for its output, measured in the same run;
* ``growth``: time(N) / time(previous N) divided by the node ratio — 1.0 is exactly linear;
* ``memory_vs_plain``: the same placement with every accelerator's memory predicted (the actor
  and rollout declare a Qwen2.5-7B trainer), against the plain one. Goal: at most 2.0.

Goal (issue 23): 1,000 x 8 under 15 ms, growth ≈ 1 (RLinf 0.3.0 takes about 20 s at 1,000 x 8).
The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import harness

from rlinfra.placement import ClusterSpec, ComponentPlacement

NODE_COUNTS = (10, 100, 1000, 4000)
ACCELERATORS = 8


MODEL = str(Path(__file__).parents[1] / "examples" / "memory" / "qwen2.5-7b.json")


def resolve_once(num_nodes: int, memory: bool = False) -> tuple[float, int]:
    shared: Any = "all"
    if memory:  # each process's memory predicted too: the same placement, planned with memory
        shared = {"placement": "all", "model": MODEL, "memory": {"role": "trainer", "sharding": "fsdp"}}
    cfg = {
        "cluster": {
            "num_nodes": num_nodes,
            "accelerator": "H100",
            "component_placement": {
                "actor,rollout": shared,
                "env": {"node_group": "node", "placement": "all"},
            },
        }
    }
    start = time.perf_counter()
    spec = ClusterSpec.from_config(cfg["cluster"], ACCELERATORS)
    placement = ComponentPlacement(cfg, spec)
    elapsed = time.perf_counter() - start
    records = sum(len(placement.get_placements(name)) for name in ("actor", "env"))
    return elapsed, records


def floor_once(records: int) -> float:
    """Time to allocate ``records`` bare tuples shaped like a Placement."""
    start = time.perf_counter()
    rows = [
        (i, records, i, 0, i, 8, "GPU", i % 8, [str(i % 8)], True, "GPU", [i], [i % 8], "cluster")
        for i in range(records)
    ]
    elapsed = time.perf_counter() - start
    assert len(rows) == records
    return elapsed


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--repeat", type=int, default=5, help="runs per size; the best is kept")
    args = parser.parse_args()
    node_counts = NODE_COUNTS[:2] if args.smoke else NODE_COUNTS  # two sizes: a growth to report
    if args.smoke:
        args.repeat = 1

    results = []
    previous: dict | None = None
    print(
        f"{'nodes':>6} {'processes':>10} {'ms':>9} {'floor ms':>9} {'vs_floor':>9} {'growth':>7} "
        f"{'memory ms':>10} {'x':>5}"
    )
    for num_nodes in node_counts:
        best, records = min(resolve_once(num_nodes) for _ in range(args.repeat))
        floor = min(floor_once(records) for _ in range(args.repeat))
        with_memory = min(resolve_once(num_nodes, memory=True)[0] for _ in range(args.repeat))
        row = {
            "nodes": num_nodes,
            "processes": records,
            "ms": round(best * 1000, 2),
            "floor_ms": round(floor * 1000, 2),
            "vs_floor": round(best / floor, 2),
            "growth": None,
            "memory_ms": round(with_memory * 1000, 2),
            "memory_vs_plain": round(with_memory / best, 2),
        }
        if previous is not None:
            row["growth"] = round((best / previous["seconds"]) / (num_nodes / previous["nodes"]), 2)
        growth = "" if row["growth"] is None else f"{row['growth']:.2f}"
        print(
            f"{num_nodes:>6} {records:>10} {row['ms']:>9.2f} {row['floor_ms']:>9.2f} "
            f"{row['vs_floor']:>9.2f} {growth:>7} {row['memory_ms']:>10.2f} {row['memory_vs_plain']:>5.2f}"
        )
        previous = {"seconds": best, "nodes": num_nodes}
        results.append(row)
    at_1000 = next((r["ms"] for r in results if r["nodes"] == 1000), None)
    summary = {
        "benchmark": "placement_scale",
        "accelerators_per_node": ACCELERATORS,
        "rows": results,
        "ms_at_1000x8": at_1000,
        "goal_ms_at_1000x8": 15,
        "max_growth": max(r["growth"] for r in results if r["growth"] is not None),
        "memory_vs_plain_at_1000x8": next(
            (r["memory_vs_plain"] for r in results if r["nodes"] == 1000), None
        ),
        "goal_memory_vs_plain": 2.0,
    }
    harness.emit(summary, args.smoke)


if __name__ == "__main__":
    main()
