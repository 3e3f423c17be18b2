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

import statistics
import time

import harness
import ray
from noop_actors import Noop, RawNoop, ready_then_release
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlinfra import Cluster, ComponentPlacement
from rlinfra.runtime.layout import Layout

GPUS, SMOKE_GPUS = 8, 2  # --smoke: the same job on a 2-GPU node


def config(gpus: int) -> dict:
    placement = {"actor,rollout": f"0-{gpus - 1}"}
    return {"cluster": {"num_nodes": 1, "simulate": f"1x{gpus}", "component_placement": placement}}


@ray.remote(num_gpus=1, num_cpus=0)
class GpuProbe:
    def where(self) -> tuple[str, list]:
        return ray.get_runtime_context().get_node_id(), ray.get_gpu_ids()


def rlinfra_way(cluster: Cluster, gpus: int) -> float:
    start = time.perf_counter()
    placement = ComponentPlacement(config(gpus), cluster)
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


def by_hand(_: Cluster, gpus: int) -> float:
    start = time.perf_counter()
    pg = placement_group([{"GPU": 1, "CPU": 1}] * gpus, strategy="PACK")
    ray.get(pg.ready(), timeout=60)
    actors = _raw_actors(pg, list(range(gpus)))
    return ready_then_release(start, actors, pg, timeout_s=60)


def probe_then_launch(_: Cluster, gpus: int) -> float:
    start = time.perf_counter()
    pg = placement_group([{"GPU": 1, "CPU": 1}] * gpus, strategy="PACK")
    ray.get(pg.ready(), timeout=60)
    probes = [
        GpuProbe.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=b)
        ).remote()
        for b in range(gpus)
    ]
    found = ray.get([p.where.remote() for p in probes], timeout=60)
    for probe in probes:
        ray.kill(probe)
    order = sorted(range(gpus), key=lambda b: (found[b][0], [int(i) for i in found[b][1]]))
    actors = _raw_actors(pg, order)
    return ready_then_release(start, actors, pg, timeout_s=60)


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    gpus = SMOKE_GPUS if args.smoke else GPUS
    if args.smoke:
        args.repeat = 1
    ways = {"rlinfra": rlinfra_way, "by_hand": by_hand, "probe_then_launch": probe_then_launch}
    times: dict[str, list[float]] = {name: [] for name in ways}
    with Cluster(cluster_cfg={**config(gpus)["cluster"], "simulate_cpus": 2 * gpus}) as cluster:
        if not args.smoke:
            by_hand(cluster, gpus)  # warm-up: the first actors pay for importing the worker code
        for _ in range(args.repeat):
            for name, way in ways.items():
                times[name].append(way(cluster, gpus))
    medians = {name: round(statistics.median(values), 3) for name, values in times.items()}
    ratio_hand = round(medians["rlinfra"] / medians["by_hand"], 3)
    ratio_probe = round(medians["rlinfra"] / medians["probe_then_launch"], 3)
    for name, value in medians.items():
        print(f"{name:>18}: {value:.2f} s")
    print(f"rlinfra / by hand: {ratio_hand:.2f} (goal <= 1.15)")
    print(f"rlinfra / probe-then-launch: {ratio_probe:.2f} (expected about 0.5)")
    figures = {
        "benchmark": "layout",
        "workers": 2 * gpus,
        "seconds": medians,
        "ratio_vs_by_hand": ratio_hand,
        "ratio_vs_probe_then_launch": ratio_probe,
        "goal_ratio_vs_by_hand": 1.15,
    }
    harness.emit(figures, args.smoke)


if __name__ == "__main__":
    main()
