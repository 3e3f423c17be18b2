"""Launch cost: rlinfra ``WorkerGroup.launch`` vs raw Ray actors with the same resources.

Both sides reserve one placement-group bundle per GPU on a simulated 4-node x 8-GPU cluster, start
one actor per bundle with ``num_gpus=1`` and wait until every actor answered a first call. rlinfra
additionally ranks, pins bundles to nodes, sets the per-rank environment and publishes
``MASTER_ADDR``/``MASTER_PORT``. Runs alternate (rlinfra, raw, rlinfra, raw …) so drift affects
both; the median of ``--repeat`` runs is reported. Goal (issue 3): ratio <= 1.15.
The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import statistics
import time

import harness
import ray
from noop_actors import Noop, RawNoop, ready_then_release
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlinfra import Cluster, ComponentPlacement

SIZES = (8, 32)


def launch_rlinfra(cluster: Cluster, plan: ComponentPlacement, name: str) -> float:
    start = time.perf_counter()
    group = Noop.create_group().launch(cluster, plan.get_strategy(name), name=name)
    group.ping().wait()
    elapsed = time.perf_counter() - start
    group.shutdown()
    return elapsed


def launch_raw(size: int) -> float:
    start = time.perf_counter()
    pg = placement_group([{"CPU": 1, "GPU": 1}] * size, strategy="PACK")
    ray.get(pg.ready(), timeout=120)
    actors = [
        RawNoop.options(
            num_cpus=1,
            num_gpus=1,
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i),
        ).remote()
        for i in range(size)
    ]
    return ready_then_release(start, actors, pg, timeout_s=120)


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sizes = SIZES[:1] if args.smoke else SIZES
    if args.smoke:
        args.repeat = 1
    cfg = {
        "cluster": {
            "num_nodes": 4,
            "simulate": "4x8",
            "simulate_cpus": 8,
            "component_placement": {"w8": "0-7", "w32": "0-31"},
        }
    }
    rows = []
    with Cluster(cluster_cfg=cfg["cluster"]) as cluster:
        plan = ComponentPlacement(cfg, cluster)
        if not args.smoke:
            launch_raw(8)  # warm-up: first actor creation pays for importing the worker code
        for size in sizes:
            ours, raw = [], []
            for _ in range(args.repeat):
                ours.append(launch_rlinfra(cluster, plan, f"w{size}"))
                raw.append(launch_raw(size))
            row = {
                "workers": size,
                "rlinfra_s": round(statistics.median(ours), 3),
                "raw_ray_s": round(statistics.median(raw), 3),
            }
            row["ratio"] = round(row["rlinfra_s"] / row["raw_ray_s"], 3)
            rows.append(row)
            print(
                f"{size:>3} workers: rlinfra {row['rlinfra_s']:.2f} s, raw Ray {row['raw_ray_s']:.2f} s, "
                f"ratio {row['ratio']:.2f}"
            )
    figures = {
        "benchmark": "launch",
        "goal_ratio": 1.15,
        "rows": rows,
        "max_ratio": max(r["ratio"] for r in rows),
    }
    harness.emit(figures, args.smoke)


if __name__ == "__main__":
    main()
