"""Config to ready workers for a colocated 8-GPU job, three ways, in one run.

The job: ``actor,rollout: 0-7`` on one simulated 8-GPU node — 16 workers, two per GPU.

* rlinfra: ``ComponentPlacement`` → ``Layout`` (one placement group) → two ``WorkerGroup``s
  launched into it, ranked, with their environment, every worker answering a first call;
* by hand: the same placement group (8 bundles of 1 GPU) and 16 raw actors with ``num_gpus=0.5``;
* probe-then-launch (the slime approach): one throwaway probe actor per bundle to learn its node
  and GPU id, then sort the bundles and launch the 16 real actors.

Runs alternate and the median of ``--repeat`` is kept. Goals (issue 4): rlinfra / by hand <= 1.15,
rlinfra / probe-then-launch ≈ 0.5. The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import ray
from noop_actors import Noop, RawNoop, ready_then_release
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlinfra import Cluster, ComponentPlacement
from rlinfra.runtime.layout import Layout

CFG = {"cluster": {"num_nodes": 1, "simulate": "1x8", "component_placement": {"actor,rollout": "0-7"}}}
BUNDLES = [{"GPU": 1, "CPU": 1}] * 8


@ray.remote(num_gpus=1, num_cpus=0)
class GpuProbe:
    def where(self) -> tuple[str, list]:
        return ray.get_runtime_context().get_node_id(), ray.get_gpu_ids()


def rlinfra_way(cluster: Cluster) -> float:
    start = time.perf_counter()
    placement = ComponentPlacement(CFG, cluster)
    layout = Layout(cluster, placement, ["actor", "rollout"], num_cpus=0.5)
    groups = [
        Noop.create_group().launch(cluster, placement.get_strategy(n), name=n, layout=layout, num_cpus=0.5)
        for n in ("actor", "rollout")
    ]
    for group in groups:
        group.ping().wait()
    elapsed = time.perf_counter() - start
    for group in groups:
        group.shutdown()
    layout.release()
    return elapsed


def _raw_actors(pg, order: list[int]) -> list:
    return [
        RawNoop.options(
            num_cpus=0.5,
            num_gpus=0.5,
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=b),
        ).remote()
        for b in order
        for _ in range(2)
    ]


def by_hand(_: Cluster) -> float:
    start = time.perf_counter()
    pg = placement_group(BUNDLES, strategy="PACK")
    ray.get(pg.ready(), timeout=60)
    actors = _raw_actors(pg, list(range(8)))
    return ready_then_release(start, actors, pg, timeout_s=60)


def probe_then_launch(_: Cluster) -> float:
    start = time.perf_counter()
    pg = placement_group(BUNDLES, strategy="PACK")
    ray.get(pg.ready(), timeout=60)
    probes = [
        GpuProbe.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=b)
        ).remote()
        for b in range(8)
    ]
    found = ray.get([p.where.remote() for p in probes], timeout=60)
    for probe in probes:
        ray.kill(probe)
    order = sorted(range(8), key=lambda b: (found[b][0], [int(i) for i in found[b][1]]))
    actors = _raw_actors(pg, order)
    return ready_then_release(start, actors, pg, timeout_s=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    ways = {"rlinfra": rlinfra_way, "by_hand": by_hand, "probe_then_launch": probe_then_launch}
    times: dict[str, list[float]] = {name: [] for name in ways}
    with Cluster(cluster_cfg={**CFG["cluster"], "simulate_cpus": 16}) as cluster:
        by_hand(cluster)  # warm-up: the first actors pay for importing the worker code
        for _ in range(args.repeat):
            for name, way in ways.items():
                times[name].append(way(cluster))
    medians = {name: round(statistics.median(values), 3) for name, values in times.items()}
    ratio_hand = round(medians["rlinfra"] / medians["by_hand"], 3)
    ratio_probe = round(medians["rlinfra"] / medians["probe_then_launch"], 3)
    for name, value in medians.items():
        print(f"{name:>18}: {value:.2f} s")
    print(f"rlinfra / by hand: {ratio_hand:.2f} (goal <= 1.15)")
    print(f"rlinfra / probe-then-launch: {ratio_probe:.2f} (expected about 0.5)")
    print(
        json.dumps(
            {
                "benchmark": "layout",
                "workers": 16,
                "seconds": medians,
                "ratio_vs_by_hand": ratio_hand,
                "ratio_vs_probe_then_launch": ratio_probe,
                "goal_ratio_vs_by_hand": 1.15,
            }
        )
    )


if __name__ == "__main__":
    main()
