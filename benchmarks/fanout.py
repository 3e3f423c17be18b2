"""Fan-out overhead: ``group.noop().wait()`` vs raw ``ray.get([a.noop.remote() ...])``.

Eight workers on one simulated 8-GPU node; both sides call the same actors, interleaved call by
call so drift hits both equally. Reports p50 and p99 latency per call and their ratios.
Goal (issue 3): ratio <= 1.2. The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import statistics
import time

import harness
import numpy as np
import ray

from rlinfra import Cluster, ComponentPlacement, Worker


class Noop(Worker):
    def noop(self) -> None:
        return None


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--calls", type=int, default=500)
    args = parser.parse_args()
    warmup = 0 if args.smoke else 20
    if args.smoke:
        args.calls = 3
    cfg = {"cluster": {"num_nodes": 1, "simulate": "1x8", "component_placement": {"noop": "0-7"}}}
    with Cluster(cluster_cfg=cfg["cluster"]) as cluster:
        plan = ComponentPlacement(cfg, cluster)
        group = Noop.create_group().launch(cluster, plan.get_strategy("noop"), name="noop")
        actors = group.actors
        ours, raw = [], []
        for _ in range(warmup):
            group.noop().wait()
            ray.get([actor.noop.remote() for actor in actors])
        for _ in range(args.calls):
            start = time.perf_counter()
            group.noop().wait()
            ours.append(time.perf_counter() - start)
            start = time.perf_counter()
            ray.get([actor.noop.remote() for actor in actors])
            raw.append(time.perf_counter() - start)
        group.shutdown()
    figures = {
        "rlinfra_p50_ms": statistics.median(ours) * 1e3,
        "raw_p50_ms": statistics.median(raw) * 1e3,
        "rlinfra_p99_ms": float(np.percentile(ours, 99)) * 1e3,
        "raw_p99_ms": float(np.percentile(raw, 99)) * 1e3,
    }
    figures = {key: round(value, 3) for key, value in figures.items()}
    figures["ratio_p50"] = round(figures["rlinfra_p50_ms"] / figures["raw_p50_ms"], 3)
    figures["ratio_p99"] = round(figures["rlinfra_p99_ms"] / figures["raw_p99_ms"], 3)
    print(
        f"p50: rlinfra {figures['rlinfra_p50_ms']:.3f} ms, raw {figures['raw_p50_ms']:.3f} ms, "
        f"ratio {figures['ratio_p50']:.2f}"
    )
    print(
        f"p99: rlinfra {figures['rlinfra_p99_ms']:.3f} ms, raw {figures['raw_p99_ms']:.3f} ms, "
        f"ratio {figures['ratio_p99']:.2f}"
    )
    harness.emit(
        {"benchmark": "fanout", "workers": 8, "calls": args.calls, "goal_ratio": 1.2, **figures}, args.smoke
    )


if __name__ == "__main__":
    main()
